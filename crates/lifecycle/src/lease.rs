//! Leases (Fly's exclusive-change tokens) and metadata keys. A lease is held while it has
//! not expired; taking one over another holder's is a conflict, refreshing needs its nonce
//! (a lease that just expired is renewed for the holder that still has the nonce), and every
//! mutation of a leased machine must carry the nonce. Pure: the caller passes the clock and
//! the nonce a new lease gets.

use bazaar_types::machine::Lease;
use bazaar_types::rfc3339;

/// Why a lease call is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Bad input (a ttl out of range, a release without a nonce, a bad metadata key).
    #[error("{0}")]
    Invalid(String),
    /// Another holder's lease stands in the way (Fly answers 409).
    #[error("{0}")]
    Conflict(String),
    /// Machine `.0` holds no lease.
    #[error("machine {0} holds no lease")]
    NotFound(String),
}

/// The longest lease, in seconds (Fly's limit: an hour).
pub const MAX_TTL_SECS: u64 = 3600;

/// What a caller asks of [`acquire`].
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// Seconds, 1 to [`MAX_TTL_SECS`].
    pub ttl: u64,
    /// Shown to others; at most 256 characters are kept. A refresh without one keeps the
    /// lease's own.
    pub description: &'a str,
    /// The nonce of the lease the caller holds (a refresh), if any.
    pub nonce: Option<&'a str>,
}

/// The lease of a machine, if one is held at `now_ms` (not yet expired).
pub fn held(lease: Option<&Lease>, now_ms: u64) -> Option<&Lease> {
    lease.filter(|l| l.expires_at.saturating_mul(1000) > now_ms)
}

/// Takes or refreshes the lease of machine `id` at version `version`. `stored` is the lease
/// the record keeps (it may have expired); `fresh_nonce` makes the nonce of a new lease.
/// Returns the lease to store and whether it is new (Fly answers 201 for a new one).
pub fn acquire(
    id: &str,
    version: &str,
    stored: Option<&Lease>,
    req: LeaseRequest<'_>,
    now_ms: u64,
    fresh_nonce: impl FnOnce() -> String,
) -> Result<(Lease, bool), LeaseError> {
    let refresh = match (held(stored, now_ms), req.nonce) {
        (Some(l), Some(n)) if l.nonce == n => true,
        (Some(l), _) => return Err(conflict(id, l)),
        // Refreshing a lease that just expired: renew it for the same holder.
        (None, Some(n)) => !n.is_empty() && stored.is_some_and(|l| l.nonce == n),
        (None, None) => false,
    };
    let keep = if refresh { req.nonce } else { None };
    let lease = new_lease(
        version,
        stored,
        req.ttl,
        req.description,
        keep,
        now_ms,
        fresh_nonce,
    )?;
    Ok((lease, !refresh))
}

/// A new lease (or a refresh keeping `keep_nonce`) of `ttl` seconds for a machine at
/// `version` whose stored lease is `stored`. Also used when a create or an update takes a
/// lease for its caller.
pub fn new_lease(
    version: &str,
    stored: Option<&Lease>,
    ttl: u64,
    description: &str,
    keep_nonce: Option<&str>,
    now_ms: u64,
    fresh_nonce: impl FnOnce() -> String,
) -> Result<Lease, LeaseError> {
    if !(1..=MAX_TTL_SECS).contains(&ttl) {
        return Err(LeaseError::Invalid(format!(
            "lease ttl must be between 1 and {MAX_TTL_SECS} seconds, got {ttl}"
        )));
    }
    Ok(Lease {
        nonce: keep_nonce.map(str::to_string).unwrap_or_else(fresh_nonce),
        expires_at: now_ms / 1000 + ttl,
        owner: "api".into(),
        description: match (keep_nonce, stored) {
            (Some(_), Some(kept)) if description.is_empty() => kept.description.clone(),
            _ => description.chars().take(256).collect(),
        },
        version: version.to_string(),
    })
}

/// Releases the lease of machine `id`: the nonce must be the held lease's.
pub fn release(
    id: &str,
    stored: Option<&Lease>,
    nonce: Option<&str>,
    now_ms: u64,
) -> Result<(), LeaseError> {
    let Some(nonce) = nonce.filter(|n| !n.is_empty()) else {
        return Err(LeaseError::Invalid(
            "releasing a lease needs its nonce in the fly-machine-lease-nonce header".into(),
        ));
    };
    match held(stored, now_ms) {
        None => Err(LeaseError::NotFound(id.into())),
        Some(l) if l.nonce != nonce => Err(conflict(id, l)),
        Some(_) => Ok(()),
    }
}

/// Refuses a mutation of machine `id` while another holder's lease is held: `nonce` must be
/// the lease's.
pub fn check(
    id: &str,
    stored: Option<&Lease>,
    nonce: Option<&str>,
    now_ms: u64,
) -> Result<(), LeaseError> {
    match held(stored, now_ms) {
        Some(l) if nonce != Some(l.nonce.as_str()) => Err(conflict(id, l)),
        _ => Ok(()),
    }
}

/// The conflict a held lease makes, naming its holder and expiry as Fly does.
pub fn conflict(id: &str, l: &Lease) -> LeaseError {
    LeaseError::Conflict(format!(
        "machine {id} lease currently held by {} ({}), expires at {}",
        l.owner,
        if l.description.is_empty() {
            "no description"
        } else {
            &l.description
        },
        rfc3339(l.expires_at * 1000)
    ))
}

/// A metadata key: 1 to 128 letters, digits, `_`, `-`, `.` or `/`.
pub fn validate_metadata_key(key: &str) -> Result<(), LeaseError> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(LeaseError::Invalid(format!(
            "invalid metadata key {key:?}: use 1-128 letters, digits, '_', '-', '.', '/'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn ask<'a>(ttl: u64, description: &'a str, nonce: Option<&'a str>) -> LeaseRequest<'a> {
        LeaseRequest {
            ttl,
            description,
            nonce,
        }
    }

    fn take(
        stored: Option<&Lease>,
        req: LeaseRequest<'_>,
        now: u64,
    ) -> Result<(Lease, bool), LeaseError> {
        acquire("m1", "v1", stored, req, now, || "fresh".into())
    }

    #[test]
    fn a_new_lease_has_a_fresh_nonce_its_ttl_and_the_machine_version() {
        let (lease, new) = take(None, ask(30, "deploy", None), NOW).unwrap();
        assert!(new);
        assert_eq!(lease.nonce, "fresh");
        assert_eq!(lease.expires_at, NOW / 1000 + 30);
        assert_eq!(lease.owner, "api");
        assert_eq!(lease.description, "deploy");
        assert_eq!(lease.version, "v1");
        assert_eq!(held(Some(&lease), NOW + 29_999), Some(&lease));
        assert_eq!(
            held(Some(&lease), NOW + 30_000),
            None,
            "expired at its second"
        );
    }

    #[test]
    fn ttl_bounds() {
        for ttl in [1, MAX_TTL_SECS] {
            assert!(take(None, ask(ttl, "", None), NOW).is_ok(), "{ttl}");
        }
        for ttl in [0, MAX_TTL_SECS + 1] {
            let err = take(None, ask(ttl, "", None), NOW).unwrap_err();
            assert!(
                matches!(err, LeaseError::Invalid(ref m) if m.contains(&ttl.to_string())),
                "{err}"
            );
        }
    }

    #[test]
    fn another_holders_lease_is_a_conflict_until_it_expires() {
        let (held_lease, _) = take(None, ask(10, "mine", None), NOW).unwrap();
        for nonce in [None, Some("other"), Some("")] {
            let err = take(Some(&held_lease), ask(10, "", nonce), NOW + 1).unwrap_err();
            let LeaseError::Conflict(msg) = err else {
                panic!("{err:?}")
            };
            assert!(
                msg.contains("machine m1 lease currently held by api (mine)"),
                "{msg}"
            );
        }
        // Once expired, anyone takes a new one.
        let (next, new) = acquire(
            "m1",
            "v2",
            Some(&held_lease),
            ask(10, "", None),
            NOW + 10_000,
            || "n2".into(),
        )
        .unwrap();
        assert!(new);
        assert_eq!(next.nonce, "n2");
        assert_eq!(next.version, "v2");
    }

    #[test]
    fn the_holder_refreshes_keeping_its_nonce_and_description() {
        let (l, _) = take(None, ask(10, "mine", None), NOW).unwrap();
        let (r, new) = take(Some(&l), ask(60, "", Some(&l.nonce)), NOW + 5_000).unwrap();
        assert!(!new);
        assert_eq!(r.nonce, l.nonce);
        assert_eq!(r.description, "mine");
        assert_eq!(r.expires_at, (NOW + 5_000) / 1000 + 60);
        let (d, _) = take(Some(&l), ask(60, "renamed", Some(&l.nonce)), NOW).unwrap();
        assert_eq!(d.description, "renamed");
        // A lease that just expired is renewed for the holder with the nonce.
        let (late, new) = take(Some(&l), ask(10, "", Some(&l.nonce)), NOW + 20_000).unwrap();
        assert!(!new);
        assert_eq!(late.nonce, l.nonce);
        // An empty nonce on an expired lease takes a new one.
        let (fresh, new) = take(Some(&l), ask(10, "", Some("")), NOW + 20_000).unwrap();
        assert!(new);
        assert_eq!(fresh.nonce, "fresh");
        // A wrong nonce on an expired lease takes a new one too, without the old description.
        let (other, new) = take(Some(&l), ask(10, "", Some("nope")), NOW + 20_000).unwrap();
        assert!(new);
        assert_eq!(other.description, "");
    }

    #[test]
    fn descriptions_are_cut_at_256_characters() {
        let long = "é".repeat(300);
        let (l, _) = take(None, ask(10, &long, None), NOW).unwrap();
        assert_eq!(l.description.chars().count(), 256);
    }

    #[test]
    fn release_needs_the_held_leases_nonce() {
        let (l, _) = take(None, ask(10, "", None), NOW).unwrap();
        for missing in [None, Some("")] {
            let err = release("m1", Some(&l), missing, NOW).unwrap_err();
            assert!(
                matches!(err, LeaseError::Invalid(ref m) if m.contains("fly-machine-lease-nonce"))
            );
        }
        assert!(matches!(
            release("m1", Some(&l), Some("x"), NOW),
            Err(LeaseError::Conflict(_))
        ));
        assert_eq!(release("m1", Some(&l), Some(&l.nonce), NOW), Ok(()));
        assert_eq!(
            release("m1", Some(&l), Some(&l.nonce), NOW + 10_000),
            Err(LeaseError::NotFound("m1".into()))
        );
        assert_eq!(
            release("m1", None, Some("x"), NOW),
            Err(LeaseError::NotFound("m1".into()))
        );
    }

    #[test]
    fn mutations_of_a_leased_machine_need_the_nonce() {
        let (l, _) = take(None, ask(10, "", None), NOW).unwrap();
        assert_eq!(check("m1", None, None, NOW), Ok(()));
        assert_eq!(check("m1", Some(&l), Some(&l.nonce), NOW), Ok(()));
        assert!(matches!(
            check("m1", Some(&l), None, NOW),
            Err(LeaseError::Conflict(_))
        ));
        assert!(matches!(
            check("m1", Some(&l), Some("x"), NOW),
            Err(LeaseError::Conflict(_))
        ));
        assert_eq!(
            check("m1", Some(&l), None, NOW + 10_000),
            Ok(()),
            "an expired lease binds nobody"
        );
    }

    #[test]
    fn a_conflict_names_the_expiry() {
        let l = Lease {
            nonce: "n".into(),
            expires_at: 1_700_000_000,
            owner: "api".into(),
            description: String::new(),
            version: "v".into(),
        };
        let LeaseError::Conflict(msg) = conflict("m9", &l) else {
            unreachable!()
        };
        assert_eq!(
            msg,
            format!(
                "machine m9 lease currently held by api (no description), expires at {}",
                rfc3339(1_700_000_000_000)
            )
        );
    }

    #[test]
    fn metadata_keys() {
        for ok in ["a", "fly_platform_version", "x.y/z-1", &"k".repeat(128)] {
            assert_eq!(validate_metadata_key(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a b", "ключ", "a=b", &"k".repeat(129)] {
            assert!(validate_metadata_key(bad).is_err(), "{bad}");
        }
    }
}
