//! Image layer unpacking (`bazaar_image::unpack::unpack_layer`) of hostile layers: tar
//! streams built from entries whose paths climb (`..`, absolute), go through symlinks (to
//! the layer, to a directory outside it), hard link out of the layer, are devices, fifos or
//! whiteouts; and raw bytes (tar, gzip, zstd). Properties, checked on the extracted tree
//! after every layer, accepted or not: nothing outside the target directory was created or
//! changed; the tree holds no device but whiteouts (0/0 char devices) and no fifo; no file
//! in it is a hard link to a file outside; nothing panics.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bazaar_image::unpack::{unpack_layer, Whiteouts};
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, Arbitrary)]
enum Segment {
    A,
    B,
    Dot,
    DotDot,
    Empty,
    Whiteout,
    Opaque,
    /// The absolute path of the directory outside the layer.
    Outside,
}

#[derive(Debug, Arbitrary)]
struct TarPath {
    absolute: bool,
    segments: Vec<Segment>,
}

#[derive(Debug, Arbitrary)]
enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(TarPath),
    Hardlink(TarPath),
    Char,
    Block,
    Fifo,
    /// An entry type the unpacker does not know.
    Other(u8),
}

#[derive(Debug, Arbitrary)]
struct Entry {
    path: TarPath,
    kind: Kind,
    mode: u16,
    uid: u8,
    /// A PAX header with this `user.` xattr before the entry.
    xattr: Option<(u8, Vec<u8>)>,
}

#[derive(Debug, Arbitrary)]
enum Layer {
    Entries {
        entries: Vec<Entry>,
        gzip: bool,
        markers: bool,
    },
    Raw(Vec<u8>),
}

/// Where each run happens: `dest` (the layer's directory) and `outside` (holding a
/// sentinel file) side by side, with the blob.
struct Ground {
    root: PathBuf,
}

impl Ground {
    fn dest(&self) -> PathBuf {
        self.root.join("dest")
    }
    fn outside(&self) -> PathBuf {
        self.root.join("outside")
    }
    fn blob(&self) -> PathBuf {
        self.root.join("blob")
    }
}

fn ground() -> Ground {
    let base = Path::new("/dev/shm").join(format!("bazaar-fuzz-layer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("dest")).expect("dest");
    std::fs::create_dir_all(base.join("outside/dir")).expect("outside");
    std::fs::write(base.join("outside/sentinel"), b"sentinel").expect("sentinel");
    Ground { root: base }
}

fn render(path: &TarPath, ground: &Ground) -> Vec<u8> {
    let mut out = String::new();
    if path.absolute {
        out.push('/');
    }
    let outside = ground.outside().join("dir");
    let outside = outside.to_str().expect("utf-8").trim_start_matches('/');
    for (i, s) in path.segments.iter().take(8).enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(match s {
            Segment::A => "a",
            Segment::B => "b",
            Segment::Dot => ".",
            Segment::DotDot => "..",
            Segment::Empty => "",
            Segment::Whiteout => ".wh.a",
            Segment::Opaque => ".wh..wh..opq",
            Segment::Outside => outside,
        });
    }
    out.into_bytes()
}

/// A ustar header with `name` and `link` written as given (no checks, as a hostile
/// layer would).
fn header(name: &[u8], link: &[u8], kind: u8, size: u64, mode: u16, uid: u8) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    {
        let raw = h.as_old_mut();
        let n = name.len().min(100);
        raw.name[..n].copy_from_slice(&name[..n]);
        let l = link.len().min(100);
        raw.linkname[..l].copy_from_slice(&link[..l]);
    }
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_size(size);
    h.set_mode(mode as u32);
    h.set_uid(uid as u64);
    h.set_gid(uid as u64);
    h.set_mtime(1);
    h.set_cksum();
    h
}

fn build(entries: &[Entry], ground: &Ground) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries.iter().take(16) {
        let name = render(&e.path, ground);
        if let Some((n, value)) = &e.xattr {
            let key = format!("SCHILY.xattr.user.x{n}");
            b.append_pax_extensions([(key.as_str(), value.as_slice())])
                .expect("pax");
        }
        let (kind, link, data): (u8, Vec<u8>, &[u8]) = match &e.kind {
            Kind::File(data) => (b'0', vec![], data),
            Kind::Dir => (b'5', vec![], &[]),
            Kind::Symlink(t) => (b'2', render(t, ground), &[]),
            Kind::Hardlink(t) => (b'1', render(t, ground), &[]),
            Kind::Char => (b'3', vec![], &[]),
            Kind::Block => (b'4', vec![], &[]),
            Kind::Fifo => (b'6', vec![], &[]),
            Kind::Other(k) => (*k, vec![], &[]),
        };
        let h = header(&name, &link, kind, data.len() as u64, e.mode, e.uid);
        b.append(&h, data).expect("append");
    }
    b.into_inner().expect("tar")
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        // The seeds: layers as they are stored (tar, tar+gzip).
        Some((b'T', blob)) => run(Layer::Raw(blob.to_vec())),
        _ => {
            if let Ok(layer) = Layer::arbitrary_take_rest(Unstructured::new(data)) {
                run(layer);
            }
        }
    }
});

fn run(layer: Layer) {
    let ground = ground();
    let (blob, whiteouts) = match &layer {
        Layer::Entries {
            entries,
            gzip,
            markers,
        } => {
            let tar = build(entries, &ground);
            let blob = if *gzip {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&tar).expect("gzip");
                gz.finish().expect("gzip")
            } else {
                tar
            };
            let w = if *markers {
                Whiteouts::Markers
            } else {
                Whiteouts::Overlay
            };
            (blob, w)
        }
        Layer::Raw(bytes) => (bytes.clone(), Whiteouts::Overlay),
    };
    std::fs::write(ground.blob(), &blob).expect("blob");
    let _ = unpack_layer(&ground.blob(), "fuzz", None, &ground.dest(), whiteouts);
    check(&ground);
    let _ = std::fs::remove_dir_all(&ground.root);
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

fn check(ground: &Ground) {
    assert_eq!(
        names(&ground.root),
        ["blob", "dest", "outside"],
        "beside the layer"
    );
    assert_eq!(
        names(&ground.outside()),
        ["dir", "sentinel"],
        "outside the layer"
    );
    assert!(
        names(&ground.outside().join("dir")).is_empty(),
        "outside the layer"
    );
    let sentinel = ground.outside().join("sentinel");
    assert_eq!(std::fs::read(&sentinel).expect("sentinel"), b"sentinel");
    let meta = std::fs::symlink_metadata(&sentinel).expect("sentinel");
    assert_eq!(meta.nlink(), 1, "the sentinel was hard linked");
    let dest = std::fs::symlink_metadata(ground.dest()).expect("dest");
    assert!(dest.is_dir(), "the layer's directory was replaced");
    walk(&ground.dest());
}

fn walk(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        let m = std::fs::symlink_metadata(&path).expect("metadata");
        let t = m.file_type();
        assert!(
            !t.is_fifo() && !t.is_block_device() && !t.is_socket(),
            "{path:?}"
        );
        if t.is_char_device() {
            assert_eq!(m.rdev(), 0, "a device that is not a whiteout: {path:?}");
        }
        if t.is_dir() {
            walk(&path);
        }
    }
}
