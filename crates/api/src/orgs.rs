//! `/v1/orgs/{org}/...`: an organization's machines and volumes across all its apps, from
//! this node's catalog (no host is asked), filtered by what the caller's token may read.
//!
//! The machine list follows Fly's: sorted by `updated_at` (then id), a point-in-time page of
//! at most `limit` machines, `next_cursor` to ask for the next page, and `updated_after`
//! to poll for changes (ask again from the `last_updated_at` of the previous answer: Fly's
//! clients overlap their polls, so a machine updated in the same second is answered again).

use crate::error::ApiError;
use crate::openapi::op;
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, Query, State};
use axum::Json;
use bazaar_node::Caller;
use bazaar_types::api::OrgMachineList;
use bazaar_types::volume::Volume;
use serde::Deserialize;
use std::collections::BTreeSet;

/// The most machines one page answers (and the default).
pub const MAX_PAGE: usize = 500;

/// The query of `GET /v1/orgs/{org}/machines`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[schemars(inline)]
pub struct OrgMachinesQuery {
    /// Include destroyed machines (while the catalog keeps their tombstones).
    #[serde(default)]
    include_deleted: Option<bool>,
    /// Only machines in this region.
    #[serde(default)]
    region: Option<String>,
    /// Only machines updated after this instant (RFC 3339).
    #[serde(default)]
    #[schemars(extend("format" = "date-time"))]
    updated_after: Option<String>,
    /// The most machines to answer (1 to 500, default 500).
    #[serde(default)]
    #[schemars(range(min = 1, max = 500))]
    limit: Option<usize>,
    /// Where the previous page ended (its `next_cursor`: `<unix ms>.<machine id>`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[0-9]{1,19}\.[a-z0-9]{1,64}$"))]
    cursor: Option<String>,
}

/// The apps of `org` that the caller may read.
fn readable_apps(
    api: &Api,
    caller: Option<&Caller>,
    org: &str,
) -> Result<BTreeSet<String>, ApiError> {
    bazaar_types::ids::validate_name("organization", org).map_err(ApiError::BadRequest)?;
    Ok(api
        .catalog()?
        .apps()
        .into_iter()
        .filter(|a| a.org_slug == org)
        .filter(|a| crate::access::may_read(caller, &a.name))
        .map(|a| a.name)
        .collect())
}

/// Unix ms of an RFC 3339 instant, or a 400 naming the parameter.
fn parse_instant(param: &str, text: &str) -> Result<u64, ApiError> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            ApiError::BadRequest(format!(
                "{param}: {text:?} is not an RFC 3339 instant ({e})"
            ))
        })?;
    Ok(u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
}

/// A page's position: the `updated_at` (unix ms) and id of its last machine.
fn parse_cursor(text: &str) -> Result<(u64, String), ApiError> {
    text.split_once('.')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id.to_string())))
        .filter(|(_, id)| bazaar_types::ids::is_valid_machine_id(id))
        .ok_or_else(|| ApiError::BadRequest(format!("cursor {text:?} is not one this API gave")))
}

/// `GET /v1/orgs/{org}/machines`.
pub async fn machines(
    State(api): State<Api>,
    caller: Option<axum::Extension<Caller>>,
    Path(org): Path<String>,
    Query(q): Query<OrgMachinesQuery>,
) -> Result<Json<OrgMachineList>, ApiError> {
    let apps = readable_apps(&api, caller.as_ref().map(|c| &c.0), &org)?;
    let limit = match q.limit {
        None => MAX_PAGE,
        Some(n) if (1..=MAX_PAGE).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::BadRequest(format!(
                "limit {n} is outside 1..={MAX_PAGE}"
            )))
        }
    };
    let after = q
        .updated_after
        .as_deref()
        .map(|t| parse_instant("updated_after", t))
        .transpose()?;
    let cursor = q.cursor.as_deref().map(parse_cursor).transpose()?;
    let filter = bazaar_catalog::MachineFilter {
        region: q.region.clone(),
        include_deleted: q.include_deleted.unwrap_or(false),
        ..Default::default()
    };
    let catalog = api.catalog()?;
    // A machine of an app that lost its name (a partition) is not of the app of its name,
    // nor in that app's organization.
    let losing = catalog.losing_app_ids();
    let mut rows: Vec<_> = catalog
        .machines(&filter)
        .into_iter()
        .filter(|m| apps.contains(&m.record.app) && !losing.contains(&m.record.app_id))
        .filter(|m| after.is_none_or(|t| m.record.updated_at_ms > t))
        .filter(|m| {
            cursor.as_ref().is_none_or(|(ms, id)| {
                (m.record.updated_at_ms, m.record.id.as_str()) > (*ms, id.as_str())
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        (a.record.updated_at_ms, &a.record.id).cmp(&(b.record.updated_at_ms, &b.record.id))
    });
    let more = rows.len() > limit;
    rows.truncate(limit);
    let last = rows.last();
    Ok(Json(OrgMachineList {
        next_cursor: last
            .filter(|_| more)
            .map(|m| format!("{}.{}", m.record.updated_at_ms, m.record.id)),
        last_machine_id: last.map(|m| m.record.id.clone()),
        last_updated_at: last.map(|m| bazaar_types::rfc3339(m.record.updated_at_ms)),
        machines: rows.iter().map(crate::machines::from_catalog).collect(),
        error_regions: Vec::new(),
    }))
}

pub(crate) fn machines_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "OrgMachinesList",
        "machines",
        "List an organization's machines across its apps (from the cluster catalog), \
         oldest update first, at most `limit` a page.",
        &[400, 401, 503],
    )
}

/// `GET /v1/orgs/{org}/volumes`.
pub async fn volumes(
    State(api): State<Api>,
    caller: Option<axum::Extension<Caller>>,
    Path(org): Path<String>,
) -> Result<Json<Vec<Volume>>, ApiError> {
    let apps = readable_apps(&api, caller.as_ref().map(|c| &c.0), &org)?;
    let mut out: Vec<Volume> = api
        .catalog()?
        .volumes(None)
        .iter()
        .filter(|v| apps.contains(&v.record.app))
        .map(crate::volumes::from_catalog)
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Json(out))
}

pub(crate) fn volumes_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "OrgVolumesList",
        "volumes",
        "List an organization's volumes across its apps (from the cluster catalog).",
        &[400, 401, 503],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_a_made_up_one_is_refused() {
        let (ms, id) = parse_cursor("1700000000000.e286543c4d1e86").unwrap();
        assert_eq!((ms, id.as_str()), (1_700_000_000_000, "e286543c4d1e86"));
        for bad in ["", "12", "x.e286543c4d1e86", "12.../etc"] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn instants_parse_as_rfc3339_or_are_refused_by_name() {
        assert_eq!(
            parse_instant("updated_after", "2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        let err = parse_instant("updated_after", "yesterday").unwrap_err();
        assert!(format!("{err:?}").contains("updated_after"));
    }
}
