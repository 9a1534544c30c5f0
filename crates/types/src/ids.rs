//! Identifiers, in the formats Fly clients expect: machine ids are 14 hex characters,
//! instance ids (one per config version) are 26-character ULIDs.

use rand::Rng;

/// Returns a new machine id: 14 lowercase hex characters, like Fly's `1857156b526dd8`.
pub fn new_machine_id() -> String {
    let bytes: [u8; 7] = rand::rng().random();
    hex::encode(bytes)
}

/// Returns a new instance id (a ULID), naming one version of a machine's config.
pub fn new_instance_id() -> String {
    ulid::Ulid::new().to_string()
}

/// Whether `id` could be an instance id (a config version): a ULID, 26 characters.
pub fn is_valid_instance_id(id: &str) -> bool {
    id.len() == 26 && ulid::Ulid::from_string(id).is_ok()
}

/// Returns a new host id: `h` followed by 12 hex characters.
pub fn new_host_id() -> String {
    let bytes: [u8; 6] = rand::rng().random();
    format!("h{}", hex::encode(bytes))
}

/// Returns a new app id: `app_` followed by 16 hex characters, never reused (an app made
/// again under a deleted app's name gets a new one).
pub fn new_app_id() -> String {
    let bytes: [u8; 8] = rand::rng().random();
    format!("app_{}", hex::encode(bytes))
}

/// Returns a new reservation id.
pub fn new_reservation_id() -> String {
    format!("res_{}", ulid::Ulid::new())
}

/// Returns a random secret of `n` bytes, hex encoded (tokens, cluster secrets, lease nonces).
pub fn new_secret(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rng().fill(&mut bytes[..]);
    hex::encode(bytes)
}

/// Checks a machine id's shape (so it can be used in paths safely).
pub fn is_valid_machine_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Checks an app or machine name: 1-63 characters of lowercase letters, digits and `-`,
/// not starting or ending with `-` (DNS label rules, so `<app>.<domain>` routes work and no
/// name can smuggle a path or a control character).
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!(
            "{kind} name must be 1-63 characters, got {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "{kind} name {name:?} contains {bad:?}: only lowercase letters, digits and '-' are allowed"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "{kind} name {name:?} must not start or end with '-'"
        ));
    }
    Ok(())
}

/// Returns a generated machine name `adjective-noun-NNNN`, as Fly does.
pub fn new_machine_name() -> String {
    const ADJ: &[&str] = &[
        "autumn", "bold", "brave", "calm", "cool", "crisp", "damp", "eager", "fancy", "gentle",
        "holy", "icy", "jolly", "late", "lively", "misty", "noisy", "proud", "quiet", "rough",
        "shy", "silent", "small", "snowy", "still", "sweet", "twilight", "wild", "young",
    ];
    const NOUN: &[&str] = &[
        "bird", "breeze", "brook", "cloud", "dawn", "dew", "dream", "field", "fire", "flower",
        "forest", "frog", "glade", "hill", "lake", "leaf", "meadow", "moon", "night", "pine",
        "rain", "river", "sea", "shadow", "sky", "smoke", "star", "sun", "tree", "wave",
    ];
    let mut rng = rand::rng();
    format!(
        "{}-{}-{:04}",
        ADJ[rng.random_range(0..ADJ.len())],
        NOUN[rng.random_range(0..NOUN.len())],
        rng.random_range(0..10_000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ids_have_fly_shape() {
        let id = new_machine_id();
        assert_eq!(id.len(), 14);
        assert!(is_valid_machine_id(&id));
        assert_eq!(new_instance_id().len(), 26);
    }

    #[test]
    fn names_reject_path_tricks_and_control_characters() {
        assert!(validate_name("app", "my-app-1").is_ok());
        for bad in [
            "", "../etc", "a/b", "UPPER", "a\nb", "-lead", "trail-", "a b", "dots.in",
        ] {
            assert!(validate_name("app", bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_name("app", &"a".repeat(64)).is_err());
        assert!(!is_valid_machine_id("../x"));
    }
}
