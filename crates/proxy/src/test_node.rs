//! A node for the proxy's unit tests: a catalog of one on loopback, a data dir of its own,
//! the proxy's listeners on ephemeral loopback ports, and machine starts counted (and
//! refused) instead of done.

use bazaar_catalog::{Catalog, CatalogConfig, MachineRecord, SecretRecord, ServiceRecord};
use bazaar_node::{
    AuditEntry, Caller, HostLink, Node, NodeConfig, NodeError, NodeFuture, NodeHandle,
};
use bazaar_types::config::{MachineConfig, MachinePort, MachineService};
use bazaar_types::host::Resources;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// See the module doc.
#[derive(Debug)]
pub(crate) struct TestNode {
    config: NodeConfig,
    pub catalog: Catalog,
    shutdown: CancellationToken,
    /// Calls of [`Node::start_machine`].
    pub starts: AtomicUsize,
    _dir: tempfile::TempDir,
}

impl TestNode {
    /// A node whose catalog runs; its handle, and the node to read counters from.
    pub async fn start() -> (NodeHandle, Arc<TestNode>) {
        let dir = tempfile::Builder::new()
            .prefix("bazaar-proxy-test-")
            .tempdir()
            .expect("a temporary dir");
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let catalog = Catalog::start(CatalogConfig::new("h_test", "local", loopback, "secret"))
            .await
            .expect("a catalog");
        let config = NodeConfig {
            region: "local".into(),
            data_dir: dir.path().to_path_buf(),
            replace_after: Duration::from_secs(60),
            proxy_listen: loopback,
            proxy_tls_listen: loopback,
            proxy_hop_listen: None,
            proxy_domain: "test".into(),
            proxy_queue_timeout: Duration::from_secs(2),
            bid_deadline: Duration::from_millis(250),
            autostop_idle: Duration::from_secs(600),
            acme_directory: None,
            acme_ca: None,
        };
        let node = Arc::new(TestNode {
            config,
            catalog,
            shutdown: CancellationToken::new(),
            starts: AtomicUsize::new(0),
            _dir: dir,
        });
        (NodeHandle::new(node.clone()), node)
    }

    /// Publishes this host's machine `id` of app `web` in `state`, its `service` listening
    /// at `addr`.
    pub fn publish_machine(
        &self,
        id: &str,
        state: &str,
        service: MachineService,
        addr: SocketAddr,
    ) {
        self.catalog.publish_machine(MachineRecord {
            id: id.into(),
            app: "web".into(),
            name: id.into(),
            region: "local".into(),
            state: state.into(),
            services: vec![ServiceRecord {
                service,
                address: addr.ip().to_string(),
                port: addr.port(),
            }],
            ..Default::default()
        });
    }
}

/// A service with HTTP on port 80.
pub(crate) fn http_service(autostart: bool) -> MachineService {
    service(80, &["http"], autostart)
}

/// A raw TCP service on public port `port`.
pub(crate) fn tcp_service(port: u16) -> MachineService {
    service(port, &[], false)
}

fn service(port: u16, handlers: &[&str], autostart: bool) -> MachineService {
    MachineService {
        protocol: "tcp".into(),
        internal_port: 8080,
        ports: vec![MachinePort {
            port: Some(port),
            handlers: handlers.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        }],
        autostart: Some(autostart),
        ..Default::default()
    }
}

/// A loopback address nothing listens on (a port just freed).
pub(crate) fn unused_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("an ephemeral port");
    l.local_addr().expect("its address")
}

impl Node for TestNode {
    fn host_id(&self) -> &str {
        self.catalog.node_id()
    }
    fn config(&self) -> &NodeConfig {
        &self.config
    }
    fn catalog(&self) -> Option<&Catalog> {
        Some(&self.catalog)
    }
    fn cluster_secret(&self) -> &str {
        "secret"
    }
    fn host_link(&self) -> Option<&HostLink> {
        None
    }
    fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
    fn caller(&self, _: &str) -> Result<Caller, bazaar_auth::Denied> {
        Err(bazaar_auth::Denied::Invalid("a test node".into()))
    }
    fn record_audit(&self, _: &AuditEntry) {}
    fn validate_config(&self, _: &MachineConfig) -> Result<Resources, NodeError> {
        Err(NodeError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "a test node",
        ))
    }
    fn app_secrets(&self, _: &str) -> Vec<SecretRecord> {
        Vec::new()
    }
    fn set_app_secrets(
        &self,
        _: &str,
        _: &[(String, Option<String>)],
    ) -> Result<Vec<SecretRecord>, bazaar_node::secrets::SecretError> {
        Err(bazaar_node::secrets::SecretError::NoCatalog)
    }
    fn secrets_version_header(&self, _: &str) -> Option<String> {
        None
    }
    fn start_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Err(NodeError::new(
                axum::http::StatusCode::CONFLICT,
                format!("a test node starts no machine ({id})"),
            ))
        })
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
