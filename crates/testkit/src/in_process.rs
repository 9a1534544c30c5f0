//! An agent started inside the test's own process, its catalog on loopback, for router
//! tests: a test hands the agent's routers (the host interface, the Machines API) requests
//! with `tower::ServiceExt::oneshot` and reads the answers, with no HTTP server between.
//! It runs without isolation (nothing is made on the host outside its temporary data dir),
//! takes the cluster secret [`crate::TEST_SECRET`] on its host interface and scoped tokens of
//! the test key ([`crate::tokens`], [`crate::api_token`]) on the Machines API. [`oneshot`]
//! sends a request. The Machines API forwards machine calls
//! to the owner's host interface over HTTP: [`InProcessAgent::serve`] serves it on the
//! loopback address the agent publishes, so those calls reach this same agent.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bazaar_agent::{Agent, AgentConfig};
use bazaar_catalog::{Catalog, CatalogConfig};
use serde_json::Value;
use std::net::SocketAddr;
use tower::ServiceExt;

/// A running in-process agent; [`InProcessAgent::stop`] ends it.
#[derive(Debug)]
pub struct InProcessAgent {
    pub agent: Agent,
    pub catalog: Catalog,
    /// The agent's API address, bound at start and served by [`InProcessAgent::serve`].
    listener: Option<tokio::net::TcpListener>,
    server: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl InProcessAgent {
    /// Starts the agent and its catalog (a cluster of one) and attaches them.
    pub async fn start() -> anyhow::Result<InProcessAgent> {
        Self::start_with(|_| {}).await
    }

    /// [`InProcessAgent::start`] with the agent's config changed by `configure` first
    /// (host labels, capacity).
    pub async fn start_with(
        configure: impl FnOnce(&mut AgentConfig),
    ) -> anyhow::Result<InProcessAgent> {
        Self::start_member(Vec::new(), bazaar_agent::Seams::default(), configure).await
    }

    /// [`InProcessAgent::start_with`] as a member of a cluster: its catalog joins through
    /// `seeds` (another in-process agent's [`Catalog::local_addr`]), and its machines run
    /// with `seams` (the test kit's fake driver: [`crate::fake_driver::FakeDriver`]).
    pub async fn start_member(
        seeds: Vec<SocketAddr>,
        seams: bazaar_agent::Seams,
        configure: impl FnOnce(&mut AgentConfig),
    ) -> anyhow::Result<InProcessAgent> {
        let dir = tempfile::Builder::new()
            .prefix("bazaar-inproc-")
            .tempdir()?;
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = tokio::net::TcpListener::bind(loopback).await?;
        let config = AgentConfig {
            data_dir: dir.path().join("data"),
            api_listen: listener.local_addr()?,
            token_public_key: Some(crate::tokens::public_key_hex()),
            gossip_listen: loopback,
            cluster_secret: Some(crate::TEST_SECRET.into()),
            isolate: false,
            cpus: Some(4),
            memory_mb: Some(4096),
            disk_gb: Some(10),
            ..AgentConfig::default()
        };
        let mut config = config;
        configure(&mut config);
        let agent = bazaar_agent::boot::start_in_process(config.clone(), seams).await?;
        let mut catalog_config = CatalogConfig::new(
            agent.host_id(),
            &config.region,
            loopback,
            agent.cluster_secret(),
        );
        catalog_config.seeds = seeds;
        catalog_config.signing_key = bazaar_agent::secrets::host_signing_key(&config.data_dir)?;
        let catalog = Catalog::start(catalog_config).await?;
        bazaar_agent::publish::attach_catalog(&agent, catalog.clone()).await;
        // As `run_agent` does: a copy claimed again on another host is destroyed here.
        bazaar_agent::fence::spawn(&agent);
        Ok(InProcessAgent {
            agent,
            catalog,
            listener: Some(listener),
            server: None,
            _dir: dir,
        })
    }

    /// [`InProcessAgent::start_member`] whose machines run on a new
    /// [`crate::fake_driver::FakeDriver`], returned with it.
    pub async fn start_fake_member(
        seeds: Vec<SocketAddr>,
        configure: impl FnOnce(&mut AgentConfig),
    ) -> anyhow::Result<(
        InProcessAgent,
        std::sync::Arc<crate::fake_driver::FakeDriver>,
    )> {
        let driver = crate::fake_driver::FakeDriver::new();
        let seams = bazaar_agent::Seams {
            driver: Some(driver.clone()),
            ..bazaar_agent::Seams::default()
        };
        Ok((Self::start_member(seeds, seams, configure).await?, driver))
    }

    /// The agent as the node the services beside it (the API, the dashboard) are given,
    /// as the composition root hands it to them (`bazaar_agent::node::handle`).
    pub fn node(&self) -> bazaar_node::NodeHandle {
        bazaar_agent::node::handle(&self.agent)
    }

    /// The host interface (`/host/v1`) as `run_agent` serves it.
    pub fn host_router(&self) -> axum::Router {
        bazaar_agent::http::router(self.agent.clone()).layer(axum::middleware::map_response(
            bazaar_agent::http::fly_shaped_errors,
        ))
    }

    /// Serves the host interface and `extra` (the Machines API) on the agent's API address,
    /// as `run_agent` does, until [`InProcessAgent::stop`]. Once only.
    pub fn serve(&mut self, extra: axum::Router) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let app = self.host_router().merge(extra);
        self.server = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    /// Stops the agent and its catalog.
    pub async fn stop(self) {
        if let Some(server) = &self.server {
            server.abort();
        }
        self.catalog.kill().await;
        bazaar_agent::boot::shutdown(&self.agent).await;
    }
}

/// Hands `router` one request and answers the status and the body, as JSON when it is
/// (else as a JSON string).
pub async fn send(router: &axum::Router, request: Request<Body>) -> (StatusCode, Value) {
    let resp = match router.clone().oneshot(request).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// Hands `router` one request (`token` as a bearer token, `body` as JSON) and answers the
/// status and the body, as JSON when it is (else as a JSON string).
pub async fn oneshot(
    router: &axum::Router,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let body = match body {
        Some(b) => {
            req = req.header(header::CONTENT_TYPE, "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    send(router, req.body(body).expect("a well-formed request")).await
}
