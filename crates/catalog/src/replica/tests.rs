//! The replica's merge rules, by example and by property (any order of delivery ends in
//! the same rows).

use super::*;
use proptest::prelude::*;

/// A row whose content is a function of (owner, kind, key, version, deleted), as the
/// protocol guarantees: the same version of a key is the same row.
fn row(owner: &str, kind: Kind, key: &str, version: u64, deleted: bool) -> Row {
    let record = match kind {
        Kind::Host => Record::Host(HostRecord {
            id: owner.into(),
            region: format!("r{}", version % 3),
            updated_at_ms: version,
            ..Default::default()
        }),
        Kind::Machine => Record::Machine(MachineRecord {
            id: key.into(),
            app: format!("app{}", key.len() % 2),
            host_id: owner.into(),
            state: if deleted { "destroyed" } else { "started" }.into(),
            region: format!("r{}", version % 3),
            updated_at_ms: version,
            ..Default::default()
        }),
        Kind::App => Record::App(AppRecord {
            name: key.into(),
            org_slug: "personal".into(),
            created_at_ms: version,
            created_by_host: owner.into(),
            ..Default::default()
        }),
        Kind::Volume => Record::Volume(VolumeRecord {
            id: key.into(),
            app: format!("app{}", key.len() % 2),
            host_id: owner.into(),
            size_gb: version,
            updated_at_ms: version,
            ..Default::default()
        }),
        Kind::Secret => Record::Secret(SecretRecord {
            id: SecretRecord::key_of("web", key),
            app: "web".into(),
            name: key.into(),
            set_by_host: owner.into(),
            sealed: version
                .is_multiple_of(2)
                .then(|| format!("sealed-{version}")),
            digest: format!("{version:016x}"),
            app_created_at_ms: 1,
            created_at_ms: version,
            updated_at_ms: version,
        }),
        Kind::Certificate => Record::Certificate(CertificateRecord {
            hostname: key.into(),
            host_id: owner.into(),
            updated_at_ms: version,
            ..Default::default()
        }),
        Kind::Challenge => Record::Challenge(ChallengeRecord {
            token: key.into(),
            host_id: owner.into(),
            created_at_ms: version,
            ..Default::default()
        }),
        Kind::Quota => {
            let scope = bazaar_types::quota::Scope::Org(key.into());
            Record::Quota(QuotaRecord {
                id: QuotaRecord::key_of(&scope),
                scope,
                limits: bazaar_types::quota::Limits {
                    machines: Some(version),
                    ..Default::default()
                },
                set_by_host: owner.into(),
                app_created_at_ms: 0,
                updated_at_ms: version,
            })
        }
    };
    Row {
        owner: owner.into(),
        version,
        deleted,
        updated_at_ms: version,
        record,
        seal: Default::default(),
    }
}

fn host_row(owner: &str, version: u64) -> Row {
    row(owner, Kind::Host, owner, version, false)
}

fn snapshot(r: &Replica) -> Vec<Row> {
    r.rows().cloned().collect()
}

#[test]
fn higher_version_wins_and_same_version_is_idempotent() {
    let mut r = Replica::new();
    assert!(r
        .apply(row("a", Kind::Machine, "m1", 5, false))
        .is_applied());
    assert_eq!(
        r.apply(row("a", Kind::Machine, "m1", 5, false)),
        Outcome::Stale
    );
    assert_eq!(
        r.apply(row("a", Kind::Machine, "m1", 4, false)),
        Outcome::Stale
    );
    let out = r.apply(row("a", Kind::Machine, "m1", 7, true));
    assert_eq!(
        out,
        Outcome::Applied {
            previous_version: Some(5)
        }
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r.num_tombstones(), 1);
    assert_eq!(r.entry("a").unwrap().max_version, 7);
}

#[test]
fn tombstones_are_collected_and_their_markers_refuse_stale_copies() {
    let mut r = Replica::new();
    r.apply(row("a", Kind::Machine, "m1", 10, true));
    assert!(r.collect_garbage(15, 10).is_empty());
    assert_eq!(r.collect_garbage(20, 10).len(), 1);
    assert!(r.is_empty());
    // A node that was away still holds the live version 5: refused.
    assert_eq!(
        r.apply(row("a", Kind::Machine, "m1", 5, false)),
        Outcome::Stale
    );
    assert_eq!(
        r.apply(row("a", Kind::Machine, "m1", 10, true)),
        Outcome::Stale
    );
    // A newer write of the same key is accepted.
    assert!(r
        .apply(row("a", Kind::Machine, "m1", 11, false))
        .is_applied());
    // Markers are forgotten after another ttl.
    r.collect_garbage(100, 10);
    assert!(r.markers.is_empty());
}

#[test]
fn authoritative_set_drops_what_the_owner_no_longer_has() {
    let mut r = Replica::new();
    r.apply(host_row("a", 1));
    r.apply(row("a", Kind::Machine, "m1", 2, false));
    r.apply(row("a", Kind::Machine, "m2", 9, false));
    r.apply(row("b", Kind::Machine, "m3", 2, false));
    // The owner has the host row (newer) and m2; m1 is gone. m2 version 9 is newer
    // than the owner's set and so is kept.
    let changed = r.apply_authoritative("a", vec![host_row("a", 3)], 100, 10);
    assert_eq!(changed.len(), 2);
    assert!(r.get("a", Kind::Machine, "m1").is_none());
    assert!(r.get("a", Kind::Machine, "m2").is_some());
    assert!(r.get("b", Kind::Machine, "m3").is_some());
    assert_eq!(
        r.apply(row("a", Kind::Machine, "m1", 2, false)),
        Outcome::Stale
    );
}

#[test]
fn queries_use_the_indexes() {
    let mut r = Replica::new();
    r.apply(row("a", Kind::Machine, "m1", 2, false)); // app0 (from the key's length)
    r.apply(row("b", Kind::Machine, "m1", 5, true)); // moved away from b, deleted there
    r.apply(row("a", Kind::App, "web", 7, false));
    r.apply(row("b", Kind::App, "web", 3, false));
    assert_eq!(r.machine("m1").unwrap().owner, "a");
    assert_eq!(r.app_machines("app0").count(), 2);
    assert_eq!(r.app("web").unwrap().created_by_host, "b");
    assert_eq!(r.apps().len(), 1);
    r.apply(row("b", Kind::App, "web", 8, true));
    assert_eq!(r.app("web").unwrap().created_by_host, "a");
}

/// Secrets: any host writes its own row for a name; the latest write wins on every
/// node, an unset (no value) included; a secret of an earlier app of the same name
/// does not count.
#[test]
fn the_latest_write_of_a_secret_wins_across_hosts() {
    let mut r = Replica::new();
    r.apply(row("a", Kind::Secret, "DB", 4, false));
    assert!(r.app_secrets("web").is_empty(), "no app, no secrets");
    let mut app = row("a", Kind::App, "web", 1, false);
    if let Record::App(a) = &mut app.record {
        a.created_at_ms = 1;
    }
    r.apply(app);
    r.apply(row("b", Kind::Secret, "DB", 7, false)); // unset later, on b
    r.apply(row("c", Kind::Secret, "DB", 6, false));
    r.apply(row("a", Kind::Secret, "KEY", 2, false));
    let secrets = r.app_secrets("web");
    assert_eq!(secrets.len(), 2);
    assert_eq!(
        (secrets[0].name.as_str(), secrets[0].set_by_host.as_str()),
        ("DB", "b")
    );
    assert_eq!(secrets[0].sealed, None);
    assert_eq!(secrets[1].sealed.as_deref(), Some("sealed-2"));
    // Set again on a: the newest write.
    r.apply(row("a", Kind::Secret, "DB", 8, false));
    assert_eq!(r.app_secrets("web")[0].sealed.as_deref(), Some("sealed-8"));
    // The app made again: the old secrets are not the new app's.
    let mut again = row("a", Kind::App, "web", 9, false);
    if let Record::App(a) = &mut again.record {
        a.created_at_ms = 9;
    }
    r.apply(again);
    assert!(r.app_secrets("web").is_empty());
}

/// A machine re-placed after its host died: the row with the higher epoch is the
/// machine whatever was written last (the old host's row, republished when it comes
/// back, and its tombstone never win); two re-placements of one epoch that raced are
/// ordered by host id, the same on every node.
/// A machine destroyed before the app of its name was made belonged to an earlier app
/// of that name; a live one, or one destroyed since, is the app's.
#[test]
fn a_machine_destroyed_before_its_app_was_made_is_an_earlier_apps() {
    let mut r = Replica::new();
    let machine = |id: &str, updated: u64, deleted: bool| {
        let mut m = row("a", Kind::Machine, id, 1, deleted);
        if let Record::Machine(x) = &mut m.record {
            x.app = "web".into();
            x.updated_at_ms = updated;
        }
        m
    };
    assert!(
        r.is_of_current_app(&machine("m0", 10, true)),
        "no app of that name: nothing to mistake it for"
    );
    r.apply(row("a", Kind::App, "web", 100, false));
    assert!(!r.is_of_current_app(&machine("m1", 99, true)));
    assert!(r.is_of_current_app(&machine("m2", 100, true)));
    assert!(r.is_of_current_app(&machine("m3", 50, false)));
}

#[test]
fn the_row_of_the_highest_epoch_is_the_machine() {
    let with_epoch = |owner: &str, version: u64, deleted: bool, epoch: u64| {
        let mut r = row(owner, Kind::Machine, "m1", version, deleted);
        if let Record::Machine(m) = &mut r.record {
            m.epoch = epoch;
        }
        r
    };
    let mut r = Replica::new();
    r.apply(with_epoch("old", 10, false, 0));
    r.apply(with_epoch("new", 5, false, 1));
    let old_row = r.get("old", Kind::Machine, "m1").unwrap().clone();
    assert_eq!(r.machine("m1").unwrap().owner, "new");
    assert!(!r.is_current_machine_row(&old_row));
    // The old host returns and republishes, then stops its copy: still "new".
    r.apply(with_epoch("old", 20, false, 0));
    assert_eq!(r.machine("m1").unwrap().owner, "new");
    r.apply(with_epoch("old", 21, true, 0));
    assert_eq!(r.machine("m1").unwrap().owner, "new");
    let new_row = r.get("new", Kind::Machine, "m1").unwrap().clone();
    assert!(r.is_current_machine_row(&new_row));
    // A destroy by the new owner is not undone by the old row.
    r.apply(with_epoch("new", 30, true, 1));
    assert!(r.machine("m1").unwrap().deleted);
    // Two hosts of one epoch: the lower id, whatever the versions.
    r.apply(with_epoch("c", 50, false, 2));
    r.apply(with_epoch("b", 40, false, 2));
    assert_eq!(r.machine("m1").unwrap().owner, "b");
}

fn arb_row() -> impl Strategy<Value = Row> {
    (
        prop::sample::select(vec!["a", "b", "c"]),
        prop::sample::select(vec![
            Kind::Host,
            Kind::Machine,
            Kind::App,
            Kind::Volume,
            Kind::Secret,
            Kind::Certificate,
            Kind::Challenge,
        ]),
        prop::sample::select(vec!["k1", "k22", "k333"]),
        1u64..20,
    )
        .prop_map(|(owner, kind, key, version)| {
            // Deletion is a function of the version too, as an owner would write it.
            let deleted = kind != Kind::Host && version % 4 == 0;
            let key = if kind == Kind::Host { owner } else { key };
            row(owner, kind, key, version, deleted)
        })
}

proptest! {
    #[test]
    fn merge_is_order_independent_and_idempotent(
        rows in prop::collection::vec(arb_row(), 0..60),
        seed in any::<u64>(),
    ) {
        let mut in_order = Replica::new();
        for r in rows.clone() {
            in_order.apply(r);
        }

        // Shuffle, and add duplicates of some rows.
        let mut shuffled = rows.clone();
        shuffled.extend(rows.iter().step_by(3).cloned());
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut other = Replica::new();
        for r in shuffled {
            other.apply(r);
        }

        prop_assert_eq!(in_order.digest(), other.digest());
        prop_assert_eq!(in_order.digest_entries(), other.digest_entries());
        prop_assert_eq!(snapshot(&in_order), snapshot(&other));

        // Applying everything again changes nothing.
        let before = in_order.digest();
        for r in rows {
            prop_assert_eq!(in_order.apply(r), Outcome::Stale);
        }
        prop_assert_eq!(in_order.digest(), before);
    }

    #[test]
    fn merging_two_replicas_converges(
        left in prop::collection::vec(arb_row(), 0..40),
        right in prop::collection::vec(arb_row(), 0..40),
    ) {
        // Two nodes that saw different subsets converge once they exchange rows.
        let mut a = Replica::new();
        let mut b = Replica::new();
        for r in left { a.apply(r); }
        for r in right { b.apply(r); }
        let a_rows = snapshot(&a);
        let b_rows = snapshot(&b);
        for r in b_rows { a.apply(r); }
        for r in a_rows { b.apply(r); }
        prop_assert_eq!(a.digest(), b.digest());
        prop_assert_eq!(snapshot(&a), snapshot(&b));
    }

    #[test]
    fn digest_entries_track_the_rows(rows in prop::collection::vec(arb_row(), 0..40)) {
        // The incremental hash equals a recomputation from scratch.
        let mut r = Replica::new();
        for row in rows { r.apply(row); }
        for e in r.digest_entries() {
            let rows: Vec<&Row> = r.owner_rows(&e.owner).collect();
            let hash = rows.iter().fold(0u64, |h, row| h ^ row.id_hash());
            let max = rows.iter().map(|row| row.version).max().unwrap_or(0);
            prop_assert_eq!(e.hash, hash);
            prop_assert_eq!(e.max_version, max);
            prop_assert_eq!(e.count as usize, rows.len());
        }
    }
}

/// Quotas: any host writes its own row for an org or app; the latest write wins on every
/// node, then the higher host id.
#[test]
fn the_latest_write_of_a_quota_wins_across_hosts() {
    let mut r = Replica::new();
    let acme = bazaar_types::quota::Scope::Org("acme".into());
    assert!(r.quota(&acme).is_none());
    r.apply(row("a", Kind::Quota, "acme", 4, false));
    r.apply(row("b", Kind::Quota, "acme", 7, false));
    r.apply(row("c", Kind::Quota, "acme", 6, false));
    let q = r.quota(&acme).unwrap();
    assert_eq!((q.set_by_host.as_str(), q.limits.machines), ("b", Some(7)));
    r.apply(row("b", Kind::Quota, "acme", 8, true));
    assert_eq!(
        r.quota(&acme).unwrap().set_by_host,
        "c",
        "a deleted row no longer counts"
    );
    let web = bazaar_types::quota::Scope::App("web".into());
    assert!(r.quota(&web).is_none(), "no app, no quota");
}
