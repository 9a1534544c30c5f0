//! What an operator says of a region beyond its code (its name, where it is, whether it
//! has a gateway), as `GET /v1/platform/regions` answers it. Each agent takes it from its
//! config file (`[region_info]`) and publishes it in its host row's labels, so every node
//! can answer for every region without a central store: [`RegionInfo::to_labels`] and
//! [`RegionInfo::from_labels`] are the one encoding.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The host label carrying a region's display name.
pub const LABEL_NAME: &str = "region_name";
/// The host label carrying a region's latitude (decimal degrees).
pub const LABEL_LATITUDE: &str = "region_latitude";
/// The host label carrying a region's longitude (decimal degrees).
pub const LABEL_LONGITUDE: &str = "region_longitude";
/// The host label carrying a region's wider geographic area (`eu`, `na`, ...).
pub const LABEL_GEO_REGION: &str = "region_geo";
/// The host label saying whether the region has a gateway (`true`/`false`).
pub const LABEL_GATEWAY: &str = "region_gateway";

/// An operator's description of the region a host is in (all optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RegionInfo {
    /// A display name, e.g. `Amsterdam, Netherlands`.
    pub name: Option<String>,
    /// Latitude in decimal degrees (-90 to 90).
    pub latitude: Option<f64>,
    /// Longitude in decimal degrees (-180 to 180).
    pub longitude: Option<f64>,
    /// The wider area the region belongs to, e.g. `eu` or `na`.
    pub geo_region: Option<String>,
    /// Whether the region has a gateway (WireGuard peering for operators).
    pub gateway: Option<bool>,
}

impl RegionInfo {
    /// Checks the values an operator wrote, naming the one that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(lat) = self.latitude {
            if !(-90.0..=90.0).contains(&lat) {
                return Err(format!(
                    "region_info.latitude {lat} is outside -90..=90 degrees"
                ));
            }
        }
        if let Some(lon) = self.longitude {
            if !(-180.0..=180.0).contains(&lon) {
                return Err(format!(
                    "region_info.longitude {lon} is outside -180..=180 degrees"
                ));
            }
        }
        for (field, value) in [("name", &self.name), ("geo_region", &self.geo_region)] {
            if let Some(v) = value {
                if v.is_empty() || v.len() > 64 || v.chars().any(char::is_control) {
                    return Err(format!(
                        "region_info.{field} must be 1 to 64 printable characters"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The host labels that carry this description (only the fields given).
    pub fn to_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                labels.insert(key.to_string(), v);
            }
        };
        put(LABEL_NAME, self.name.clone());
        put(LABEL_LATITUDE, self.latitude.map(|v| v.to_string()));
        put(LABEL_LONGITUDE, self.longitude.map(|v| v.to_string()));
        put(LABEL_GEO_REGION, self.geo_region.clone());
        put(LABEL_GATEWAY, self.gateway.map(|v| v.to_string()));
        labels
    }

    /// The description a host row's labels carry (a label that does not parse is left
    /// out, as if not given).
    pub fn from_labels(labels: &BTreeMap<String, String>) -> RegionInfo {
        RegionInfo {
            name: labels.get(LABEL_NAME).cloned(),
            latitude: labels.get(LABEL_LATITUDE).and_then(|v| v.parse().ok()),
            longitude: labels.get(LABEL_LONGITUDE).and_then(|v| v.parse().ok()),
            geo_region: labels.get(LABEL_GEO_REGION).cloned(),
            gateway: labels.get(LABEL_GATEWAY).and_then(|v| v.parse().ok()),
        }
    }

    /// This description with the fields it lacks taken from `other` (hosts of one region
    /// may each say part of it; the first host to say a field wins).
    pub fn or(self, other: RegionInfo) -> RegionInfo {
        RegionInfo {
            name: self.name.or(other.name),
            latitude: self.latitude.or(other.latitude),
            longitude: self.longitude.or(other.longitude),
            geo_region: self.geo_region.or(other.geo_region),
            gateway: self.gateway.or(other.gateway),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_carry_every_field_and_back() {
        let info = RegionInfo {
            name: Some("Amsterdam, Netherlands".into()),
            latitude: Some(52.374),
            longitude: Some(4.8897),
            geo_region: Some("eu".into()),
            gateway: Some(true),
        };
        let labels = info.to_labels();
        assert_eq!(labels[LABEL_LATITUDE], "52.374");
        assert_eq!(RegionInfo::from_labels(&labels), info);
        assert!(RegionInfo::default().to_labels().is_empty());
    }

    #[test]
    fn out_of_range_coordinates_are_refused_by_name() {
        let bad = RegionInfo {
            latitude: Some(91.0),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("latitude"));
        let bad = RegionInfo {
            longitude: Some(-180.5),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("longitude"));
        let bad = RegionInfo {
            geo_region: Some(String::new()),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("geo_region"));
        assert!(RegionInfo::default().validate().is_ok());
    }

    #[test]
    fn a_later_host_fills_only_what_the_first_left_out() {
        let first = RegionInfo {
            name: Some("Paris".into()),
            ..Default::default()
        };
        let second = RegionInfo {
            name: Some("Other".into()),
            latitude: Some(48.85),
            ..Default::default()
        };
        let merged = first.or(second);
        assert_eq!(merged.name.as_deref(), Some("Paris"));
        assert_eq!(merged.latitude, Some(48.85));
    }

    #[test]
    fn a_label_that_does_not_parse_is_left_out() {
        let labels = BTreeMap::from([(LABEL_LATITUDE.to_string(), "north".to_string())]);
        assert_eq!(RegionInfo::from_labels(&labels).latitude, None);
    }
}
