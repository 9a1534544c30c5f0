//! `/v1/catalog` (bazaar extension): the cluster catalog as this node sees it: hosts,
//! machines and a digest (equal digests, same rows), and the one change another node asks
//! of a row's owner: `DELETE /v1/catalog/apps/{app}`, an app delete handed to the node that
//! wrote the app's record (`app_delete.rs`). The cluster secret only (operators and other
//! nodes; an API token gets 403): the router puts
//! `bazaar_node::access::require_cluster_secret` in front.

use crate::error::ApiError;
use crate::openapi::op;
use crate::Api;
use aide::axum::routing::{delete_with, get_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::{Query, State};
use axum::Json;
use bazaar_types::api::{CatalogCheck, CatalogDigest, CatalogHost, CatalogMachine, CatalogService};
use serde::Deserialize;

/// The catalog's routes (without the cluster secret check, which the router adds).
pub(crate) fn routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route("/v1/catalog/hosts", get_with(hosts, hosts_docs))
        .api_route("/v1/catalog/machines", get_with(machines, machines_docs))
        .api_route("/v1/catalog/digest", get_with(digest, digest_docs))
        .api_route(
            "/v1/catalog/apps/{app}",
            delete_with(crate::app_delete::destroy, delete_app_docs),
        )
}

fn delete_app_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CatalogAppsDelete",
        "catalog",
        "bazaar extension: `DELETE /v1/apps/{app}` as another node hands it to the node that \
         wrote the app's record (all or nothing, as that call). Cluster secret or a host \
         certificate only: the Machines API refuses the cluster secret.",
        &[401, 403, 404, 409, 503],
    )
}

/// Errors of every catalog call.
const ERRORS: &[u16] = &[401, 403, 503];

/// A host as the catalog view shows it.
pub fn host(h: &bazaar_catalog::HostView) -> CatalogHost {
    CatalogHost {
        id: h.record.id.clone(),
        region: h.record.region.clone(),
        status: h.status.as_str().to_string(),
        api_addr: h.record.api_addr.clone(),
        gossip_addr: h.record.gossip_addr.clone(),
        capacity: h.record.capacity,
        free: h.record.free,
        num_machines: h.record.num_machines,
        draining: h.record.draining,
        labels: h.record.labels.clone(),
        updated_at: bazaar_types::rfc3339(h.record.updated_at_ms),
        version: h.version,
    }
}

/// A machine as the catalog view shows it.
pub fn machine(m: &bazaar_catalog::MachineView) -> CatalogMachine {
    let r = &m.record;
    CatalogMachine {
        id: r.id.clone(),
        app: r.app.clone(),
        name: r.name.clone(),
        region: r.region.clone(),
        host_id: r.host_id.clone(),
        host_status: m.host_status.to_string(),
        state: if m.deleted {
            "destroyed".into()
        } else {
            r.state.clone()
        },
        instance_id: r.instance_id.clone(),
        services: r
            .services
            .iter()
            .map(|s| CatalogService {
                internal_port: s.service.internal_port,
                protocol: s.service.protocol.clone(),
                address: s.address.clone(),
                port: s.port,
            })
            .collect(),
        checks: checks(&r.checks),
        cordoned: r.cordoned,
        metadata: r.metadata.clone(),
        updated_at: bazaar_types::rfc3339(r.updated_at_ms),
        deleted: m.deleted,
        version: m.version,
        epoch: r.epoch,
    }
}

/// The checks of a catalog row, as the API shows them.
pub(crate) fn checks(checks: &[bazaar_catalog::CheckRecord]) -> Vec<CatalogCheck> {
    checks
        .iter()
        .map(|c| CatalogCheck {
            name: c.name.clone(),
            status: c.status.clone(),
            output: c.output.clone(),
            updated_at_ms: c.updated_at_ms,
        })
        .collect()
}

/// `GET /v1/catalog/hosts`, by region then id.
async fn hosts(State(api): State<Api>) -> Result<Json<Vec<CatalogHost>>, ApiError> {
    let mut hosts = api.catalog()?.hosts();
    hosts.sort_by(|a, b| (&a.record.region, &a.record.id).cmp(&(&b.record.region, &b.record.id)));
    Ok(Json(hosts.iter().map(host).collect()))
}

fn hosts_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CatalogHosts",
        "catalog",
        "bazaar extension: the hosts this node's catalog knows. Cluster secret only (operators, other nodes).",
        ERRORS,
    )
}

/// The filters of `GET /v1/catalog/machines`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(inline)]
struct MachinesQuery {
    /// Only machines of this app.
    app: Option<String>,
    /// Only machines in this region.
    region: Option<String>,
    /// Only machines in these states (comma-separated).
    state: Option<String>,
    /// Include tombstones.
    #[serde(default)]
    include_deleted: bool,
}

/// `GET /v1/catalog/machines`, by app then id.
async fn machines(
    State(api): State<Api>,
    Query(q): Query<MachinesQuery>,
) -> Result<Json<Vec<CatalogMachine>>, ApiError> {
    let filter = bazaar_catalog::MachineFilter {
        app: q.app,
        region: q.region,
        states: q
            .state
            .map(|s| {
                s.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
        include_deleted: q.include_deleted,
    };
    let mut machines = api.catalog()?.machines(&filter);
    machines.sort_by(|a, b| (&a.record.app, &a.record.id).cmp(&(&b.record.app, &b.record.id)));
    Ok(Json(machines.iter().map(machine).collect()))
}

fn machines_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CatalogMachines",
        "catalog",
        "bazaar extension: the machines this node's catalog knows. Cluster secret only (operators, other nodes).",
        ERRORS,
    )
}

/// `GET /v1/catalog/digest`.
async fn digest(State(api): State<Api>) -> Result<Json<CatalogDigest>, ApiError> {
    let c = api.catalog()?;
    Ok(Json(CatalogDigest {
        digest: c.digest(),
        node_id: c.node_id().to_string(),
    }))
}

fn digest_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CatalogDigest",
        "catalog",
        "bazaar extension: a digest of this node's catalog (equal digests, same rows). Cluster secret only (operators, other nodes).",
        ERRORS,
    )
}
