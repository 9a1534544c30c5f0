//! `/v1/platform`: the regions the catalog knows, and placement dry runs (where N machines
//! of a size would go, asked of the hosts for real, with every reservation released).

use crate::error::ApiError;
use crate::exchange::Order;
use crate::openapi::{op, Body};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::State;
use axum::Json;
use bazaar_placement::exchange::PlacementRecord;
use bazaar_types::api::{PlacementsRequest, PlacementsResponse, Region, RegionCount, RegionList};
use bazaar_types::guest::Guest;
use bazaar_types::host::ClaimRequest;
use bazaar_types::region::RegionInfo;
use std::collections::BTreeMap;

/// `GET /v1/platform/regions`: every region of the catalog's hosts, with what its agents
/// say of it (`[region_info]` in their config, published as host labels; the host with the
/// smallest id that says a field wins, so every node answers alike).
pub async fn regions(State(api): State<Api>) -> Result<Json<RegionList>, ApiError> {
    let (mut cands, _) = api.market_view()?;
    cands.sort_by(|a, b| a.host_id.cmp(&b.host_id));
    let mut by_region: BTreeMap<String, (usize, u64, u64, RegionInfo)> = BTreeMap::new();
    for c in &cands {
        let e = by_region.entry(c.region.clone()).or_default();
        if c.alive {
            e.0 += 1;
            e.1 += c.free.memory_mb;
            e.2 += c.capacity.memory_mb;
        }
        e.3 = std::mem::take(&mut e.3).or(RegionInfo::from_labels(&c.labels));
    }
    let regions = by_region
        .into_iter()
        .map(|(code, (hosts, free, cap, info))| Region {
            name: info.name.unwrap_or_else(|| code.clone()),
            code,
            gateway_available: info.gateway.unwrap_or(true),
            requires_paid_plan: false,
            deprecated: false,
            latitude: info.latitude,
            longitude: info.longitude,
            geo_region: info.geo_region,
            hosts: hosts as u64,
            free_memory_mb: free,
            capacity_memory_mb: cap,
        })
        .collect();
    Ok(Json(RegionList {
        regions,
        nearest: api.0.node.config().region.clone(),
    }))
}

pub(crate) fn regions_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "PlatformRegions",
        "platform",
        "The regions of the cluster's hosts.",
        &[401, 503],
    )
}

/// `POST /v1/platform/placements`: a dry run of the market.
pub async fn placements(
    State(api): State<Api>,
    Body(req): Body<PlacementsRequest>,
) -> Result<Json<PlacementsResponse<PlacementRecord>>, ApiError> {
    let guest = match (req.compute, req.size) {
        (Some(g), _) => {
            bazaar_types::config_fields::check_guest(&g, "compute")
                .map_err(ApiError::BadRequest)?;
            g
        }
        (None, Some(s)) => Guest::preset(&s).map_err(ApiError::BadRequest)?,
        (None, None) => Guest::default(),
    };
    let size = guest.validate().map_err(ApiError::BadRequest)?;
    if let Some(p) = &req.placement {
        p.validate().map_err(ApiError::BadRequest)?;
    }
    let count = req.count.unwrap_or(1).clamp(1, 1000);
    let local = api.0.node.config().region.clone();
    let regions = req.region.unwrap_or_else(|| format!("{local},any"));
    let app = req.app.unwrap_or_default();
    let order = Order {
        app: app.clone(),
        template: ClaimRequest {
            app,
            app_id: String::new(),
            name: None,
            region: None,
            config: bazaar_types::config::MachineConfig {
                placement: req.placement,
                ..Default::default()
            },
            skip_launch: true,
            machine_id: None,
            lease_ttl: None,
            skip_service_registration: false,
            placement: None,
            epoch: 0,
            displaced_from: None,
        },
        size: size.into(),
        count,
        regions,
        dry_run: true,
        pinned_host: None,
        avoid_host: None,
    };
    let placed = api.place(order).await?;
    let (cands, _) = api.market_view()?;
    let region_of: BTreeMap<&str, &str> = cands
        .iter()
        .map(|c| (c.host_id.as_str(), c.region.as_str()))
        .collect();
    let mut per_region: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_host: BTreeMap<String, u64> = BTreeMap::new();
    for h in &placed.record.winners {
        *per_region
            .entry(region_of.get(h.as_str()).unwrap_or(&"?").to_string())
            .or_default() += 1;
        *per_host.entry(h.clone()).or_default() += 1;
    }
    let regions = per_region
        .into_iter()
        .map(|(region, count)| RegionCount {
            region,
            count,
            concurrency: count,
        })
        .collect();
    Ok(Json(PlacementsResponse {
        regions,
        hosts: per_host,
        placement: placed.record,
    }))
}

pub(crate) fn placements_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "PlatformPlacements",
        "platform",
        "Where machines of a size would go: the market is asked for real and every \
         reservation released.",
        &[400, 401, 409, 422, 503],
    )
}
