//! Image machines (`config.image`): the OCI runtime path of the driver. For each run it
//! makes sure the image is in the store (pulling it, with progress in the machine's
//! events), gives the machine a fresh root filesystem from it (overlayfs), writes
//! `config.files`, `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` (the internal
//! DNS on the gateway: the agent's) into it, attaches the machine's network
//! namespace ([`crate::network`]), and writes an OCI bundle whose `config.json` says what
//! runs and how: the image's process merged with `config.init`/`env` (Fly's rules), user,
//! pid, mount, ipc, uts, cgroup and network namespaces, Docker's default capabilities less
//! `NET_RAW` and `MKNOD`, no-new-privileges, the shared seccomp allowlist
//! ([`bazaar_types::seccomp`]), masked `/proc` paths and the volume's bind mount.
//!
//! User namespace: the machine's root is host id `uid_base` ([`crate::idranges`]). Its
//! rootfs sees the shared layers through idmapped mounts and its writable layer is its own;
//! the files the agent writes into it and its volume are chowned into the range. runc
//! enters the rootfs as the mapped root, which may not traverse the data dir (it can sit
//! in a mode-700 home): the rootfs is also mounted at `/run/bazaar/<host id>/rootfs/<id>`,
//! and that is what the bundle names.
//!
//! The run itself is `runc run --keep` of that bundle, supervised by the machine's shim like
//! any workload: the shim puts runc in the machine's cgroup (limits from `guest`) and runc
//! puts the container one level below it; the shim forwards signals to runc, which forwards
//! them to the container, and kills the whole cgroup tree when the run must die. `--keep`
//! leaves the container's cgroup in place until the shim has read its OOM counter.
//! The run counts as started once runc has created the container (its `--pid-file`).
//! A gVisor machine (`config.runtime = "gvisor"`) runs the same bundle under `runsc`,
//! adapted by [`crate::gvisor`] (no user namespace, the image's own ids).
//!
//! Layout of a run: `runs/<run_id>/bundle/config.json`, `runs/<run_id>/runc/` (runc's
//! state), `runs/<run_id>/container.pid`; the rootfs is `machines/<id>/layer/rootfs` (over
//! the machine's writable layer, [`crate::layer`]), mounted again at
//! `/run/bazaar/<host id>/rootfs/<id>`.

mod cluster;
mod rootfs;
mod seccomp_profile;

use crate::launch_error::{LaunchError, LaunchStep};
use bazaar_shim::{FailureKind, Fault};
pub(crate) use rootfs::unexpose_rootfs;
use rootfs::{expose_rootfs, give_volume_to_ids, open_root, resolve_user, write_in_root, InRoot};
use seccomp_profile::seccomp_profile;

use crate::gvisor::Gvisor;
use crate::idranges::{IdRanges, RANGE_SIZE};
use crate::lifecycle::Workload;
use crate::network::LazyNetwork;
use bazaar_image::{Auth, IdMap, ImageStore, PullPhase, Reference};
use bazaar_types::event::MachineEvent;
use bazaar_types::machine::ImageRef;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long runc gets to create the container once the shim is up.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Docker's default capability set, less `NET_RAW` (raw and packet sockets: spoofing) and
/// `MKNOD` (the devices a machine has are given).
const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The agent's settings for image machines (its config's fields of the same names).
#[derive(Debug, Clone, Copy)]
pub struct OciSettings<'a> {
    pub data_dir: &'a Path,
    pub insecure_registries: &'a [String],
    pub allow_loopback_registries: bool,
    pub machine_subnet: Option<&'a str>,
    pub machine_nat: bool,
    pub runc: Option<&'a Path>,
    pub registry_auth: &'a [String],
    /// microVM machines: the guest kernel and whether TCG may stand in for KVM.
    pub vm_kernel: Option<&'a Path>,
    pub vm_allow_tcg: bool,
}

/// When each image (by reference) was last pulled, imported or launched on this host.
#[derive(Debug, Default)]
pub struct LastUse(Mutex<std::collections::HashMap<String, Instant>>);

impl LastUse {
    /// Records a use of `reference` now.
    pub fn touch(&self, reference: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(reference.to_string(), Instant::now());
    }

    /// How long `reference` has not been used.
    pub fn idle_for(&self, reference: &str) -> Duration {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // An image found on disk (after a restart) counts as used now.
        map.entry(reference.to_string())
            .or_insert_with(Instant::now)
            .elapsed()
    }
}

/// What this host needs to run image machines.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    pub runc: PathBuf,
    pub images: ImageStore,
    pub network: Arc<LazyNetwork>,
    /// When each image was last used here (for pruning by the agent).
    pub last_use: Arc<LastUse>,
    /// Credentials by registry host (`--registry-auth`); others are pulled anonymously.
    pub credentials: BTreeMap<String, Auth>,
    /// The other hosts the cluster's own images (`registry.bazaar.internal/...`) are
    /// pulled from, once the node has set it (`bazaar_image::peers`).
    pub peers: Arc<std::sync::OnceLock<Arc<dyn bazaar_image::peers::PeerSource>>>,
    /// `/run/bazaar/<host id>`: what runc must reach as a machine's root (its rootfs).
    pub runtime_dir: PathBuf,
    /// `bazaar/<host id>`, the parent of the machines' cgroups (the driver's naming).
    cgroup_parent: String,
    /// `DATA/disk-templates`: the empty disks machines' writable layers are copied from.
    pub(crate) disk_templates: PathBuf,
    /// gVisor machines: how this host runs them ([`crate::gvisor`]), or why it cannot.
    pub gvisor: Result<Arc<Gvisor>, String>,
    /// microVM machines: how this host runs them ([`crate::microvm`]), or why it cannot.
    pub microvm: Result<Arc<crate::microvm::MicroVm>, String>,
}

/// What [`OciRuntime::prepare`] made for a run.
#[derive(Debug)]
pub struct Prepared {
    /// The argv the shim runs (`runc run ...`).
    pub argv: Vec<String>,
    /// Events for the machine (image pull).
    pub events: Vec<MachineEvent>,
    /// The image it runs, resolved.
    pub image_ref: ImageRef,
    /// How the shim delivers signals (gVisor's `runsc kill`); `None`: to runc, which
    /// forwards them.
    pub signal_argv: Option<Vec<String>>,
}

/// The `image_ref` of `reference`: the digest it resolved to and its labels, once pulled.
fn image_ref(reference: &Reference, image: Option<&bazaar_image::Image>) -> ImageRef {
    ImageRef {
        registry: reference.registry.clone(),
        repository: reference.repository.clone(),
        tag: reference.tag.clone().unwrap_or_default(),
        digest: image
            .map(|i| i.digest.to_string())
            .or_else(|| reference.digest.as_ref().map(|d| d.to_string()))
            .unwrap_or_default(),
        labels: image
            .and_then(|i| i.config.config.as_ref()?.labels.clone())
            .unwrap_or_default(),
    }
}

/// The `image_ref` a machine's config names, before it is resolved (no labels; a digest
/// only if the reference has one). `None` for a reference that does not parse.
pub fn configured_image_ref(image: &str) -> Option<ImageRef> {
    Some(image_ref(&image.parse().ok()?, None))
}

impl OciRuntime {
    /// Finds runc (in PATH, or `configured`); the machine network is set up when first
    /// needed. `Err` with the reason when this host cannot run images.
    pub fn detect(
        host_id: &str,
        configured_runc: Option<&Path>,
        registry_auth: &[String],
        images: ImageStore,
        network: LazyNetwork,
    ) -> Result<OciRuntime, String> {
        let runc = match configured_runc {
            Some(p) => p.to_path_buf(),
            None => find_in_path("runc").ok_or("runc is not installed (apt-get install runc)")?,
        };
        if !rustix::process::geteuid().is_root() {
            return Err("image machines need the agent to run as root".into());
        }
        let mut credentials = BTreeMap::new();
        for entry in registry_auth {
            let parsed = entry.split_once('=').and_then(|(host, cred)| {
                let (user, pass) = cred.split_once(':')?;
                (!host.is_empty() && !user.is_empty()).then(|| {
                    (
                        host.to_string(),
                        Auth::Basic {
                            username: user.into(),
                            password: pass.into(),
                        },
                    )
                })
            });
            let (host, auth) = parsed.ok_or_else(|| {
                format!(
                    "registry_auth entry {:?} must be host[:port]=user:password",
                    entry.split(':').next().unwrap_or("")
                )
            })?;
            credentials.insert(host, auth);
        }
        Ok(OciRuntime {
            runc,
            images,
            network: Arc::new(network),
            last_use: Arc::default(),
            credentials,
            peers: Arc::default(),
            runtime_dir: Path::new("/run/bazaar").join(host_id),
            cgroup_parent: format!("bazaar/{host_id}"),
            disk_templates: PathBuf::from("disk-templates"),
            gvisor: Err("not looked for".into()),
            microvm: Err("not looked for".into()),
        })
    }

    /// The credentials for pulling `reference`.
    pub fn auth_for(&self, reference: &Reference) -> Auth {
        self.credentials
            .get(&reference.registry)
            .cloned()
            .unwrap_or_default()
    }

    /// The OCI runtime of an agent, or why it has none (not root, no cgroups, no runc, a
    /// bad setting).
    pub fn for_agent(
        config: &OciSettings<'_>,
        host_id: &str,
        cgroups: bool,
    ) -> Result<Arc<OciRuntime>, String> {
        if !cgroups {
            return Err("image machines need root and cgroups (isolation on)".into());
        }
        let images = bazaar_image::ImageStore::open(
            config.data_dir.join("images"),
            bazaar_image::StoreOptions {
                insecure_registries: config.insecure_registries.to_vec(),
                allow_loopback_registries: config.allow_loopback_registries,
                copy_rootfs: false,
            },
        )
        .map_err(|e| format!("opening the image store: {e}"))?;
        let subnet = config
            .machine_subnet
            .map(str::parse::<crate::network::Subnet>)
            .transpose()?;
        let network = crate::network::LazyNetwork::new(
            config.data_dir,
            host_id,
            subnet,
            config.machine_nat,
            Arc::new(IdRanges::new(host_id)),
        );
        let mut runtime =
            OciRuntime::detect(host_id, config.runc, config.registry_auth, images, network)?;
        runtime.disk_templates = config.data_dir.join("disk-templates");
        runtime.gvisor = Gvisor::detect(config.data_dir).map(Arc::new);
        runtime.microvm =
            crate::microvm::MicroVm::detect(config.vm_kernel, None, config.vm_allow_tcg)
                .map(Arc::new);
        Ok(Arc::new(runtime))
    }

    /// Everything a run needs before the shim starts: image, rootfs, files, network,
    /// bundle. `layer` is the machine's writable layer, emptied for this run
    /// ([`OciRuntime::fresh_layer`]); `cgroup` is the machine's cgroup (the container goes
    /// in `<cgroup>/ctr`); `volume` the host path and mount point of its volume.
    /// Idempotent (a redone launch step rebuilds it all).
    pub async fn prepare(
        &self,
        rec: &Workload<'_>,
        layer: &Path,
        run_dir: &Path,
        cgroup: &str,
        volume: Option<(PathBuf, String)>,
        env: &BTreeMap<String, String>,
    ) -> Result<Prepared, LaunchError> {
        use LaunchStep as S;
        let t0 = Instant::now();
        // A gVisor machine's runtime, or why this host has none.
        let gvisor = match rec.config.driver() {
            "gvisor" => Some(self.gvisor.as_ref().map_err(|why| {
                LaunchError::new(S::Prepare, FailureKind::Unsupported, why.clone())
            })?),
            _ => None,
        };
        let microvm = match rec.config.driver() {
            "microvm" => Some(self.microvm.as_ref().map_err(|why| {
                LaunchError::new(S::Prepare, FailureKind::Unsupported, why.clone())
            })?),
            _ => None,
        };
        let mut events = Vec::new();
        let reference: Reference = rec.config.image.parse().map_err(|e| {
            LaunchError::image(S::Image, &format!("image {:?}", rec.config.image), &e)
        })?;
        cluster::check_app(&reference, rec.app)?;
        self.last_use.touch(&reference.to_string());
        let stored = self
            .images
            .image(&reference)
            .map_err(|e| LaunchError::image(S::Image, "", &e))?;
        let image = match stored {
            Some(image) => image,
            None => {
                let (image, event) = self.pull(&reference).await?;
                events.push(event);
                image
            }
        };
        let t_image = t0.elapsed();
        let ip = rec.private_ip.ok_or_else(|| {
            LaunchError::new(
                S::Network,
                FailureKind::Config,
                "the machine has no private address (recreate it)",
            )
        })?;
        // The network's errors end with their errno's text: classified by it.
        let network_error =
            |e: String| LaunchError::new(S::Network, bazaar_shim::kind_of_message(&e), e);
        // The address's namespaces: the network's, and the user namespace that owns it,
        // whose range the machine's files are given.
        let namespaces = tokio::task::spawn_blocking({
            let network = self.network.clone();
            move || network.get()?.attach(ip)
        })
        .await
        .map_err(|e| network_error(e.to_string()))?
        .map_err(network_error)?;
        if rec.uid_base.is_some_and(|b| b != namespaces.uid_base) {
            tracing::warn!(machine.id = %rec.id, recorded = ?rec.uid_base, now = namespaces.uid_base,
                           "the address's id range changed");
        }
        let ids = IdMap {
            host_base: namespaces.uid_base,
            count: RANGE_SIZE,
        };
        // A gVisor machine's files keep the image's ids (no user namespace: crate::gvisor).
        // A microVM's disk too (its own kernel's users: no host ids to map to).
        let mapped = (gvisor.is_none() && microvm.is_none()).then_some(ids);
        let t_network = t0.elapsed();
        let gateway = self.network.get().map_err(network_error)?.subnet.gateway();
        // Every run starts from the image as it is, in its emptied layer.
        let exposed = self.exposed_rootfs(rec.id);
        let rootfs = self
            .images
            .rootfs_mapped(
                &image,
                layer,
                mapped,
                mapped.map(|_| namespaces.userns.clone()),
            )
            .await
            .map_err(|e| LaunchError::image(S::Rootfs, "making the root filesystem", &e))?;
        let t_rootfs = t0.elapsed();
        let process = image
            .process(rec.config.init.as_ref(), env)
            .map_err(|e| LaunchError::image(S::Rootfs, "", &e))?;
        let in_rootfs = |f: Fault| LaunchError::fault(S::Rootfs, f);
        let root = InRoot {
            fd: open_root(&rootfs).map_err(in_rootfs)?,
            owner: mapped.map_or(0, |ids| ids.to_host(0)),
        };
        let (uid, gid) = resolve_user(&root.fd, process.user.as_deref()).map_err(in_rootfs)?;
        write_in_root(
            &root,
            "/etc/hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n{ip}\t{}\n", rec.id).as_bytes(),
            0o644,
        )
        .map_err(in_rootfs)?;
        write_in_root(
            &root,
            "/etc/hostname",
            format!("{}\n", rec.id).as_bytes(),
            0o644,
        )
        .map_err(in_rootfs)?;
        // The internal DNS on the gateway answers `.internal` and forwards the rest.
        write_in_root(
            &root,
            "/etc/resolv.conf",
            crate::network::resolv_conf(gateway).as_bytes(),
            0o644,
        )
        .map_err(in_rootfs)?;
        for f in &rec.config.files {
            let Some(raw) = &f.raw_value else {
                return Err(LaunchError::new(
                    S::Files,
                    FailureKind::Config,
                    format!("config.files {}: only raw_value is supported", f.guest_path),
                ));
            };
            use base64::Engine;
            let data = base64::engine::general_purpose::STANDARD
                .decode(raw)
                .map_err(|e| {
                    LaunchError::new(
                        S::Files,
                        FailureKind::Config,
                        format!(
                            "config.files {}: raw_value is not base64: {e}",
                            f.guest_path
                        ),
                    )
                })?;
            write_in_root(&root, &f.guest_path, &data, f.mode.unwrap_or(0o644))
                .map_err(|e| LaunchError::fault(S::Files, e))?;
        }
        if let Some(vm) = microvm {
            if volume.is_some() {
                let why = "volumes are not attached to microVM machines yet";
                return Err(LaunchError::new(S::Bundle, FailureKind::Unsupported, why));
            }
            let log = run_dir.join("../../output.log");
            let argv = crate::microvm::prepare(
                vm,
                crate::microvm::VmLaunch {
                    id: rec.id,
                    rootfs: &rootfs,
                    run_dir,
                    log: &log,
                    netns: &namespaces.netns,
                    ip,
                    prefix: self.network.get().map_err(network_error)?.subnet.prefix,
                    gateway,
                    process: &process,
                    uid,
                    gid,
                    cpus: rec.resources.cpus,
                    memory_mb: rec.resources.memory_mb as u32,
                    disk_gb: rec.config.rootfs_size_gb().ok().flatten(),
                },
            );
            let argv = argv.await?;
            let (signal_argv, image_ref) = (None, image_ref(&reference, Some(&image)));
            return Ok(Prepared {
                argv,
                events,
                image_ref,
                signal_argv,
            });
        }
        expose_rootfs(&rootfs, &exposed).map_err(in_rootfs)?;
        if let (Some((source, _)), Some(ids)) = (&volume, mapped) {
            let source = source.clone();
            tokio::task::spawn_blocking(move || give_volume_to_ids(&source, ids))
                .await
                .map_err(|e| LaunchError::new(S::Bundle, FailureKind::Io, e.to_string()))?
                .map_err(|e| LaunchError::fault(S::Bundle, e))?;
        }
        let bundle = run_dir.join("bundle");
        std::fs::create_dir_all(&bundle).map_err(|e| {
            LaunchError::io(S::Bundle, format_args!("creating {}", bundle.display()), &e)
        })?;
        let mut spec = bundle_config(&BundleInputs {
            hostname: rec.id,
            rootfs: &exposed,
            ids,
            args: &process.args,
            env: &process.env,
            cwd: &process.cwd,
            uid,
            gid,
            namespaces: &namespaces,
            cgroup: &format!("/{cgroup}/ctr"),
            volume: volume.as_ref(),
        });
        if gvisor.is_some() {
            crate::gvisor::adapt_bundle(&mut spec);
            crate::gvisor::make_stdio_file(run_dir)
                .map_err(|e| LaunchError::io(S::Bundle, "making runsc's stdio file", &e))?;
        }
        write_file(
            &bundle.join("config.json"),
            &serde_json::to_vec_pretty(&spec).expect("json"),
        )
        .map_err(|e| LaunchError::fault(S::Bundle, e))?;
        tracing::debug!(
            machine.id = %rec.id,
            image_ms = t_image.as_secs_f64() * 1e3,
            network_ms = (t_network - t_image).as_secs_f64() * 1e3,
            rootfs_ms = (t_rootfs - t_network).as_secs_f64() * 1e3,
            total_ms = t0.elapsed().as_secs_f64() * 1e3,
            "image machine prepared"
        );
        Ok(Prepared {
            argv: match gvisor {
                Some(g) => g.run_argv(run_dir, rec.id, &bundle),
                None => self.run_argv(run_dir, rec.id, &bundle),
            },
            signal_argv: gvisor.map(|g| g.signal_argv(run_dir, rec.id)),
            events,
            image_ref: image_ref(&reference, Some(&image)),
        })
    }

    /// Pulls an image, and the event that says how it went.
    async fn pull(
        &self,
        reference: &Reference,
    ) -> Result<(bazaar_image::Image, MachineEvent), LaunchError> {
        let started = Instant::now();
        let bytes = Arc::new(Mutex::new(BTreeMap::<usize, (u64, bool)>::new()));
        let progress = {
            let bytes = bytes.clone();
            let reference = reference.to_string();
            move |p: bazaar_image::PullProgress| {
                let mut b = bytes.lock().unwrap_or_else(|e| e.into_inner());
                b.insert(p.index, (p.total, p.phase == PullPhase::Cached));
                if matches!(p.phase, PullPhase::Ready | PullPhase::Cached) {
                    tracing::info!(image = %reference, layer = p.index + 1, of = p.count, phase = ?p.phase, "pull");
                }
            }
        };
        let fail = |e: bazaar_image::Error| {
            LaunchError::image(LaunchStep::Image, &format!("pulling {reference}"), &e)
        };
        let (image, served_by) = cluster::pull(self, reference, &progress)
            .await
            .map_err(fail)?;
        let b = bytes.lock().unwrap_or_else(|e| e.into_inner());
        let fetched: u64 = b
            .values()
            .filter(|(_, cached)| !cached)
            .map(|(n, _)| n)
            .sum();
        let cached = b.values().filter(|(_, cached)| *cached).count();
        let event = MachineEvent::new("pull", "pulled", "flyd").with_reason(format!(
            "{reference}: {} layers ({cached} cached), {fetched} bytes in {} ms{served_by}",
            image.layers.len(),
            started.elapsed().as_millis()
        ));
        Ok((image, event))
    }

    fn run_argv(&self, run_dir: &Path, id: &str, bundle: &Path) -> Vec<String> {
        vec![
            self.runc.display().to_string(),
            "--root".into(),
            run_dir.join("runc").display().to_string(),
            "run".into(),
            "--keep".into(),
            "--pid-file".into(),
            pid_file(run_dir).display().to_string(),
            "--bundle".into(),
            bundle.display().to_string(),
            id.into(),
        ]
    }

    /// `runc exec` of `argv` in run `run_dir`'s container.
    pub fn exec_argv(&self, run_dir: &Path, id: &str, argv: &[String]) -> Vec<String> {
        let mut v = vec![
            self.runc.display().to_string(),
            "--root".into(),
            run_dir.join("runc").display().to_string(),
            "exec".into(),
            id.into(),
        ];
        v.extend(argv.iter().cloned());
        v
    }

    /// Where machine `id`'s rootfs is mounted for runc.
    pub(crate) fn exposed_rootfs(&self, id: &str) -> PathBuf {
        self.runtime_dir.join("rootfs").join(id)
    }

    /// Removes what a destroyed machine had: its cgroups (runc's `<cgroup>/ctr`, left by
    /// `runc run --keep`, and the machine's, in every hierarchy), its rootfs (unmounted, at
    /// both places; its layer's disk is unmounted by the driver). Its network namespace
    /// goes with its address ([`crate::network::Network::renew`]), its id range with its
    /// record.
    pub async fn cleanup(&self, id: &str, machine_dir: &Path) {
        remove_runc_cgroups(&format!("{}/{id}", self.cgroup_parent));
        if let Err(err) = unexpose_rootfs(&self.exposed_rootfs(id)) {
            tracing::warn!(machine.id = id, error = %err, "removing the root filesystem");
        }
        // Where the rootfs is: in the layer, or (made before layers) the machine directory.
        for dir in [
            crate::work_disk::layer_dir(machine_dir),
            machine_dir.to_path_buf(),
        ] {
            if !dir.join("rootfs").exists() {
                // A process machine (or one whose rootfs is already gone).
            } else if let Err(err) = self.images.remove_rootfs(&dir).await {
                tracing::warn!(machine.id = id, error = %err, "removing the root filesystem");
            }
        }
    }
}

/// Removes machine cgroup `cgroup` and its container's (`ctr`) from every hierarchy:
/// runc makes them in all of them (on cgroup v1 also in those the shim does not manage,
/// such as `devices`, `cpuset` or `systemd`). Cgroups still in use stay (and are logged).
fn remove_runc_cgroups(cgroup: &str) {
    const ROOT: &str = "/sys/fs/cgroup";
    let hierarchies = std::iter::once(PathBuf::from(ROOT)).chain(
        std::fs::read_dir(ROOT)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path()),
    );
    for hierarchy in hierarchies {
        let machine = hierarchy.join(cgroup);
        for dir in [machine.join("ctr"), machine] {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "removing a cgroup");
                }
                _ => {}
            }
        }
    }
}

/// Where runc writes the container's pid once it is created.
pub fn pid_file(run_dir: &Path) -> PathBuf {
    run_dir.join("container.pid")
}

/// Waits until runc has created the container of `run_dir` (its pid file), or the run has
/// ended (the shim wrote its exit record): then the error is the end of the machine's log,
/// where runc says what went wrong.
pub async fn wait_created(run_dir: &Path, log: &Path) -> Result<i32, LaunchError> {
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let mut pause = Duration::from_micros(200);
    loop {
        if let Ok(text) = std::fs::read_to_string(pid_file(run_dir)) {
            if let Ok(pid) = text.trim().parse::<i32>() {
                return Ok(pid);
            }
        }
        if bazaar_shim::read_exit(run_dir).is_some() {
            let tail = log_tail(log);
            return Err(LaunchError::new(
                LaunchStep::Container,
                bazaar_shim::kind_of_message(&tail),
                format!("the container did not start: {tail}"),
            ));
        }
        if Instant::now() > deadline {
            return Err(LaunchError::new(
                LaunchStep::Container,
                FailureKind::Busy,
                format!(
                    "the container was not created within {}s",
                    CREATE_TIMEOUT.as_secs()
                ),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// The last non-empty line of a log (runc's error), cut to a readable length.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    let text = String::from_utf8_lossy(&text[start..]).into_owned();
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .to_string();
    // The log is JSON lines ({"ts", "stream", "line"}); runc's message is the `line`.
    let line = serde_json::from_str::<Value>(&line)
        .ok()
        .and_then(|v| v["line"].as_str().map(str::to_string))
        .unwrap_or(line);
    line.chars().take(500).collect()
}

struct BundleInputs<'a> {
    hostname: &'a str,
    rootfs: &'a Path,
    ids: IdMap,
    args: &'a [String],
    env: &'a [String],
    cwd: &'a str,
    uid: u32,
    gid: u32,
    namespaces: &'a crate::network::Attached,
    cgroup: &'a str,
    volume: Option<&'a (PathBuf, String)>,
}

/// The OCI runtime spec (`config.json`) of a run.
fn bundle_config(i: &BundleInputs<'_>) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
               "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
    ];
    if let Some((source, destination)) = i.volume {
        mounts.push(json!({"destination": destination, "type": "bind",
                           "source": source, "options": ["rbind", "rw"]}));
    }
    let caps: Vec<&str> = CAPABILITIES.to_vec();
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": i.uid, "gid": i.gid},
            "args": i.args,
            "env": i.env,
            "cwd": i.cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": true,
        },
        "root": {"path": i.rootfs, "readonly": false},
        "hostname": i.hostname,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": i.cgroup,
            "resources": {
                "devices": [{"allow": false, "access": "rwm"}],
                "pids": {"limit": 16384},
            },
            "uidMappings": [{"containerID": 0, "hostID": i.ids.host_base, "size": i.ids.count}],
            "gidMappings": [{"containerID": 0, "hostID": i.ids.host_base, "size": i.ids.count}],
            "namespaces": [
                {"type": "user", "path": i.namespaces.userns},
                {"type": "pid"},
                {"type": "network", "path": i.namespaces.netns},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "cgroup"},
            ],
            "seccomp": seccomp_profile(),
            "maskedPaths": [
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                "/proc/scsi",
            ],
            "readonlyPaths": [
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
            ],
        },
    })
}

/// Writes a file readable by the agent's user only: a bundle's `config.json` holds the
/// machine's environment, its app secrets included.
fn write_file(path: &Path, data: &[u8]) -> Result<(), Fault> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(data))
        .map_err(|e| Fault::io(format!("writing {}", path.display()), &e))
}

pub(crate) fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    path.split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
