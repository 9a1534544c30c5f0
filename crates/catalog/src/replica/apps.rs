//! Which app a name is, when several hosts created it (issue 31, item 7). App names are
//! cluster-wide without a central store: two nodes that cannot hear each other (a
//! partition) may both create one. Every node then applies the same rule to the rows it
//! holds, so once the catalog has converged they all agree: of the live app rows of a name,
//! the one with the least [`AppRecord::precedence`] (earliest `created_at_ms`, then the
//! creating host's id, then the app id) *is* the app; the others *lost the name*. A losing
//! app keeps its row (its organization is told: `name_conflict`), and its machines (those
//! whose row carries its id, `MachineRecord::app_id`) are never the app's.

use super::{Kind, Record, Replica};
use crate::records::{AppRecord, MachineRecord};

impl Replica {
    /// The app of that name: the least of its live rows by [`AppRecord::precedence`], on
    /// every node alike.
    pub fn app(&self, name: &str) -> Option<&AppRecord> {
        self.app_rows(name).into_iter().next()
    }

    /// Every live row of an app name, the app first, then the apps that lost the name to
    /// it, in the rule's order.
    pub fn app_rows(&self, name: &str) -> Vec<&AppRecord> {
        let mut rows: Vec<&AppRecord> = self
            .app_owners
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|owner| self.get(owner, Kind::App, name))
            .filter(|r| !r.deleted)
            .filter_map(|r| match &r.record {
                Record::App(a) => Some(a),
                _ => None,
            })
            .collect();
        rows.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
        rows
    }

    /// Every app (resolved as [`Replica::app`] does), ordered by name.
    pub fn apps(&self) -> Vec<&AppRecord> {
        let mut names: Vec<&String> = self.app_owners.keys().collect();
        names.sort();
        names.into_iter().filter_map(|n| self.app(n)).collect()
    }

    /// The app that app `id` of `name` lost the name to: `Some` when a live row of `name`
    /// has that id and another row wins; `None` when it is the app (or no row has the id:
    /// an id left empty by a host of an older version is taken as the app of its name).
    pub fn lost_to(&self, name: &str, id: &str) -> Option<&AppRecord> {
        if id.is_empty() {
            return None;
        }
        let rows = self.app_rows(name);
        let (winner, losers) = rows.split_first()?;
        losers.iter().any(|a| a.id == id).then_some(*winner)
    }

    /// Whether a machine belongs to an app that lost its name (made on the losing side of
    /// a partition): not the app's, never listed, routed or named in DNS as the app's.
    pub fn is_of_losing_app(&self, m: &MachineRecord) -> bool {
        self.lost_to(&m.app, &m.app_id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::Row;
    use crate::trust::Seal;

    fn app_row(owner: &str, id: &str, org: &str, created: u64, version: u64) -> Row {
        Row {
            owner: owner.into(),
            version,
            deleted: false,
            updated_at_ms: version,
            record: Record::App(AppRecord {
                id: id.into(),
                name: "race2".into(),
                org_slug: org.into(),
                created_at_ms: created,
                created_by_host: owner.into(),
            }),
            seal: Seal::default(),
        }
    }

    /// The rule: earliest creation, then host id, then app id; the same whatever order
    /// the rows arrive in, so every node that holds the same rows names the same app.
    #[test]
    fn the_earliest_app_row_of_a_name_wins_in_any_order() {
        let rows = [
            app_row("h2", "app_2", "org-b", 100, 1),
            app_row("h1", "app_1", "org-a", 100, 1),
            app_row("h3", "app_3", "org-c", 99, 1),
        ];
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let mut r = Replica::new();
            for i in order {
                r.apply(rows[i].clone());
            }
            assert_eq!(r.app("race2").unwrap().id, "app_3", "earliest creation");
            let ids: Vec<&str> = r.app_rows("race2").iter().map(|a| a.id.as_str()).collect();
            assert_eq!(ids, ["app_3", "app_1", "app_2"], "same time: lower host id");
            assert_eq!(r.lost_to("race2", "app_1").unwrap().org_slug, "org-c");
            assert_eq!(r.lost_to("race2", "app_2").unwrap().id, "app_3");
            assert!(
                r.lost_to("race2", "app_3").is_none(),
                "the winner lost nothing"
            );
            assert!(r.lost_to("race2", "app_9").is_none(), "an unknown id");
            assert!(
                r.lost_to("race2", "").is_none(),
                "no id: the app of its name"
            );
        }
    }

    /// A machine carrying a losing app's id is that app's, not the name's; one of the
    /// winner, or without an id (an older host), is the name's.
    #[test]
    fn a_machine_of_the_losing_app_is_told_apart() {
        let mut r = Replica::new();
        r.apply(app_row("h1", "app_a", "org-a", 10, 1));
        let machine = |app_id: &str| MachineRecord {
            id: "m".into(),
            app: "race2".into(),
            app_id: app_id.into(),
            ..Default::default()
        };
        assert!(!r.is_of_losing_app(&machine("app_b")), "no conflict yet");
        r.apply(app_row("h2", "app_b", "org-b", 20, 1));
        assert!(r.is_of_losing_app(&machine("app_b")));
        assert!(!r.is_of_losing_app(&machine("app_a")));
        assert!(!r.is_of_losing_app(&machine("")));
        // The winner deleted: the next row is the app of the name now.
        let mut gone = app_row("h1", "app_a", "org-a", 10, 2);
        gone.deleted = true;
        r.apply(gone);
        assert_eq!(r.app("race2").unwrap().id, "app_b");
        assert!(!r.is_of_losing_app(&machine("app_b")));
    }
}
