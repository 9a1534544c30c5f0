//! The Machines API calls deploys make (list, batch create, update, destroy, stop, wait,
//! leases, cordon, versions, metadata), as flyctl makes them, over the shared typed client
//! ([`bazaar_client::FlyClient`]); errors are its [`ApiError`] (status and message).

use bazaar_client::fly::FlyClient;
pub use bazaar_client::ApiError;
use bazaar_types::api::{CreateMachineRequest, UpdateMachineRequest};
use bazaar_types::config::MachineConfig;
use bazaar_types::machine::Machine;
use reqwest::Method;
use serde_json::Value;
use std::time::Duration;

/// A Machines API endpoint and token.
#[derive(Debug, Clone)]
pub struct Client {
    fly: FlyClient,
}

impl Client {
    /// A client of `base` (e.g. `http://127.0.0.1:4280`) with a bearer token.
    pub fn new(base: &str, token: &str) -> Client {
        Client::of(FlyClient::new(base, token))
    }

    /// Deploys through `fly` (a client the caller set up, e.g. trusting a cluster CA).
    pub fn of(fly: FlyClient) -> Client {
        Client { fly }
    }

    /// The typed client underneath.
    pub fn fly(&self) -> &FlyClient {
        &self.fly
    }

    /// One call; `nonce` is sent as `fly-machine-lease-nonce`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        nonce: Option<&str>,
    ) -> anyhow::Result<Value> {
        Ok(self.fly.call(method, path, body.as_ref(), nonce).await?)
    }

    /// The app exists (or not).
    pub async fn app_exists(&self, app: &str) -> anyhow::Result<bool> {
        Ok(self.fly.app_exists(app).await?)
    }

    /// Creates an app.
    pub async fn create_app(&self, app: &str) -> anyhow::Result<()> {
        self.fly.create_app(app, "personal").await?;
        Ok(())
    }

    /// The app's machines, destroyed ones excluded.
    pub async fn machines(&self, app: &str) -> anyhow::Result<Vec<Machine>> {
        Ok(self.fly.machines(app).await?)
    }

    /// One machine.
    pub async fn machine(&self, app: &str, id: &str) -> anyhow::Result<Machine> {
        Ok(self.fly.machine(app, id).await?)
    }

    /// The requests and connections a machine is serving right now (its host's proxy
    /// counts them).
    pub async fn in_flight(&self, app: &str, id: &str) -> anyhow::Result<u64> {
        Ok(self.fly.traffic(app, id).await?.in_flight.into())
    }

    /// Creates up to `count` machines of one config in `region` (batch placement), each
    /// leased; a batch may place fewer than asked (the caller asks again for the rest).
    pub async fn create(
        &self,
        app: &str,
        config: &MachineConfig,
        region: &str,
        count: usize,
        cordoned: bool,
        lease_ttl: u64,
    ) -> anyhow::Result<Vec<Machine>> {
        let req = CreateMachineRequest {
            config: config.clone(),
            region: Some(region.to_string()),
            count: Some(count),
            skip_service_registration: cordoned,
            lease_ttl: Some(lease_ttl),
            ..Default::default()
        };
        Ok(self.fly.create_machines(app, &req).await?.machines)
    }

    /// Replaces a machine's config: it restarts with it, or with `skip_launch` stays
    /// stopped.
    pub async fn update(
        &self,
        app: &str,
        id: &str,
        config: &MachineConfig,
        skip_launch: bool,
        nonce: Option<&str>,
    ) -> anyhow::Result<Machine> {
        let req = UpdateMachineRequest {
            config: config.clone(),
            skip_launch,
        };
        Ok(self.fly.update_machine(app, id, &req, nonce).await?)
    }

    /// A POST to a machine's sub-resource (`start`, `stop`, `cordon`, ...).
    pub async fn action(
        &self,
        app: &str,
        id: &str,
        action: &str,
        body: Option<Value>,
        nonce: Option<&str>,
    ) -> anyhow::Result<Value> {
        Ok(self
            .fly
            .action(app, id, action, body.as_ref(), nonce)
            .await?)
    }

    /// Destroys a machine that is not running (a running one is refused: 412).
    pub async fn destroy(&self, app: &str, id: &str, nonce: Option<&str>) -> anyhow::Result<()> {
        self.fly.destroy_machine(app, id, false, nonce).await?;
        Ok(())
    }

    /// Waits (server side, ≤ 60 s per call) for a state, optionally of a version.
    pub async fn wait(
        &self,
        app: &str,
        id: &str,
        state: &str,
        version: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        self.fly.wait(app, id, state, version, timeout).await?;
        Ok(())
    }

    /// A machine's config versions, newest first: (version, config).
    pub async fn versions(
        &self,
        app: &str,
        id: &str,
    ) -> anyhow::Result<Vec<(String, MachineConfig)>> {
        let versions = self.fly.versions(app, id).await?;
        Ok(versions
            .into_iter()
            .map(|v| (v.version, v.user_config))
            .collect())
    }
}

/// The HTTP status of an API error, if it is one.
pub fn status_of(e: &anyhow::Error) -> Option<u16> {
    e.downcast_ref::<ApiError>().and_then(ApiError::status)
}
