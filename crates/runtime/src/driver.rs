//! The driver: turns a machine record into a shim spec (command, environment with the
//! machine's identity, ports, limits, isolation) and launches, adopts and cleans up runs.
//! Process machines run their command directly under the shim; image machines
//! (`config.image`) run `runc` under it (`runsc` for `config.runtime = "gvisor"`: [`crate::gvisor`]),
//! prepared by [`crate::oci`].
//! Layout under `data_dir/machines/<id>/`: `work/` (a process workload's directory),
//! `layer/` (an image machine's writable layer, with its root at `layer/rootfs`), `output.log` (stdout/stderr), `runs/<run_id>/`
//! (one shim's files).

mod work_files;

pub use work_files::work_files;

use crate::launch_error::{LaunchError, LaunchStep};
use crate::lifecycle::{LaunchReport, MachineDriver, Run, RunFound, Workload};
use crate::network::LazyNetwork;
use crate::oci::OciRuntime;
use bazaar_shim::{FailureKind, Sandbox, ShimError, ShimHandle, ShimSpec};
use bazaar_types::event::MachineEvent;
use bazaar_types::machine::ImageRef;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a sandboxed process machine sees its work directory (its cwd and HOME).
pub const SANDBOX_WORKDIR: &str = "/work";

/// The PATH used when the machine's env does not set one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Launches workloads through shims.
#[derive(Debug, Clone)]
pub struct Driver {
    pub exe: PathBuf,
    pub machines_dir: PathBuf,
    pub host_id: String,
    pub isolate: bool,
    pub cgroups: bool,
    pub log_max_bytes: u64,
    /// The size (MB) of a machine's writable space when its config does not say; `None`:
    /// by guest size; 0: no limit ([`crate::work_disk`]).
    pub machine_disk_mb: Option<u64>,
    /// Where volumes live (a machine that mounts one is told its path).
    pub volumes: crate::volume_fs::VolumeFs,
    /// Image machines: runc, the image store and the machine network, or why this host
    /// cannot run them.
    pub oci: Result<Arc<OciRuntime>, String>,
    /// The machine network (the image machines' one when this host runs images): sandboxed
    /// process machines get an address and a network namespace on it too. `None` when the
    /// agent does not isolate (not root): process machines then listen on host ports.
    pub network: Option<Arc<LazyNetwork>>,
    /// The seccomp filters of sandboxed runs, compiled once at start ([`seccomp_filters`]).
    pub seccomp: Option<PathBuf>,
    /// The mount namespace sandboxed runs start from, made once at start ([`sandbox_base`]).
    pub sandbox_base: Option<PathBuf>,
    /// Work disks made ahead for sandboxed machines' first starts ([`crate::disk_pool`]).
    pub disk_pool: Option<Arc<crate::disk_pool::DiskPool>>,
}

/// Compiles the seccomp filters of sandboxed process machines into `DATA/seccomp.bpf`, for
/// their shims to read rather than compile each (`None` when the agent does not sandbox,
/// or the file could not be written: each shim then compiles them).
pub fn seccomp_filters(data_dir: &Path, sandboxes: bool) -> Option<PathBuf> {
    if !sandboxes {
        return None;
    }
    let path = data_dir.join("seccomp.bpf");
    match bazaar_shim::write_seccomp_filters(&path) {
        Ok(()) => Some(path),
        Err(err) => {
            tracing::warn!(error = %err, "compiling the seccomp filters once");
            None
        }
    }
}

/// Makes the mount namespace sandboxed runs build their roots in, bound at
/// `DATA/sandbox-base` (under the data dir, so that releasing the host always unmounts it;
/// `None` when the agent does not sandbox, or it could not be made: each run then starts
/// from a copy of the host's mounts, two per machine address, which makes its start slower
/// as the host holds more machines).
pub fn sandbox_base(data_dir: &Path, sandboxes: bool) -> Option<PathBuf> {
    if !sandboxes {
        return None;
    }
    let path = data_dir.join("sandbox-base");
    match bazaar_shim::make_sandbox_base(&path, &data_dir.join("sandbox-scratch")) {
        Ok(()) => Some(path),
        Err(err) => {
            tracing::warn!(error = %err, "making the sandbox base mount namespace");
            None
        }
    }
}

impl Driver {
    /// A machine's directory.
    pub fn machine_dir(&self, id: &str) -> PathBuf {
        self.machines_dir.join(id)
    }

    /// One run's directory.
    pub fn run_dir(&self, id: &str, run_id: u64) -> PathBuf {
        self.machine_dir(id).join("runs").join(run_id.to_string())
    }

    /// The machine's log file.
    pub fn log_path(&self, id: &str) -> PathBuf {
        self.machine_dir(id).join("output.log")
    }

    /// The machine's cgroup path (relative to each hierarchy's root).
    pub fn cgroup(&self, id: &str) -> Option<String> {
        self.cgroups
            .then(|| format!("bazaar/{}/{}", self.host_id, id))
    }

    /// The environment every workload gets: the machine's env and its identity
    /// (`FLY_*`/`BAZAAR_*`: machine id, app, region, private address, version).
    pub fn machine_env(&self, rec: &Workload<'_>) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = rec.config.env.clone();
        let private_ip = rec
            .private_ip
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| "127.0.0.1".into());
        for prefix in ["BAZAAR", "FLY"] {
            env.insert(format!("{prefix}_MACHINE_ID"), rec.id.to_owned());
            env.insert(format!("{prefix}_APP_NAME"), rec.app.to_owned());
            env.insert(format!("{prefix}_REGION"), rec.region.to_owned());
            env.insert(format!("{prefix}_PRIVATE_IP"), private_ip.clone());
        }
        env.insert("FLY_MACHINE_VERSION".into(), rec.instance_id.to_owned());
        env.insert("BAZAAR_INSTANCE_ID".into(), rec.instance_id.to_owned());
        env.insert("FLY_ALLOC_ID".into(), rec.id.to_owned());
        env.insert("BAZAAR_HOST_ID".into(), self.host_id.clone());
        env
    }

    /// Builds the spec for run `run_id` of process machine `rec`.
    pub fn spec(&self, rec: &Workload<'_>, run_id: u64) -> ShimSpec {
        let argv = rec
            .config
            .init
            .as_ref()
            .map(|i| i.argv())
            .unwrap_or_default();
        let workdir = self.machine_dir(rec.id).join("work");
        let sandbox = self.sandbox(rec);
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        env.insert("PATH".into(), DEFAULT_PATH.into());
        let home = sandbox.as_ref().map_or(&workdir, |s| &s.workdir);
        env.insert("HOME".into(), home.display().to_string());
        env.insert("BAZAAR_WORK_DIR".into(), home.display().to_string());
        env.extend(self.machine_env(rec));
        // The first service's port is PORT; every service also gets PORT_<internal>. A
        // machine with an address of its own listens on the internal ports themselves.
        for (i, svc) in rec.config.services.iter().enumerate() {
            let port = match rec.private_ip {
                Some(_) => Some(&svc.internal_port),
                None => rec.host_ports.get(&svc.internal_port),
            };
            if let Some(host_port) = port {
                if i == 0 {
                    env.insert("PORT".into(), host_port.to_string());
                }
                env.insert(format!("PORT_{}", svc.internal_port), host_port.to_string());
            }
        }
        // A sandboxed machine has its volume at `mounts[0].path`; one that is not (the
        // agent is not root) reaches it at its host path.
        if let Ok(Some(mount)) = bazaar_types::volume::mount_of(rec.config) {
            let path = match &sandbox {
                Some(_) => PathBuf::from(&mount.path),
                None => self.volumes.mount_path(&mount.volume),
            };
            env.insert("BAZAAR_VOLUME_PATH".into(), path.display().to_string());
            env.insert("BAZAAR_VOLUME_ID".into(), mount.volume);
            env.insert("BAZAAR_VOLUME_MOUNT_PATH".into(), mount.path);
        }
        let cgroup = self.cgroup(rec.id);
        ShimSpec {
            machine_id: rec.id.to_owned(),
            run_id,
            argv,
            env: env.into_iter().collect(),
            workdir,
            user: match (&sandbox, rec.uid) {
                (Some(_), Some(_)) if self.runs_as_root(rec) => Some("0:0".into()),
                (Some(_), Some(uid)) => Some(format!("{uid}:{uid}")),
                // A root agent that does not isolate (only with --allow-root-machines):
                // no user switch, as the flag says; nobody could not reach the work
                // directory in the private data dir.
                (None, _) if !self.isolate && rustix::process::geteuid().is_root() => rec
                    .config
                    .init
                    .as_ref()
                    .and_then(|i| i.user.clone())
                    .or_else(|| Some("0:0".into())),
                _ => rec.config.init.as_ref().and_then(|i| i.user.clone()),
            },
            hostname: rec.id.to_owned(),
            isolate: self.isolate,
            memory_mb: rec.resources.memory_mb,
            cpus: rec.resources.cpus as f64,
            cgroup_layout: cgroup.as_ref().and_then(|_| bazaar_shim::cgroup_layout()),
            signal_argv: None,
            cgroup,
            log_path: self.log_path(rec.id),
            log_max_bytes: self.log_max_bytes,
            sandbox,
        }
    }

    /// A process machine's sandbox: on an isolating (root) agent, for a machine with its own
    /// uid (records from before uids were recorded have none).
    fn sandbox(&self, rec: &Workload<'_>) -> Option<Sandbox> {
        rec.uid.filter(|_| self.isolate)?;
        let user = rec.config.init.as_ref().and_then(|i| i.user.as_deref());
        let user_name = user
            .map(|u| u.split(':').next().unwrap_or(u))
            .filter(|name| name.parse::<u32>().is_err() && !name.is_empty())
            .unwrap_or("machine");
        let binds = match bazaar_types::volume::mount_of(rec.config) {
            Ok(Some(mount)) => vec![(
                self.volumes.mount_path(&mount.volume),
                PathBuf::from(mount.path),
            )],
            _ => Vec::new(),
        };
        Some(Sandbox {
            workdir: PathBuf::from(SANDBOX_WORKDIR),
            binds,
            netns: None,
            resolv_conf: None,
            user_name: user_name.to_owned(),
            seccomp: self.seccomp.clone(),
            base: self.sandbox_base.clone(),
        })
    }

    /// Whether a process machine asked for root (allowed by the operator, or it would not
    /// have been accepted).
    fn runs_as_root(&self, rec: &Workload<'_>) -> bool {
        rec.config
            .init
            .as_ref()
            .and_then(|i| i.user.as_deref())
            .is_some_and(is_root_user)
    }

    /// Starts run `run_id` of `rec` with its app's secrets (`secret_env`, which win over
    /// `config.env`); what happened on the way (an image pull) is added to `events`. A
    /// process machine's secrets reach its shim through a pipe, never `spec.json`; an image
    /// machine's must be in its bundle's `config.json` (0600) for runc.
    pub async fn launch(
        &self,
        rec: &Workload<'_>,
        run_id: u64,
        secret_env: &[(String, String)],
        events: &mut Vec<MachineEvent>,
        image: &mut Option<ImageRef>,
        timing: &mut crate::timing::Timing,
    ) -> Result<ShimHandle, LaunchError> {
        let run_dir = self.run_dir(rec.id, run_id);
        let make_run_dir = || {
            std::fs::create_dir_all(&run_dir).map_err(|e| {
                LaunchError::io(
                    LaunchStep::Prepare,
                    format_args!("creating {}", run_dir.display()),
                    &e,
                )
            })
        };
        if rec.config.runs_image() {
            make_run_dir()?;
            timing.mark("run_dir");
            return self
                .launch_image(rec, run_id, secret_env, events, image, timing)
                .await;
        }
        let mut spec = self.spec(rec, run_id);
        let sandboxed_uid = rec.uid.filter(|_| spec.sandbox.is_some());
        // The work disk first: a first start's disk made ahead comes as the machine's whole
        // directory (`crate::disk_pool`).
        if sandboxed_uid.is_some() {
            if let Some(step) = self.limit_work_disk(rec).await? {
                timing.mark(step);
            }
        }
        make_run_dir()?;
        timing.mark("run_dir");
        if let (Some(sandbox), Some(ip)) = (spec.sandbox.as_mut(), rec.private_ip) {
            sandbox.netns = Some(self.attach_network(ip).await?);
            timing.mark("network");
            sandbox.resolv_conf = self
                .network
                .as_ref()
                .and_then(|n| n.ready())
                .map(|n| crate::network::resolv_conf(n.subnet.gateway()));
        }
        match sandboxed_uid {
            Some(uid) => {
                self.give_to_machine_user(rec, uid)?;
                timing.mark("owner");
            }
            None => self.give_volume_to_workload(rec),
        }
        let files = work_files(rec.config)
            .map_err(|e| LaunchError::new(LaunchStep::Files, FailureKind::Config, e))?;
        if !files.is_empty() {
            let (workdir, user) = (spec.workdir.clone(), spec.user.clone());
            tokio::task::spawn_blocking(move || {
                bazaar_shim::write_work_files(&workdir, user.as_deref(), &files)
            })
            .await
            .map_err(|e| LaunchError::new(LaunchStep::Files, FailureKind::Io, e.to_string()))?
            .map_err(|e| LaunchError::fault(LaunchStep::Files, e))?;
            timing.mark("files");
        }
        ShimHandle::spawn_with_env(&self.exe, &run_dir, &spec, secret_env)
            .await
            .map_err(|e| LaunchError::shim(LaunchStep::Spawn, e))
    }

    /// The network namespace of address `ip` (set up now unless it was ahead of time: then
    /// taken without a blocking thread).
    async fn attach_network(&self, ip: std::net::Ipv4Addr) -> Result<PathBuf, LaunchError> {
        let no_network = "this host has no machine network";
        let network = self.network.clone().ok_or_else(|| {
            LaunchError::new(LaunchStep::Network, FailureKind::Unsupported, no_network)
        })?;
        // The network's errors end with their errno's text: classified by it.
        let failed = |e: String| {
            LaunchError::new(
                LaunchStep::Network,
                bazaar_shim::kind_of_message(&e),
                format!("machine network: {e}"),
            )
        };
        if let Some(ready) = network.ready().and_then(|n| n.attach_ready(ip)) {
            return Ok(ready.netns);
        }
        tokio::task::spawn_blocking(move || Ok::<_, String>(network.get()?.attach(ip)?.netns))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(failed)
    }

    /// An image machine's run: `runc run` of a bundle made by [`OciRuntime::prepare`], in
    /// the machine's cgroup; it is started once runc has created the container.
    async fn launch_image(
        &self,
        rec: &Workload<'_>,
        run_id: u64,
        secret_env: &[(String, String)],
        events: &mut Vec<MachineEvent>,
        image: &mut Option<ImageRef>,
        timing: &mut crate::timing::Timing,
    ) -> Result<ShimHandle, LaunchError> {
        let run_dir = &self.run_dir(rec.id, run_id);
        let oci = self.oci.as_ref().map_err(|e| {
            LaunchError::new(LaunchStep::Prepare, FailureKind::Unsupported, e.clone())
        })?;
        let volume = match bazaar_types::volume::mount_of(rec.config) {
            Ok(Some(m)) => Some((self.volumes.mount_path(&m.volume), m.path)),
            _ => None,
        };
        let cgroup = self.image_cgroup(rec.id);
        let mut env = self.machine_env(rec);
        env.extend(secret_env.iter().cloned());
        let machine_dir = self.machine_dir(rec.id);
        let disk_mb = self.work_disk_mb(rec);
        // A first start's layer disk made ahead ([`crate::disk_pool`]); a machine's next
        // starts keep theirs.
        let mut step = "layer";
        if let (Some(pool), Some(mb)) = (&self.disk_pool, disk_mb) {
            match pool.install_layer(&machine_dir, mb) {
                Ok(true) => step = "layer_ahead",
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(machine.id = rec.id, error = %err, "taking a layer disk made ahead (making one)");
                }
            }
        }
        let layer = oci.fresh_layer(rec.id, &machine_dir, disk_mb).await?;
        timing.mark(step);
        let prepared = oci
            .prepare(rec, &layer, run_dir, &cgroup, volume, &env)
            .await?;
        timing.mark("image_prepared");
        events.extend(prepared.events);
        *image = Some(prepared.image_ref);
        let vm = rec.config.driver() == "microvm";
        let spec = ShimSpec {
            argv: prepared.argv,
            env: vec![("PATH".into(), DEFAULT_PATH.into())],
            workdir: run_dir.to_path_buf(),
            user: Some("root".into()),
            isolate: false,
            cgroup: Some(cgroup),
            // QEMU's signals go to the guest's workload through the control port.
            signal_argv: match vm {
                true => Some(crate::microvm::signal_argv(&self.exe, run_dir)),
                false => prepared.signal_argv,
            },
            // The guest has the machine's memory; QEMU needs some of its own.
            memory_mb: rec.resources.memory_mb + if vm { crate::microvm::OVERHEAD_MB } else { 0 },
            ..self.spec(rec, run_id)
        };
        let handle = ShimHandle::spawn(&self.exe, run_dir, &spec)
            .await
            .map_err(|e| LaunchError::shim(LaunchStep::Spawn, e))?;
        match crate::oci::wait_created(run_dir, &self.log_path(rec.id)).await {
            Ok(_) => {
                timing.mark("container_created");
                Ok(handle)
            }
            Err(err) => {
                let _ = handle.kill();
                Err(err)
            }
        }
    }

    /// An image machine's cgroup (always one: runc needs it).
    fn image_cgroup(&self, id: &str) -> String {
        format!("bazaar/{}/{}", self.host_id, id)
    }

    /// The cgroup of machine `id` (an image machine when `image`), if it has one.
    pub fn machine_cgroup(&self, id: &str, image: bool) -> Option<String> {
        if image {
            Some(self.image_cgroup(id))
        } else {
            self.cgroup(id)
        }
    }

    /// The argv that runs `argv` inside image machine `id`'s run `run_id` (`runc exec`),
    /// or `None` for a process machine.
    pub fn exec_argv(
        &self,
        rec: &Workload<'_>,
        run_id: u64,
        argv: &[String],
    ) -> Option<Vec<String>> {
        let (oci, run_dir) = (self.oci.as_ref().ok()?, self.run_dir(rec.id, run_id));
        match rec.config.driver() {
            "oci" => Some(oci.exec_argv(&run_dir, rec.id, argv)),
            "gvisor" => Some(oci.gvisor.as_ref().ok()?.exec_argv(&run_dir, rec.id, argv)),
            "microvm" => Some(crate::microvm::exec_argv(&self.exe, &run_dir, argv)),
            _ => None,
        }
    }

    /// A sandboxed machine's work directory and volume belong to its uid alone (mode 0700);
    /// a volume last used by another uid is handed over, with everything in it. Each is
    /// changed through a descriptor of the directory itself ([`crate::owner`]): a symlink
    /// or a file in its place is refused, never followed.
    fn give_to_machine_user(&self, rec: &Workload<'_>, uid: u32) -> Result<(), LaunchError> {
        use std::os::unix::fs::PermissionsExt;
        let machine_dir = self.machine_dir(rec.id);
        let work = machine_dir.join("work");
        let fail = |path: &Path| {
            let what = format!("giving {} to uid {uid}", path.display());
            move |err: std::io::Error| LaunchError::io(LaunchStep::Ownership, what, &err)
        };
        std::fs::create_dir_all(&work).map_err(fail(&work))?;
        std::fs::set_permissions(&machine_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(fail(&machine_dir))?;
        crate::owner::give_dir(&work, uid, 0o700, false).map_err(fail(&work))?;
        if let Ok(Some(mount)) = bazaar_types::volume::mount_of(rec.config) {
            let path = self.volumes.mount_path(&mount.volume);
            crate::owner::give_dir(&path, uid, 0o700, true).map_err(fail(&path))?;
        }
        Ok(())
    }

    /// The size (MB) of machine `rec`'s writable space, or `None` when it has no limit
    /// (an agent that cannot mount file systems, or a limit turned off).
    pub fn work_disk_mb(&self, rec: &Workload<'_>) -> Option<u64> {
        if !self.volumes.ext4 || !self.isolate {
            return None;
        }
        let asked = rec
            .config
            .rootfs_size_gb()
            .ok()
            .flatten()
            .map(|gb| gb << 10);
        let mb = asked
            .or(self.machine_disk_mb)
            .unwrap_or_else(|| crate::work_disk::default_mb(rec.resources.memory_mb));
        (mb > 0).then_some(mb)
    }

    /// Makes the machine's work directory a file system of its size, once, and mounts it.
    /// Returns the timing step it was (`work_disk`, or `work_disk_ahead` for a disk made
    /// ahead by the pool), `None` when the machine has no limit.
    async fn limit_work_disk(
        &self,
        rec: &Workload<'_>,
    ) -> Result<Option<&'static str>, LaunchError> {
        let Some(mb) = self.work_disk_mb(rec) else {
            return Ok(None);
        };
        let dir = self.machine_dir(rec.id);
        if let Some(pool) = &self.disk_pool {
            // A first start takes one made ahead (a few system calls, on this thread).
            match pool.install(&dir, mb) {
                Ok(true) => return Ok(Some("work_disk_ahead")),
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(machine.id = rec.id, error = %err, "taking a work disk made ahead (making one)");
                }
            }
        }
        let templates = self.machines_dir.with_file_name("disk-templates");
        std::fs::create_dir_all(&dir).map_err(|e| {
            LaunchError::io(
                LaunchStep::WorkDisk,
                format_args!("creating {}", dir.display()),
                &e,
            )
        })?;
        let what = format!("making the machine's {mb} MB work disk");
        tokio::task::spawn_blocking(move || crate::work_disk::ensure(&dir, &templates, mb))
            .await
            .map_err(|e| LaunchError::new(LaunchStep::WorkDisk, FailureKind::Io, e.to_string()))?
            .map_err(|e| LaunchError::io(LaunchStep::WorkDisk, what, &e))?;
        Ok(Some("work_disk"))
    }

    /// An isolated workload without `init.user` runs as nobody: the root of its volume, as
    /// made (owned by root), is handed to nobody so the workload can write to it. A volume
    /// root someone already owns is left alone, and so is anything but a directory there.
    fn give_volume_to_workload(&self, rec: &Workload<'_>) {
        let user_set = rec.config.init.as_ref().is_some_and(|i| i.user.is_some());
        if !self.isolate || user_set {
            return;
        }
        let Ok(Some(mount)) = bazaar_types::volume::mount_of(rec.config) else {
            return;
        };
        let path = self.volumes.mount_path(&mount.volume);
        if let Err(err) = crate::owner::give_dir_if_root(&path, 65534) {
            tracing::warn!(machine.id = %rec.id, error = %err, "handing the volume to the workload");
        }
    }

    /// Removes everything a destroyed machine left on the host.
    pub async fn cleanup(&self, id: &str) {
        if let Ok(oci) = &self.oci {
            oci.cleanup(id, &self.machine_dir(id)).await;
        }
        let cgroup = self
            .cgroup(id)
            .or_else(|| self.oci.is_ok().then(|| self.image_cgroup(id)));
        if let Some(cg) = cgroup {
            if let Err(err) = bazaar_shim::remove_cgroup(&cg) {
                tracing::warn!(machine.id = id, error = %err, "removing cgroup");
            }
        }
        let dir = self.machine_dir(id);
        if let Err(err) = crate::work_disk::release(&dir) {
            tracing::warn!(machine.id = id, error = %err, "unmounting the work disk");
        }
        if let Err(err) = std::fs::remove_dir_all(&dir) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(machine.id = id, error = %err, "removing machine directory");
            }
        }
    }
}

/// How long a spawned-but-silent run directory is given before we assume its shim never
/// started (an agent killed in the middle of spawning).
const SPAWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

#[async_trait::async_trait]
impl MachineDriver for Driver {
    async fn launch(
        &self,
        machine: &Workload<'_>,
        run_id: u64,
        secret_env: &[(String, String)],
        report: &mut LaunchReport,
    ) -> Result<Box<dyn Run>, LaunchError> {
        let mut timing = crate::timing::Timing::start();
        let handle = Driver::launch(
            self,
            machine,
            run_id,
            secret_env,
            &mut report.events,
            &mut report.image,
            &mut timing,
        )
        .await?;
        timing.extend(handle.launch_marks());
        report.timing = timing.steps();
        Ok(Box::new(handle))
    }

    async fn find_run(&self, id: &str, run_id: u64) -> RunFound {
        let run_dir = self.run_dir(id, run_id);
        loop {
            if bazaar_shim::read_exit(&run_dir).is_some() {
                return RunFound::Ended;
            }
            match ShimHandle::adopt(&run_dir) {
                Ok(Some(h)) => return RunFound::Alive(Box::new(h)),
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(machine.id = %id, error = %err, "adopting run");
                }
            }
            // A spec written moments ago may belong to a shim that is still starting.
            let age = std::fs::metadata(run_dir.join("spec.json"))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok());
            match age {
                Some(age) if age < SPAWN_GRACE => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                _ => return RunFound::None,
            }
        }
    }

    fn adopt(&self, id: &str, run_id: u64) -> Result<Option<Box<dyn Run>>, ShimError> {
        Ok(ShimHandle::adopt(&self.run_dir(id, run_id))?.map(|h| Box::new(h) as Box<dyn Run>))
    }

    fn exit_record(&self, id: &str, run_id: u64) -> Option<bazaar_shim::ExitRecord> {
        let run_dir = self.run_dir(id, run_id);
        let record = bazaar_shim::read_exit(&run_dir)?;
        Some(match crate::microvm::is_vm_run(&run_dir) {
            true => crate::microvm::workload_exit(&run_dir, &self.log_path(id), record),
            false => record,
        })
    }

    async fn destroy(&self, id: &str) {
        self.cleanup(id).await
    }

    fn disk_full(&self, id: &str) -> Option<String> {
        crate::work_disk::full(&self.machine_dir(id))
    }
}

/// Whether `user` (`init.user`: a name or uid, optionally `:group`) means uid 0 on this host.
pub fn is_root_user(user: &str) -> bool {
    let name = user.split(':').next().unwrap_or(user);
    if let Ok(uid) = name.parse::<u32>() {
        return uid == 0;
    }
    if name == "root" {
        return true;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd.lines().any(|line| {
        let mut fields = line.split(':');
        fields.next() == Some(name) && fields.nth(1) == Some("0")
    })
}

/// Picks a free loopback TCP port for a service.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root agent's driver over `data` (no network, no images).
    fn test_driver(data: &Path) -> Driver {
        Driver {
            exe: PathBuf::from("/nonexistent"),
            machines_dir: data.join("machines"),
            host_id: "h-test".into(),
            isolate: true,
            cgroups: false,
            log_max_bytes: 1 << 20,
            machine_disk_mb: Some(0),
            volumes: crate::volume_fs::VolumeFs::new(data),
            oci: Err("no images here".into()),
            network: None,
            seccomp: None,
            sandbox_base: None,
            disk_pool: None,
        }
    }

    /// Where a machine's volume root or work directory should be, a symlink to a host
    /// file (as `/dev/null` was found owned by nobody after a test run, issue 31): the
    /// host file keeps its owner and mode, and the machine's launch says why it stopped.
    #[test]
    fn a_symlink_in_place_of_a_volume_root_or_work_dir_changes_no_host_file() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if !rustix::process::geteuid().is_root() {
            return; // the driver gives directories away only as root
        }
        let tmp = tempfile::tempdir().unwrap();
        let host_file = tmp.path().join("dev-null");
        std::fs::write(&host_file, b"").unwrap();
        std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let driver = test_driver(tmp.path());
        let volume = "vol_abc123";
        let mnt = driver.volumes.mount_path(volume);
        std::fs::create_dir_all(mnt.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&host_file, &mnt).unwrap();
        let config: bazaar_types::config::MachineConfig =
            serde_json::from_value(serde_json::json!({
                "image": "process", "init": {"exec": ["true"]},
                "mounts": [{"volume": volume, "path": "/data"}],
            }))
            .unwrap();
        let resources = bazaar_types::host::Resources {
            cpus: 1,
            memory_mb: 256,
        };
        let ports = BTreeMap::new();
        let rec = Workload {
            id: "m1",
            app: "a",
            region: "local",
            instance_id: "v1",
            config: &config,
            resources: &resources,
            host_ports: &ports,
            private_ip: None,
            uid: None,
            uid_base: None,
        };
        let unchanged = |what: &str| {
            let m = std::fs::metadata(&host_file).unwrap();
            assert_eq!(
                (m.uid(), m.gid(), m.mode() & 0o7777),
                (0, 0, 0o666),
                "after {what}"
            );
        };
        driver.give_volume_to_workload(&rec);
        unchanged("handing the volume to nobody");
        let err = driver.give_to_machine_user(&rec, 200_001).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        unchanged("handing the volume to the machine's uid");
        // The work directory itself a symlink, to a host directory (as /tmp).
        std::fs::remove_file(&mnt).unwrap();
        let host_dir = tmp.path().join("host-tmp");
        std::fs::create_dir(&host_dir).unwrap();
        std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let work = driver.machine_dir("m2").join("work");
        std::fs::create_dir_all(work.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&host_dir, &work).unwrap();
        let rec = Workload { id: "m2", ..rec };
        let err = driver.give_to_machine_user(&rec, 200_002).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        let m = std::fs::metadata(&host_dir).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, 0o1777));
    }
}
