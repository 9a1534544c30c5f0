//! Images for tests: Debian's `docker-registry` on loopback, and small OCI images built in
//! Rust (layers from tar entries, e.g. Debian's `busybox-static`) and pushed to it.

use bazaar_image::manifest::{Descriptor, Manifest, OCI_CONFIG, OCI_LAYER_GZIP, OCI_MANIFEST};
use bazaar_image::{Digest, Registry};
use flate2::write::GzEncoder;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Installs `docker-registry` and `busybox-static` if missing (as root, via apt-get).
pub fn ensure_packages() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let static_busybox = Command::new("dpkg")
            .args(["-s", "busybox-static"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if Path::new("/usr/bin/docker-registry").exists() && static_busybox {
            return;
        }
        let ok = Command::new("apt-get")
            .args(["install", "-y", "-qq", "docker-registry", "busybox-static"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get");
        assert!(
            ok.success(),
            "apt-get install docker-registry busybox-static failed"
        );
    });
}

/// A `docker-registry serve` on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct TestRegistry {
    pub host: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl TestRegistry {
    /// Starts a registry; with `basic`, it requires those credentials (htpasswd, bcrypt).
    pub fn start(basic: Option<(&str, &str)>) -> TestRegistry {
        ensure_packages();
        let dir = tempfile::tempdir().unwrap();
        let port = crate::free_port(std::net::Ipv4Addr::LOCALHOST);
        let mut auth = String::new();
        if let Some((user, pass)) = basic {
            let hash = bcrypt::hash(pass, 5).unwrap();
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{user}:{hash}\n")).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: bazaar-test\n    path: {}\n",
                htpasswd.display()
            );
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n{auth}",
            dir.path().join("data").display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry");
        let reg = TestRegistry {
            host: format!("127.0.0.1:{port}"),
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "registry did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        reg
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tar entry of a test layer. Paths are written raw, so hostile ones are possible.
#[derive(Debug)]
pub enum Entry {
    Dir(&'static str),
    File(String, Vec<u8>, u32),
    /// A file with this owner (uid = gid) and mode.
    FileAs(&'static str, u64, u32),
    Symlink(&'static str, String),
    Hardlink(&'static str, &'static str),
    CharDev(&'static str),
}

pub fn file(path: &str, data: &[u8]) -> Entry {
    Entry::File(path.to_string(), data.to_vec(), 0o644)
}

/// A layer: its gzip blob and diff id.
#[derive(Debug)]
pub struct Layer {
    pub blob: Vec<u8>,
    pub tar: Vec<u8>,
    pub diff_id: Digest,
}

impl Layer {
    pub fn digest(&self) -> Digest {
        Digest::of(&self.blob)
    }
}

fn header(path: &str, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    let name = &mut h.as_old_mut().name;
    assert!(path.len() < name.len());
    name[..path.len()].copy_from_slice(path.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

pub fn layer(entries: Vec<Entry>) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (mut h, data) = match e {
            Entry::Dir(p) => (header(p, tar::EntryType::Directory, 0o755, 0), vec![]),
            Entry::File(p, d, mode) => {
                (header(&p, tar::EntryType::Regular, mode, d.len() as u64), d)
            }
            Entry::Symlink(p, target) => {
                let mut h = header(p, tar::EntryType::Symlink, 0o777, 0);
                h.set_link_name(&target).unwrap();
                (h, vec![])
            }
            Entry::Hardlink(p, target) => {
                let mut h = header(p, tar::EntryType::Link, 0o644, 0);
                let name = &mut h.as_old_mut().linkname;
                name[..target.len()].copy_from_slice(target.as_bytes());
                (h, vec![])
            }
            Entry::FileAs(p, id, mode) => {
                let mut h = header(p, tar::EntryType::Regular, mode, 1);
                h.set_uid(id);
                h.set_gid(id);
                (h, b"x".to_vec())
            }
            Entry::CharDev(p) => (header(p, tar::EntryType::Char, 0o644, 0), vec![]),
        };
        h.set_cksum();
        b.append(&h, &data[..]).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    Layer {
        blob: gz.finish().unwrap(),
        diff_id: Digest::of(&tar),
        tar,
    }
}

/// The image config for `layers` on `arch`: `sh -c 'echo $GREETING'` in /tmp.
pub fn config(layers: &[&Layer], arch: &str) -> Vec<u8> {
    config_with(
        layers,
        arch,
        serde_json::json!({
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ["echo $GREETING"],
            "Env": ["PATH=/bin", "GREETING=hello"],
            "WorkingDir": "/tmp",
        }),
    )
}

/// The image config for `layers` on `arch` with this `config` section (Entrypoint, Cmd,
/// Env, WorkingDir, User).
pub fn config_with(layers: &[&Layer], arch: &str, config: serde_json::Value) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| l.diff_id.to_string()).collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

pub fn descriptor(media_type: &str, bytes: &[u8]) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: Digest::of(bytes),
        size: bytes.len() as u64,
        platform: None,
        annotations: BTreeMap::new(),
        urls: vec![],
    }
}

/// The OCI manifest JSON of `config` and `layers`.
pub fn manifest(config: &[u8], layers: &[&Layer]) -> Vec<u8> {
    serde_json::to_vec(&Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        config: descriptor(OCI_CONFIG, config),
        layers: layers
            .iter()
            .map(|l| descriptor(OCI_LAYER_GZIP, &l.blob))
            .collect(),
    })
    .unwrap()
}

/// Pushes layers, config and manifest as `repo:tag`; returns the manifest digest.
pub async fn push(
    registry: &Registry,
    repo: &str,
    tag: &str,
    layers: &[&Layer],
    arch: &str,
) -> Digest {
    push_with_config(registry, repo, tag, layers, &config(layers, arch)).await
}

/// Pushes layers, the given config blob and a manifest as `repo:tag`; returns the
/// manifest digest.
pub async fn push_with_config(
    registry: &Registry,
    repo: &str,
    tag: &str,
    layers: &[&Layer],
    config: &[u8],
) -> Digest {
    for l in layers {
        registry.push_blob(repo, &l.blob).await.unwrap();
    }
    let config = config.to_vec();
    registry.push_blob(repo, &config).await.unwrap();
    let manifest = manifest(&config, layers);
    registry
        .push_manifest(repo, tag, OCI_MANIFEST, &manifest)
        .await
        .unwrap()
}

/// A root filesystem layer from Debian's `busybox-static`: `/bin/busybox` with a symlink per
/// applet, `/etc/passwd` and `/etc/group` with root and `app` (1000), `/www/index.html`,
/// `/tmp`, and one file `extra` (different content makes a different layer).
pub fn busybox_rootfs_layer(applets: &[&str], extra: (&str, &[u8])) -> Layer {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static");
    let mut entries = vec![
        Entry::Dir("bin/"),
        Entry::File("bin/busybox".into(), busybox, 0o755),
        Entry::Dir("etc/"),
        file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/www:/bin/sh\n",
        ),
        file("etc/group", b"root:x:0:\napp:x:1000:\n"),
        Entry::Dir("www/"),
        file("www/index.html", b"hello from the image\n"),
        Entry::Dir("tmp/"),
        file(extra.0, extra.1),
    ];
    for applet in applets {
        entries.push(Entry::Symlink(
            Box::leak(format!("bin/{applet}").into_boxed_str()),
            "busybox".into(),
        ));
    }
    layer(entries)
}

/// A `docker save` archive of one image named `reference`, made of `layers` and `config`.
pub fn docker_save(reference: &str, layers: &[&Layer], config: &[u8]) -> Vec<u8> {
    let config_name = format!("{}.json", Digest::of(config).hex());
    let layer_names: Vec<String> = (0..layers.len())
        .map(|i| format!("l{i}/layer.tar"))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": config_name, "RepoTags": [reference], "Layers": layer_names}
    ]))
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    add("manifest.json", &manifest);
    add(&config_name, config);
    for (name, l) in layer_names.iter().zip(layers) {
        add(name, &l.tar);
    }
    b.into_inner().unwrap()
}
