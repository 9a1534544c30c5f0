//! This host's WireGuard key pair: the private key in a file of the data dir (mode 0600,
//! made once, never sent anywhere), the public key derived from it for the host row.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The private key kept at `path` (hex), made from the kernel's random source the first
/// time.
pub fn load_or_create(path: &Path) -> std::io::Result<[u8; 32]> {
    match std::fs::read_to_string(path) {
        Ok(text) => hex::decode(text.trim())
            .ok()
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or_else(|| std::io::Error::other(format!("{}: not a key", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            f.write_all(hex::encode(key).as_bytes())?;
            f.sync_all()?;
            Ok(key)
        }
        Err(e) => Err(e),
    }
}

/// The public key of `private` (what peers are configured with).
pub fn public_key(private: &[u8; 32]) -> [u8; 32] {
    let secret = boringtun::x25519::StaticSecret::from(*private);
    boringtun::x25519::PublicKey::from(&secret).to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_made_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh/key");
        let key = load_or_create(&path).unwrap();
        assert_eq!(load_or_create(&path).unwrap(), key);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_ne!(public_key(&key), key);
        std::fs::write(&path, "nonsense").unwrap();
        assert!(load_or_create(&path).is_err());
    }
}
