//! Safe layer extraction. Entries are written only below the destination: `..` components,
//! writes through symlinks, hard links out of the layer, and device nodes or fifos are
//! refused; symlinks are created but never followed. Whiteouts become overlayfs whiteouts
//! (0/0 char devices, `trusted.overlay.opaque=y`) or stay as `.wh.` marker files. Owners,
//! modes (setuid included), mtimes of files, and `user.*` / capability xattrs are kept.

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use rustix::fs::{FileType, Mode, XattrFlags, CWD};
use sha2::{Digest as _, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{lchown, symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};
use tar::EntryType;

/// Prefix of whiteout files in layers.
pub(crate) const WHITEOUT: &str = ".wh.";
/// The whiteout that makes its directory opaque.
pub(crate) const OPAQUE: &str = ".wh..wh..opq";
/// The overlayfs xattr marking an opaque directory.
pub(crate) const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// How whiteouts are stored in an unpacked layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Whiteouts {
    /// As overlayfs reads them: a 0/0 char device, and an xattr on opaque dirs (needs root).
    Overlay,
    /// As in the tar: empty `.wh.<name>` and `.wh..wh..opq` files (for copied rootfs).
    Markers,
}

/// Computes the sha256 of everything read through it (the layer's diff id).
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Opens a layer blob, decompressing gzip or zstd as its first bytes say.
fn decompressed(blob: &Path) -> Result<Box<dyn Read>> {
    let mut reader = BufReader::with_capacity(1 << 16, File::open(blob).at(blob)?);
    let head = reader.fill_buf().at(blob)?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(reader))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let zstd = ruzstd::decoding::StreamingDecoder::new(reader).map_err(|e| Error::Io {
            path: blob.into(),
            source: io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        })?;
        Box::new(zstd)
    } else {
        Box::new(reader)
    })
}

/// Normalises an entry path: drops `/` and `.`, refuses `..`. `None` is the layer root.
fn normalize(path: &Path) -> std::result::Result<Option<PathBuf>, &'static str> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err("path has a `..` component"),
            Component::Prefix(_) => return Err("path has a prefix"),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Removes whatever is at `path` without following it.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// One layer being extracted into `dest`.
struct Unpacker<'a> {
    dest: &'a Path,
    layer: &'a str,
    whiteouts: Whiteouts,
    chown: bool,
}

impl Unpacker<'_> {
    fn reject(&self, entry: &Path, reason: impl Into<String>) -> Error {
        Error::UnsafeLayer {
            layer: self.layer.to_string(),
            entry: entry.display().to_string(),
            reason: reason.into(),
        }
    }

    /// Makes every component of `rel` a real directory below `dest`, creating missing ones;
    /// a symlink or a non-directory on the way is refused, so nothing is written through one.
    fn ensure_dirs(&self, entry: &Path, rel: &Path) -> Result<PathBuf> {
        let mut at = self.dest.to_path_buf();
        for c in rel.components() {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.reject(
                        entry,
                        format!(
                            "would be written through the symlink {}",
                            at.strip_prefix(self.dest).unwrap_or(&at).display()
                        ),
                    ))
                }
                Ok(_) => {
                    return Err(self.reject(
                        entry,
                        format!(
                            "parent {} is not a directory",
                            at.strip_prefix(self.dest).unwrap_or(&at).display()
                        ),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&at).at(&at)?;
                }
                Err(e) => return Err(e).at(&at),
            }
        }
        Ok(at)
    }

    fn owner(&self, path: &Path, header: &tar::Header) -> Result<()> {
        if self.chown {
            let uid = header.uid().ok().and_then(|u| u32::try_from(u).ok());
            let gid = header.gid().ok().and_then(|g| u32::try_from(g).ok());
            lchown(path, uid, gid).at(path)?;
        }
        Ok(())
    }

    fn entry(&self, mut entry: tar::Entry<'_, impl Read>) -> Result<()> {
        let raw = entry
            .path()
            .map_err(|e| self.reject(Path::new("?"), format!("unreadable path: {e}")))?
            .into_owned();
        let rel = normalize(&raw).map_err(|why| self.reject(&raw, why))?;
        let xattrs = self.xattrs(&mut entry);
        let header = entry.header().clone();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let Some(rel) = rel else {
            // The layer root itself: only its permissions matter.
            if kind == EntryType::Directory {
                self.owner(self.dest, &header)?;
                fs::set_permissions(self.dest, fs::Permissions::from_mode(mode)).at(self.dest)?;
            }
            return Ok(());
        };
        let name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .map(String::from)
            .unwrap_or_default();
        let parent = self.ensure_dirs(&raw, rel.parent().unwrap_or(Path::new("")))?;
        let path = parent.join(rel.file_name().expect("normalized paths end in a name"));

        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            return self.whiteout(&raw, &parent, &path, hidden);
        }
        match kind {
            EntryType::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&path).at(&path)?;
                        fs::create_dir(&path).at(&path)?;
                    }
                    Err(_) => fs::create_dir(&path).at(&path)?,
                }
                self.owner(&path, &header)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode)).at(&path)?;
                set_xattrs(&path, &xattrs)?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                remove_any(&path).at(&path)?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .open(&path)
                    .at(&path)?;
                io::copy(&mut entry, &mut file)
                    .map_err(|e| self.reject(&raw, format!("reading the layer failed: {e}")))?;
                // chown before chmod: chown clears setuid/setgid bits.
                self.owner(&path, &header)?;
                file.set_permissions(fs::Permissions::from_mode(mode))
                    .at(&path)?;
                if let Ok(mtime) = header.mtime() {
                    let _ = file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
                }
                // After chown, which drops file capabilities.
                set_xattrs(&path, &xattrs)?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| self.reject(&raw, "symlink without a target"))?;
                remove_any(&path).at(&path)?;
                symlink(&*target, &path).at(&path)?;
                self.owner(&path, &header)?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| self.reject(&raw, "hard link without a target"))?;
                let inside = normalize(&target)
                    .ok()
                    .flatten()
                    .and_then(|t| self.existing_file(&t));
                let Some(source) = inside else {
                    return Err(self.reject(
                        &raw,
                        format!(
                            "hard link to {} which is not a file of this layer",
                            target.display()
                        ),
                    ));
                };
                remove_any(&path).at(&path)?;
                fs::hard_link(&source, &path).at(&path)?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                return Err(self.reject(
                    &raw,
                    "device nodes and fifos are not allowed in image layers",
                ));
            }
            // PAX/GNU headers are applied by the tar reader; anything else carries no file.
            _ => {}
        }
        Ok(())
    }

    /// The entry's PAX `SCHILY.xattr.*` records that images may carry: `user.*`, and
    /// `security.capability` (file capabilities) when running as root. Others, such as
    /// `trusted.overlay.*`, which would change what overlayfs shows, are dropped.
    fn xattrs(&self, entry: &mut tar::Entry<'_, impl Read>) -> Vec<(String, Vec<u8>)> {
        let Ok(Some(pax)) = entry.pax_extensions() else {
            return vec![];
        };
        pax.flatten()
            .filter_map(|ext| {
                let name = ext.key().ok()?.strip_prefix("SCHILY.xattr.")?;
                let allowed =
                    name.starts_with("user.") || (self.chown && name == "security.capability");
                allowed.then(|| (name.to_string(), ext.value_bytes().to_vec()))
            })
            .collect()
    }

    /// `rel` as an existing non-directory of this layer, reached through real directories only.
    fn existing_file(&self, rel: &Path) -> Option<PathBuf> {
        let mut at = self.dest.to_path_buf();
        let count = rel.components().count();
        for (i, c) in rel.components().enumerate() {
            at.push(c);
            let m = fs::symlink_metadata(&at).ok()?;
            let last = i + 1 == count;
            if (last && m.is_dir()) || (!last && !m.is_dir()) {
                return None;
            }
        }
        Some(at)
    }

    fn whiteout(&self, raw: &Path, parent: &Path, path: &Path, hidden: &str) -> Result<()> {
        if self.whiteouts == Whiteouts::Markers {
            remove_any(path).at(path)?;
            File::create(path).at(path)?;
            return Ok(());
        }
        if format!("{WHITEOUT}{hidden}") == OPAQUE {
            return rustix::fs::lsetxattr(parent, OPAQUE_XATTR, b"y", XattrFlags::empty())
                .at(parent);
        }
        if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
            return Err(self.reject(raw, "malformed whiteout"));
        }
        let target = parent.join(hidden);
        remove_any(&target).at(&target)?;
        rustix::fs::mknodat(
            CWD,
            &target,
            FileType::CharacterDevice,
            Mode::empty(),
            rustix::fs::makedev(0, 0),
        )
        .at(&target)
    }
}

fn set_xattrs(path: &Path, xattrs: &[(String, Vec<u8>)]) -> Result<()> {
    for (name, value) in xattrs {
        rustix::fs::lsetxattr(path, name.as_str(), value, XattrFlags::empty()).at(path)?;
    }
    Ok(())
}

/// Extracts the layer `blob` (tar, tar+gzip or tar+zstd; `layer` names it in errors) into
/// the empty directory `dest`.
/// With `diff_id`, the uncompressed stream must hash to it. Flushes `dest`'s file system
/// before returning so the caller's rename publishes a complete layer.
pub fn unpack_layer(
    blob: &Path,
    layer: &str,
    diff_id: Option<&Digest>,
    dest: &Path,
    whiteouts: Whiteouts,
) -> Result<()> {
    let mut reader = Hashing {
        inner: decompressed(blob)?,
        hasher: Sha256::new(),
    };
    let unpacker = Unpacker {
        dest,
        layer,
        whiteouts,
        chown: rustix::process::geteuid().is_root(),
    };
    let corrupt = |e: io::Error| Error::UnsafeLayer {
        layer: layer.to_string(),
        entry: String::new(),
        reason: format!("not a readable tar stream: {e}"),
    };
    {
        let mut archive = tar::Archive::new(&mut reader);
        for entry in archive.entries().map_err(corrupt)? {
            unpacker.entry(entry.map_err(corrupt)?)?;
        }
    }
    io::copy(&mut reader, &mut io::sink()).map_err(corrupt)?;
    let actual = Digest::from_hasher(reader.hasher);
    if let Some(expected) = diff_id {
        if &actual != expected {
            return Err(Error::DigestMismatch {
                what: "uncompressed layer (diff id)",
                expected: expected.clone(),
                actual,
            });
        }
    }
    let dir = File::open(dest).at(dest)?;
    rustix::fs::syncfs(&dir).at(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_paths() {
        let n = |s: &str| normalize(Path::new(s));
        assert_eq!(n("./a/b").unwrap(), Some(PathBuf::from("a/b")));
        assert_eq!(n("/a/./b/").unwrap(), Some(PathBuf::from("a/b")));
        assert_eq!(n("./").unwrap(), None);
        assert!(n("a/../b").is_err());
        assert!(n("../x").is_err());
    }
}
