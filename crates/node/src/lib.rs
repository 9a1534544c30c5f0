//! What a host offers the services that ride on it (the Machines API, the edge proxy, edge
//! certificates, the dashboard): the narrow [`Node`] interface, the [`NodeHandle`] they hold
//! (the node plus the task tracker their background work is spawned through), and the plain
//! types they share with the agent. The agent implements [`Node`]; the services depend on
//! this crate, never on the agent.
//!
//! - [`access`]: who is calling ([`Caller`]) and the host-interface check of the cluster
//!   secret.
//! - [`audit`]: the audit record's entry.
//! - [`error`]: the error a node answers ([`NodeError`], one HTTP status each).
//! - [`host_link`]: the mTLS client to other hosts' host listeners, and the host labels
//!   naming those listeners.
//! - [`listen`]: the accept loop of the host's own listeners and the admission that keeps
//!   strangers' connections from exhausting them.
//! - [`secrets`]: app secrets' errors and limits, private files, constant-time compare.
#![forbid(unsafe_code)]

pub mod access;
pub mod audit;
pub mod error;
pub mod host_link;
pub mod listen;
pub mod secrets;

pub use access::Caller;
pub use audit::AuditEntry;
pub use error::NodeError;
pub use host_link::HostLink;

use bazaar_catalog::{Catalog, SecretRecord};
use bazaar_types::config::MachineConfig;
use bazaar_types::host::Resources;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A future a [`Node`] method returns (boxed: the trait is used as `dyn Node`).
pub type NodeFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The host settings the services read (a subset of the agent's config).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This host's region.
    pub region: String,
    /// The host's data directory (services keep their files there).
    pub data_dir: PathBuf,
    /// How long a host may be dead before its machines are replaced elsewhere.
    pub replace_after: Duration,
    /// The proxy's HTTP listener.
    pub proxy_listen: SocketAddr,
    /// The proxy's HTTPS listener.
    pub proxy_tls_listen: SocketAddr,
    /// The proxy's hop listener (mTLS between hosts); `None`: an ephemeral port.
    pub proxy_hop_listen: Option<SocketAddr>,
    /// The domain apps are served under (`<app>.<domain>`).
    pub proxy_domain: String,
    /// Longest a request waits for a free slot of a machine.
    pub proxy_queue_timeout: Duration,
    /// How long the exchange waits for a host's bid.
    pub bid_deadline: Duration,
    /// Idle time after which a machine with `autostop` is stopped.
    pub autostop_idle: Duration,
    /// The ACME directory edge certificates are ordered from, if any.
    pub acme_directory: Option<String>,
    /// The CA certificate (PEM file) the ACME directory is served with, if not a public one.
    pub acme_ca: Option<PathBuf>,
}

/// What a host offers the services beside its agent. Object-safe: services hold it as
/// `dyn Node` (in a [`NodeHandle`]).
pub trait Node: std::fmt::Debug + Send + Sync + 'static {
    /// This host's id.
    fn host_id(&self) -> &str;
    /// The settings the services read.
    fn config(&self) -> &NodeConfig;
    /// The cluster catalog, once the host has started it.
    fn catalog(&self) -> Option<&Catalog>;
    /// The cluster secret (credential between hosts, key material for sealing).
    fn cluster_secret(&self) -> &str;
    /// The mTLS link to other hosts' host listeners, once this host has a certificate.
    fn host_link(&self) -> Option<&HostLink>;
    /// Cancelled when the host shuts down.
    fn shutdown_token(&self) -> CancellationToken;
    /// Who `token` is on the Machines API (a token-file token or a scoped token; the
    /// cluster secret is refused: it is not an API token).
    fn caller(&self, token: &str) -> Result<Caller, bazaar_auth::Denied>;
    /// Appends a change to this host's audit record.
    fn record_audit(&self, entry: &AuditEntry);
    /// Whether this host's drivers would accept `config`, and the resources it asks.
    fn validate_config(&self, config: &MachineConfig) -> Result<Resources, NodeError>;
    /// `app`'s secrets (sealed; set ones only).
    fn app_secrets(&self, app: &str) -> Vec<SecretRecord>;
    /// Sets (`Some`) and unsets (`None`) secrets of `app` in one go; the app's secrets
    /// after the change.
    fn set_app_secrets(
        &self,
        app: &str,
        changes: &[(String, Option<String>)],
    ) -> Result<Vec<SecretRecord>, secrets::SecretError>;
    /// The [`secrets::SECRETS_VERSION_HEADER`] value of a call forwarded for `app`.
    fn secrets_version_header(&self, app: &str) -> Option<String>;
    /// Starts machine `id` of this host (the proxy waking a stopped machine).
    fn start_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>>;
    /// Suspends machine `id` of this host (the proxy's autostop).
    fn suspend_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>>;
    /// Stops machine `id` of this host with its default signal and timeout (the proxy's
    /// autostop).
    fn stop_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>>;
    /// `Ok` when machine `id` is this host's.
    fn has_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>>;
    /// Holds displaced machine `id` of this host for its move to another host: `true` when
    /// it is still displaced here, and then no other operation touches it until
    /// [`Node::end_move`] (or until its copy here is destroyed once moved). A node that
    /// does not move machines answers `false`.
    fn hold_for_move<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<bool, NodeError>> {
        let _ = id;
        Box::pin(async { Ok(false) })
    }
    /// Ends the hold of [`Node::hold_for_move`]: the machine was `moved`, or is this
    /// host's again.
    fn end_move(&self, id: &str, moved: bool) {
        let _ = (id, moved);
    }
    /// Publishes where this host's proxy listens (and its hop listener) in the host record.
    fn set_proxy_addrs(&self, proxy: SocketAddr, hop: Option<SocketAddr>) -> NodeFuture<'_, ()>;
    /// The host's own metrics (agent and catalog) as Prometheus text, without the closing
    /// `# EOF` (the proxy serves them after its own at `/metrics`).
    fn metrics_text(&self) -> String;
}

/// What a service holds: the node and the tracker its background tasks are spawned
/// through, so that shutdown can wait for them ([`NodeHandle::drain`]). Cheap to clone;
/// derefs to the [`Node`].
#[derive(Debug, Clone)]
pub struct NodeHandle {
    node: Arc<dyn Node>,
    tasks: TaskTracker,
}

impl std::ops::Deref for NodeHandle {
    type Target = dyn Node;

    fn deref(&self) -> &Self::Target {
        &*self.node
    }
}

impl NodeHandle {
    /// `node`, with a tracker of its own.
    pub fn new(node: Arc<dyn Node>) -> NodeHandle {
        NodeHandle {
            node,
            tasks: TaskTracker::new(),
        }
    }

    /// Spawns a background task of a service, tracked: [`NodeHandle::drain`] waits for it.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }

    /// The tracker the services' tasks are spawned through.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Cancels the node's token, then waits at most `bound` for the tracked tasks to end.
    /// Returns how many were still running when the bound passed (0: all drained).
    pub async fn drain(&self, bound: Duration) -> usize {
        self.node.shutdown_token().cancel();
        self.tasks.close();
        match tokio::time::timeout(bound, self.tasks.wait()).await {
            Ok(()) => 0,
            Err(_) => self.tasks.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node with nothing behind it but a shutdown token: what `drain` needs.
    #[derive(Debug, Default)]
    struct Bare {
        shutdown: CancellationToken,
        config: Option<NodeConfig>,
    }

    impl Node for Bare {
        fn host_id(&self) -> &str {
            "h_bare"
        }
        fn config(&self) -> &NodeConfig {
            self.config.as_ref().expect("not read by drain")
        }
        fn catalog(&self) -> Option<&Catalog> {
            None
        }
        fn cluster_secret(&self) -> &str {
            ""
        }
        fn host_link(&self) -> Option<&HostLink> {
            None
        }
        fn shutdown_token(&self) -> CancellationToken {
            self.shutdown.clone()
        }
        fn caller(&self, _: &str) -> Result<Caller, bazaar_auth::Denied> {
            Err(bazaar_auth::Denied::Invalid("bare".into()))
        }
        fn record_audit(&self, _: &AuditEntry) {}
        fn validate_config(&self, _: &MachineConfig) -> Result<Resources, NodeError> {
            Err(NodeError::new(axum::http::StatusCode::BAD_REQUEST, "bare"))
        }
        fn app_secrets(&self, _: &str) -> Vec<SecretRecord> {
            Vec::new()
        }
        fn set_app_secrets(
            &self,
            _: &str,
            _: &[(String, Option<String>)],
        ) -> Result<Vec<SecretRecord>, secrets::SecretError> {
            Err(secrets::SecretError::NoCatalog)
        }
        fn secrets_version_header(&self, _: &str) -> Option<String> {
            None
        }
        fn start_machine<'a>(&'a self, _: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
            Box::pin(async { Ok(()) })
        }
        fn suspend_machine<'a>(&'a self, _: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
            Box::pin(async { Ok(()) })
        }
        fn stop_machine<'a>(&'a self, _: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
            Box::pin(async { Ok(()) })
        }
        fn has_machine<'a>(&'a self, _: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
            Box::pin(async { Ok(()) })
        }
        fn set_proxy_addrs(&self, _: SocketAddr, _: Option<SocketAddr>) -> NodeFuture<'_, ()> {
            Box::pin(async {})
        }
        fn metrics_text(&self) -> String {
            String::new()
        }
    }

    #[tokio::test]
    async fn drain_cancels_the_token_and_waits_for_every_tracked_task() {
        let node = NodeHandle::new(Arc::new(Bare::default()));
        let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..3 {
            let (token, finished) = (node.shutdown_token(), finished.clone());
            node.spawn(async move {
                token.cancelled().await;
                // Work after the cancellation (flushing, releasing) is waited for too.
                tokio::time::sleep(Duration::from_millis(20)).await;
                finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        assert_eq!(node.drain(Duration::from_secs(5)).await, 0);
        assert_eq!(finished.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(node.shutdown_token().is_cancelled());
    }

    #[tokio::test]
    async fn drain_is_bounded_and_counts_the_tasks_left() {
        let node = NodeHandle::new(Arc::new(Bare::default()));
        node.spawn(async { tokio::time::sleep(Duration::from_secs(3600)).await });
        let (token, clone) = (node.shutdown_token(), node.clone());
        clone.spawn(async move { token.cancelled().await });
        let t0 = std::time::Instant::now();
        assert_eq!(node.drain(Duration::from_millis(100)).await, 1);
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
