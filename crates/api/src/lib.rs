//! The Fly Machines API v1, served by every agent (Fly's flaps), and the exchange side of
//! the market. Machine-level calls are answered by the machine's owning host (this crate
//! forwards them over the host interface); lists come from the local catalog; creates go
//! through the market ([`exchange`]).
//!
//! - [`access`]: who may do what (tokens and their scopes), and the audit record of changes.
//! - [`apps`]: apps (records spread through the catalog); [`app_delete`]: deleting one,
//!   all or nothing; [`app_conflict`]: apps that lost their name to another (a partition).
//! - [`machines`]: create (market), list (catalog), everything else forwarded to the owner.
//! - [`memory`]: a started machine's memory limit changed live, and memory reclaimed.
//! - [`volumes`]: the same for volumes (created through the market for disk).
//! - [`exchange`]: asking hosts for bids, claiming the best, releasing the rest.
//! - [`audit`]: an app's changes, gathered from every host.
//! - [`secrets`]: an app's secrets (sealed catalog rows; values never answered).
//! - [`orgs`]: an organization's machines and volumes across its apps (catalog).
//! - [`quotas`]: quotas per org and app (catalog rows) and the check of creates against them.
//! - [`platform`]: regions and placement dry runs.
//! - [`catalog`]: the cluster catalog as this node sees it (cluster secret only).
//! - [`openapi`]: the document of all of them, derived from the routes and their types.
//! - [`error`]: errors in the Fly shape.
//!
//! Entry point: [`router`].
#![forbid(unsafe_code)]

pub mod access;
pub mod app_conflict;
pub mod app_delete;
pub mod apps;
pub mod audit;
pub mod catalog;
pub mod certificates;
pub mod displaced;
pub mod error;
pub mod exchange;
pub mod guardian;
pub mod machines;
pub mod memory;
pub mod openapi;
pub mod orgs;
pub mod per_host;
pub mod platform;
pub(crate) mod policy;
pub(crate) mod preemption;
pub mod quotas;
pub mod secrets;
pub mod volumes;

use aide::axum::routing::{get_with, post_with, put_with};
use aide::axum::ApiRouter;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::Router;
use bazaar_node::NodeHandle;
use bazaar_placement::exchange::MarketConfig;
use error::ApiError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Shared state of the API on one node.
#[derive(Debug, Clone)]
pub struct Api(pub(crate) Arc<ApiInner>);

#[derive(Debug)]
pub(crate) struct ApiInner {
    pub node: NodeHandle,
    pub http: reqwest::Client,
    pub market: MarketConfig,
    /// Machines this node placed recently → their host, so a read right after a create
    /// works before the catalog has heard of the machine.
    pub recent: Mutex<HashMap<String, String>>,
}

impl Api {
    /// The API of `node`.
    pub fn new(node: NodeHandle) -> Api {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(32)
            // Agents close connections idle for their head timeout (10 s).
            .pool_idle_timeout(std::time::Duration::from_secs(5))
            .connect_timeout(std::time::Duration::from_millis(500))
            .build()
            .unwrap_or_default();
        let market = MarketConfig {
            bid_deadline: node.config().bid_deadline,
            ..MarketConfig::default()
        };
        Api(Arc::new(ApiInner {
            node,
            http,
            market,
            recent: Mutex::new(HashMap::new()),
        }))
    }

    pub(crate) fn catalog(&self) -> Result<&bazaar_catalog::Catalog, ApiError> {
        self.0
            .node
            .catalog()
            .ok_or_else(|| ApiError::Unavailable("the catalog is not running yet".into()))
    }

    /// A request to another node (its host interface or its API): to its host listener over
    /// mTLS when both hosts have cluster certificates ([`bazaar_node::HostLink`]), else
    /// authenticated with the cluster secret. `addr` is the node's API address, `path`
    /// starts with `/`.
    pub(crate) fn to_node(
        &self,
        method: reqwest::Method,
        addr: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        if let Some(link) = self.0.node.host_link() {
            if let Some(url) = link.url_for(addr, path) {
                return link.client.request(method, url);
            }
        }
        self.0
            .http
            .request(method, format!("http://{addr}{path}"))
            .bearer_auth(self.0.node.cluster_secret())
    }

    /// Sends `req` to the host that owns a machine or volume and relays its answer as it is
    /// (status, content type, body streamed). `Ok(Err(why))` when the host could not be
    /// reached, so the caller can answer from the catalog or refuse the change. The owner is
    /// asked even when the failure detector suspects it: a loaded host can be suspected for
    /// a while and still answer.
    pub(crate) async fn relay(
        &self,
        req: reqwest::RequestBuilder,
        host: &exchange::HostAddr,
    ) -> Result<Result<Response, String>, ApiError> {
        let resp = match req.send().await {
            Ok(r) => r,
            Err(err) if err.is_connect() => return Ok(Err(err.to_string())),
            Err(err) => {
                return Err(ApiError::Unavailable(format!(
                    "host {}: {err}",
                    host.host_id
                )))
            }
        };
        let status = axum::http::StatusCode::from_u16(resp.status().as_u16())
            .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        // A 405 names the methods the route takes.
        let allow = resp.headers().get(axum::http::header::ALLOW).cloned();
        let body = axum::body::Body::from_stream(resp.bytes_stream());
        let mut answer = (
            status,
            [(axum::http::header::CONTENT_TYPE, content_type)],
            body,
        )
            .into_response();
        if let Some(allow) = allow {
            answer
                .headers_mut()
                .insert(axum::http::header::ALLOW, allow);
        }
        Ok(Ok(answer))
    }

    pub(crate) fn remember(&self, machine_id: &str, host_id: &str) {
        let mut recent = self.0.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() > 10_000 {
            recent.clear();
        }
        recent.insert(machine_id.to_string(), host_id.to_string());
    }

    /// The address of host `host_id`'s API. A row that a host published can reach this
    /// node before the host's own record does (gossip orders nothing across rows; a missed
    /// broadcast waits for anti-entropy), so an unknown host is waited for a few seconds.
    pub(crate) async fn host_addr(&self, host_id: &str) -> Result<String, ApiError> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            if let Some(h) = self.catalog()?.host(host_id) {
                return Ok(h.record.api_addr);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::Unavailable(format!(
                    "host {host_id} is not known to this node yet; retry"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn recent_host(&self, machine_id: &str) -> Option<String> {
        self.0
            .recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(machine_id)
            .cloned()
    }
}

/// The routes of the Machines API, each registered with its documentation
/// ([`openapi`]): the calls behind the token and scope check ([`access`]), the catalog view
/// (cluster secret only) and `GET /openapi.json` (no token), which answers `doc` once it is
/// set.
struct Routes {
    machines_api: ApiRouter<Api>,
    catalog: ApiRouter<Api>,
    public: ApiRouter<Api>,
}

fn routes(doc: Arc<OnceLock<Arc<str>>>) -> Routes {
    let machines_api = ApiRouter::new()
        .api_route(
            "/v1/apps",
            get_with(apps::list, apps::list_docs).post_with(apps::create, apps::create_docs),
        )
        .api_route(
            "/v1/apps/{app}",
            get_with(apps::get, apps::get_docs)
                .delete_with(app_delete::destroy, app_delete::destroy_docs),
        )
        .api_route(
            "/v1/apps/{app}/machines",
            get_with(machines::list, machines::list_docs)
                .post_with(machines::create, machines::create_docs),
        )
        .api_route(
            "/v1/apps/{app}/machines/batch",
            post_with(machines::create_batch, machines::create_batch_docs),
        )
        .merge(machines::forwarded())
        .merge(memory::routes())
        .api_route(
            "/v1/apps/{app}/volumes",
            get_with(volumes::list, volumes::list_docs)
                .post_with(volumes::create, volumes::create_docs),
        )
        .api_route(
            "/v1/apps/{app}/volumes/{id}",
            get_with(volumes::get, volumes::get_docs)
                .post_with(volumes::update, volumes::update_post_docs)
                .put_with(volumes::update, volumes::update_docs)
                .delete_with(volumes::destroy, volumes::destroy_docs),
        )
        .api_route(
            "/v1/apps/{app}/volumes/{id}/extend",
            put_with(volumes::extend, volumes::extend_docs),
        )
        .api_route(
            "/v1/apps/{app}/volumes/{id}/snapshots",
            get_with(volumes::snapshots, volumes::snapshots_docs)
                .post_with(volumes::snapshot, volumes::snapshot_docs),
        )
        .api_route(
            "/v1/apps/{app}/audit",
            get_with(audit::list, audit::list_docs),
        )
        .api_route(
            "/v1/apps/{app}/secrets",
            get_with(secrets::list, secrets::list_docs)
                .post_with(secrets::update, secrets::update_docs),
        )
        .api_route(
            "/v1/apps/{app}/secrets/{name}",
            get_with(secrets::get, secrets::get_docs)
                .post_with(secrets::set, secrets::set_docs)
                .delete_with(secrets::unset, secrets::unset_docs),
        )
        .api_route(
            "/v1/apps/{app}/certificates",
            get_with(certificates::list, certificates::list_docs)
                .post_with(certificates::add, certificates::add_docs),
        )
        .api_route(
            "/v1/apps/{app}/certificates/acme",
            post_with(certificates::add_acme, certificates::add_acme_docs),
        )
        .api_route(
            "/v1/apps/{app}/certificates/{hostname}",
            get_with(certificates::show, certificates::show_docs)
                .delete_with(certificates::remove, certificates::remove_docs),
        )
        .api_route(
            "/v1/apps/{app}/certificates/{hostname}/check",
            post_with(certificates::check, certificates::check_docs),
        )
        .api_route(
            "/v1/orgs/{org}/machines",
            get_with(orgs::machines, orgs::machines_docs),
        )
        .api_route(
            "/v1/orgs/{org}/volumes",
            get_with(orgs::volumes, orgs::volumes_docs),
        )
        .api_route(
            "/v1/orgs/{org}/quota",
            get_with(quotas::show_org, quotas::show_org_docs)
                .post_with(quotas::set_org, quotas::set_org_docs),
        )
        .api_route(
            "/v1/orgs/{org}/apps/{app}/quota",
            get_with(quotas::show_app, quotas::show_app_docs)
                .post_with(quotas::set_app, quotas::set_app_docs),
        )
        .api_route(
            "/v1/platform/regions",
            get_with(platform::regions, platform::regions_docs),
        )
        .api_route(
            "/v1/platform/placements",
            post_with(platform::placements, platform::placements_docs),
        );
    let public = ApiRouter::new().api_route(
        "/openapi.json",
        get_with(openapi::serve(doc), openapi::serve_docs),
    );
    Routes {
        machines_api,
        catalog: catalog::routes(),
        public,
    }
}

/// The Machines API routes (`/v1/apps/...`, `/v1/platform/...`) behind the token and scope
/// check ([`access`]), the catalog view (`/v1/catalog/...`, cluster secret only) and
/// `GET /openapi.json`, the document of them all.
pub fn router(node: NodeHandle) -> Router {
    let api = Api::new(node.clone());
    let cell = Arc::new(OnceLock::new());
    let (routes, document) = openapi::with_generator(|| {
        let Routes {
            machines_api,
            catalog,
            public,
        } = routes(cell.clone());
        let machines_api = machines_api
            // Inside the token check: a stranger learns nothing of an app's id.
            .layer(middleware::from_fn_with_state(
                api.clone(),
                app_conflict::require_app_id,
            ))
            .layer(middleware::from_fn_with_state(
                node.clone(),
                access::require_access,
            ))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES));
        // `route_layer`: a path no route has (the router's fallback) is a 404 for every
        // caller, not a refusal of the caller's API token.
        let catalog = catalog.route_layer(middleware::from_fn_with_state(
            node.clone(),
            bazaar_node::access::require_cluster_secret,
        ));
        let mut doc = aide::openapi::OpenApi::default();
        let routes = public
            .merge(machines_api)
            .merge(catalog)
            .finish_api(&mut doc)
            .layer(middleware::map_response(fly_shaped_errors));
        (routes, openapi::complete(doc))
    });
    let _ = cell.set(document.to_string().into());
    routes.with_state(api)
}

/// The document of the routes, built without a node (the routes are not served).
pub(crate) fn document_of_routes() -> serde_json::Value {
    openapi::with_generator(|| {
        let Routes {
            machines_api,
            catalog,
            public,
        } = routes(Arc::new(OnceLock::new()));
        let mut doc = aide::openapi::OpenApi::default();
        let _ = public
            .merge(machines_api)
            .merge(catalog)
            .finish_api(&mut doc);
        openapi::complete(doc)
    })
}

/// Largest request body accepted (a machine config is a few KB).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Errors produced by the HTTP stack itself in the Fly shape too: a body too large names the
/// limit, and any other plain answer (a path or query parameter that does not parse, no such
/// route, a wrong method) is wrapped by [`bazaar_node::error::fly_shaped_errors`].
async fn fly_shaped_errors(resp: Response) -> Response {
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if resp.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return ApiError::TooLarge(format!(
            "request body too large: at most {MAX_BODY_BYTES} bytes"
        ))
        .into_response();
    }
    bazaar_node::error::fly_shaped_errors(resp).await
}

/// Parses a JSON object body (empty = `{}`), or a 400 saying what is wrong. Unknown
/// fields are ignored, as Fly does; a key given twice is refused (`bazaar_types::json`).
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    bazaar_types::json::from_body(body).map_err(ApiError::BadRequest)
}
