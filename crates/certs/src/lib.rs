//! Edge certificates per app hostname (Fly's `fly certs`), without a central store.
//!
//! - A certificate is a catalog row ([`bazaar_catalog::CertificateRecord`]) owned by the host
//!   that issued it: the chain in clear, the private key sealed with the cluster's
//!   `certificate-keys` key ([`bazaar_seal`]) bound to
//!   `app/<app>/<app id>/certificate/<hostname>`. Every host's proxy reads the rows and
//!   serves them ([`store::CertStore`]).
//! - A row belongs to an app by its id ([`bazaar_catalog::AppRecord::id`]), not its name:
//!   only rows of a live app count ([`attached`]), so a deleted app's hostnames are served
//!   by nobody, and an app made again under its name (by any organization) starts empty.
//! - Several hosts may hold a row for one hostname (a takeover, a removal made elsewhere):
//!   the row written last is the hostname's certificate ([`current`]), a tombstone included.
//! - Issuance by ACME with the HTTP-01 challenge ([`acme`]): the key authorization is a
//!   catalog row too, answered by every proxy, so validation succeeds whichever host it
//!   reaches.
//! - Renewal ([`manager`]) by the owner at 2/3 of the certificate's life; when the owner is
//!   down (dead or left in the catalog), the live host with the lowest id renews instead
//!   and its row, newer, becomes the certificate.
#![forbid(unsafe_code)]

pub mod acme;
pub mod manager;
pub mod store;

pub use manager::{spawn_renewal, CertInfo, Certs};
pub use store::CertStore;

use bazaar_catalog::{Catalog, CertificateRecord, CertificateView};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::sync::Arc;

/// The sealing purpose of certificate keys.
pub const SEAL_PURPOSE: &str = "certificate-keys";

/// What a sealed certificate key is bound to: the app (its name and id) and the hostname.
/// A row of an app made before apps had ids (no id) keeps the binding it was sealed with.
pub fn key_aad(app: &str, app_id: &str, hostname: &str) -> String {
    if app_id.is_empty() {
        format!("app/{app}/certificate/{hostname}")
    } else {
        format!("app/{app}/{app_id}/certificate/{hostname}")
    }
}

/// The certificate of each hostname among every host's rows: the row written last
/// (`updated_at_ms`, then host id), tombstones included; removed hostnames are left out.
pub fn current(rows: &[CertificateView]) -> HashMap<&str, &CertificateView> {
    let mut out: HashMap<&str, &CertificateView> = HashMap::new();
    for row in rows {
        let r = &row.record;
        out.entry(r.hostname.as_str())
            .and_modify(|best| {
                if (r.updated_at_ms, &r.host_id) > (best.record.updated_at_ms, &best.record.host_id)
                {
                    *best = row;
                }
            })
            .or_insert(row);
    }
    out.retain(|_, row| !row.deleted);
    out
}

/// Of the [`current`] rows, those attached to a live app: the row's app id is the id of the
/// app now of that name in `catalog`. A row of a deleted app, or of an earlier app of the
/// same name, attaches nothing: it is not served, routed, listed or renewed.
pub fn attached<'a>(
    catalog: &Catalog,
    rows: &'a [CertificateView],
) -> HashMap<&'a str, &'a CertificateView> {
    let apps: HashMap<String, String> =
        catalog.apps().into_iter().map(|a| (a.name, a.id)).collect();
    let mut cur = current(rows);
    cur.retain(|_, v| {
        apps.get(&v.record.app)
            .is_some_and(|id| *id == v.record.app_id)
    });
    cur
}

/// Checks a hostname users may attach to an app: a DNS name of at least two labels,
/// letters, digits and hyphens, at most 253 characters; returned lowercase.
pub fn normalize_hostname(hostname: &str) -> Result<String, String> {
    let h = hostname.trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = h.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if h.len() > 253 || labels.len() < 2 || !labels.iter().all(label_ok) {
        return Err(format!(
            "{hostname:?} is not a valid hostname (DNS labels of letters, digits and hyphens, at least two)"
        ));
    }
    Ok(h)
}

/// A certificate and key as given (PEM), checked: the key matches the leaf, and the leaf
/// names `hostname`. Returns the chain's validity (not before, not after; ms).
pub fn check_pem(chain_pem: &str, key_pem: &str, hostname: &str) -> Result<(u64, u64), String> {
    let key = certified_key(chain_pem, key_pem.as_bytes())?;
    let leaf = key.end_entity_cert().map_err(|e| e.to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| format!("the certificate does not parse: {e}"))?;
    let names: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        Some(d.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let covers = names.iter().any(|n| {
        n == hostname
            || n.strip_prefix("*.").is_some_and(|base| {
                hostname
                    .split_once('.')
                    .is_some_and(|(_, rest)| rest == base)
            })
    });
    if !covers {
        return Err(format!(
            "the certificate does not name {hostname} (it names {})",
            if names.is_empty() {
                "no DNS name".to_string()
            } else {
                names.join(", ")
            }
        ));
    }
    let validity = cert.validity();
    let ms = |t: x509_parser::time::ASN1Time| (t.timestamp().max(0) as u64) * 1000;
    Ok((ms(validity.not_before), ms(validity.not_after)))
}

/// A chain and key as rustls serves them (aws-lc-rs, as the rest of bazaar).
pub fn certified_key(chain_pem: &str, key_pem: &[u8]) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate is not valid PEM: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the PEM given".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("the private key is not valid PEM: {e}"))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| format!("the key does not match the certificate: {e}"))
}

/// The servable key of an issued row: its key opened with the cluster's key.
pub fn open_row(
    seal: &bazaar_seal::SealKey,
    r: &CertificateRecord,
) -> Result<Arc<CertifiedKey>, String> {
    let key = seal
        .open(&key_aad(&r.app, &r.app_id, &r.hostname), &r.sealed_key)
        .map_err(|e| e.to_string())?;
    certified_key(&r.chain_pem, &key).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_catalog::HostStatus;

    fn view(host: &str, hostname: &str, updated: u64, deleted: bool) -> CertificateView {
        CertificateView {
            record: CertificateRecord {
                hostname: hostname.into(),
                host_id: host.into(),
                updated_at_ms: updated,
                ..Default::default()
            },
            host_status: HostStatus::Alive,
            deleted,
        }
    }

    #[test]
    fn the_row_written_last_is_the_certificate() {
        let rows = vec![
            view("a", "x.example.com", 10, false),
            view("b", "x.example.com", 20, false),
            view("a", "y.example.com", 30, false),
            view("c", "y.example.com", 40, true),
            view("a", "z.example.com", 5, false),
            view("b", "z.example.com", 5, false),
        ];
        let cur = current(&rows);
        assert_eq!(cur["x.example.com"].record.host_id, "b");
        assert!(!cur.contains_key("y.example.com"), "removed");
        assert_eq!(
            cur["z.example.com"].record.host_id, "b",
            "ties: higher host id"
        );
    }

    #[test]
    fn hostnames() {
        assert_eq!(
            normalize_hostname("WWW.Example.com.").unwrap(),
            "www.example.com"
        );
        for bad in ["localhost", "", "a..b", "-a.b", "a_b.c", "a b.c"] {
            assert!(normalize_hostname(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pem_is_checked() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["app.example.com".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (chain, key_pem) = (cert.pem(), key.serialize_pem());
        assert!(check_pem(&chain, &key_pem, "app.example.com").is_ok());
        let err = check_pem(&chain, &key_pem, "other.example.com").unwrap_err();
        assert!(err.contains("does not name other.example.com"), "{err}");
        let other = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let err = check_pem(&chain, &other, "app.example.com").unwrap_err();
        assert!(err.contains("does not match"), "{err}");
        assert!(check_pem("junk", &key_pem, "app.example.com").is_err());
    }
}
