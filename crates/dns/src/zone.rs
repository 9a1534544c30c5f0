//! The pure resolver: a [`Zone`] (what the local catalog says, reduced to what DNS answers)
//! and the answer to one name. No I/O, no clock: the server shell rebuilds the zone when the
//! catalog changes and turns answers into DNS messages.
//!
//! Names, as on Fly (all under `.internal`, case-insensitive):
//!
//! | name | answer |
//! |---|---|
//! | `<app>.internal` | every answering machine of the app |
//! | `<region>.<app>.internal` | those in a region |
//! | `top<N>.nearest.of.<app>.internal` | the N nearest: this host's, then this region's, then the others |
//! | `<machine id>.vm.<app>.internal` | one machine |
//! | `<group>.process.<app>.internal` | a process group's (`fly_process_group` metadata) |
//! | `_apps.internal` (TXT) | the organization's app names, comma-separated |
//! | `_instances.internal` (TXT) | `instance=<id>,app=<app>,ip=<ip>,region=<region>` per answering machine, `;`-separated |
//!
//! A machine answers while it is `started`, none of its checks is `critical`, its host is
//! not unreachable, and it has a private address. A name of an app the asker's
//! organization does not own does not exist for it (NXDOMAIN), like any other unknown
//! `.internal` name; names not under `.internal` are forwarded.

use bazaar_catalog::{AppRecord, MachineView};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// The metadata key naming a machine's process group (Fly's).
pub const PROCESS_GROUP_KEY: &str = "fly_process_group";

/// One machine DNS can answer with.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub id: String,
    pub app: String,
    pub region: String,
    pub host_id: String,
    pub process_group: Option<String>,
    pub ip: IpAddr,
}

/// Who asks: the host itself (sees every organization), a machine of an organization, or
/// anybody else (sees no `.internal` name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Viewer {
    Host,
    Org(String),
    Nobody,
}

/// The record type asked for, as far as the zone cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    A,
    Aaaa,
    /// A and AAAA (`ANY`).
    Addresses,
    Txt,
    /// Any other type: an existing name has no such records.
    Other,
}

/// The answer to one question.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The name exists; these addresses (maybe none of the type asked: NODATA).
    Addresses(Vec<IpAddr>),
    /// The name exists; these TXT strings.
    Txt(Vec<String>),
    /// The name exists but has no records of the type asked.
    NoData,
    /// No such `.internal` name.
    NxDomain,
    /// Not under `.internal`: for the host's resolver.
    Forward,
}

/// What DNS answers from: the machines that answer, the apps with their organizations,
/// and this host's machines' addresses (to tell which organization asks).
#[derive(Clone, Debug, Default)]
pub struct Zone {
    host_id: String,
    region: String,
    /// Answering machines by app, each list in machine id order.
    members: BTreeMap<String, Vec<Member>>,
    /// App name → organization.
    apps: BTreeMap<String, String>,
    /// Addresses of this host's machines (any state) → their app.
    local: HashMap<IpAddr, String>,
}

impl Zone {
    /// The zone of host `host_id` in `region` from catalog rows.
    pub fn build(
        host_id: &str,
        region: &str,
        machines: &[MachineView],
        apps: &[AppRecord],
    ) -> Zone {
        let mut zone = Zone {
            host_id: host_id.to_string(),
            region: region.to_string(),
            apps: apps
                .iter()
                .map(|a| (a.name.clone(), a.org_slug.clone()))
                .collect(),
            ..Zone::default()
        };
        for view in machines.iter().filter(|v| !v.deleted) {
            let m = &view.record;
            let Some(ip) = m.private_ip.as_deref().and_then(|ip| ip.parse().ok()) else {
                continue;
            };
            if m.host_id == host_id {
                zone.local.insert(ip, m.app.clone());
            }
            let answers = m.state == "started"
                && view.host_status != "unreachable"
                && !m.checks.iter().any(|c| c.status == "critical");
            if answers {
                zone.members.entry(m.app.clone()).or_default().push(Member {
                    id: m.id.clone(),
                    app: m.app.clone(),
                    region: m.region.clone(),
                    host_id: m.host_id.clone(),
                    process_group: m.metadata.get(PROCESS_GROUP_KEY).cloned(),
                    ip,
                });
            }
        }
        for list in zone.members.values_mut() {
            list.sort_by(|a, b| a.id.cmp(&b.id));
        }
        zone
    }

    /// Who asks from `source`: the host on loopback, the organization of a machine of this
    /// host by its address, else nobody.
    pub fn viewer(&self, source: IpAddr) -> Viewer {
        if source.is_loopback() {
            return Viewer::Host;
        }
        match self.local.get(&source).and_then(|app| self.apps.get(app)) {
            Some(org) => Viewer::Org(org.clone()),
            None => Viewer::Nobody,
        }
    }

    /// Whether `viewer` may see app `app`.
    fn visible(&self, viewer: &Viewer, app: &str) -> bool {
        match viewer {
            Viewer::Host => self.apps.contains_key(app) || self.members.contains_key(app),
            Viewer::Org(org) => self.apps.get(app) == Some(org),
            Viewer::Nobody => false,
        }
    }

    /// The answer to `name` (with or without the final dot) for `kind`, asked by `viewer`.
    pub fn resolve(&self, name: &str, kind: Kind, viewer: &Viewer) -> Answer {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let labels: Vec<&str> = name.split('.').collect();
        let Some((&"internal", rest)) = labels.split_last() else {
            return Answer::Forward;
        };
        if *viewer == Viewer::Nobody {
            return Answer::NxDomain;
        }
        match rest {
            ["_apps"] => self.txt(kind, self.apps_txt(viewer)),
            ["_instances"] => self.txt(kind, self.instances_txt(viewer)),
            [app] => self.addresses(viewer, app, kind, |_| true),
            [region, app] => self.addresses(viewer, app, kind, |m| m.region == *region),
            [id, "vm", app] => {
                if !self.visible(viewer, app) || !self.members_of(app).any(|m| m.id == *id) {
                    // A stopped machine is not in the zone: its name does not answer.
                    return Answer::NxDomain;
                }
                self.addresses(viewer, app, kind, |m| m.id == *id)
            }
            [group, "process", app] => self.addresses(viewer, app, kind, |m| {
                m.process_group.as_deref() == Some(*group)
            }),
            [top, "nearest", "of", app] => {
                let Some(n) = top
                    .strip_prefix("top")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| *n > 0)
                else {
                    return Answer::NxDomain;
                };
                if !self.visible(viewer, app) {
                    return Answer::NxDomain;
                }
                let mut near: Vec<&Member> = self.members_of(app).collect();
                // Stable: machine id order within a rank.
                near.sort_by_key(|m| (m.host_id != self.host_id, m.region != self.region));
                let ips = near.into_iter().map(|m| m.ip).filter(|ip| fits(kind, ip));
                Self::address_answer(kind, ips.take(n).collect())
            }
            _ => Answer::NxDomain,
        }
    }

    fn members_of<'a>(&'a self, app: &str) -> impl Iterator<Item = &'a Member> + 'a {
        self.members.get(app).into_iter().flatten()
    }

    fn addresses(
        &self,
        viewer: &Viewer,
        app: &str,
        kind: Kind,
        keep: impl Fn(&Member) -> bool,
    ) -> Answer {
        if !self.visible(viewer, app) {
            return Answer::NxDomain;
        }
        let ips = self
            .members_of(app)
            .filter(|m| keep(m))
            .map(|m| m.ip)
            .filter(|ip| fits(kind, ip))
            .collect();
        Self::address_answer(kind, ips)
    }

    fn address_answer(kind: Kind, ips: Vec<IpAddr>) -> Answer {
        match kind {
            Kind::A | Kind::Aaaa | Kind::Addresses => Answer::Addresses(ips),
            Kind::Txt | Kind::Other => Answer::NoData,
        }
    }

    fn txt(&self, kind: Kind, value: String) -> Answer {
        match kind {
            Kind::Txt | Kind::Addresses => Answer::Txt(vec![value]),
            _ => Answer::NoData,
        }
    }

    fn apps_txt(&self, viewer: &Viewer) -> String {
        let names: Vec<&str> = self
            .apps
            .keys()
            .filter(|app| self.visible(viewer, app))
            .map(String::as_str)
            .collect();
        names.join(",")
    }

    fn instances_txt(&self, viewer: &Viewer) -> String {
        let items: Vec<String> = self
            .members
            .iter()
            .filter(|(app, _)| self.visible(viewer, app))
            .flat_map(|(_, list)| list)
            .map(|m| {
                format!(
                    "instance={},app={},ip={},region={}",
                    m.id, m.app, m.ip, m.region
                )
            })
            .collect();
        items.join(";")
    }
}

/// Whether an address is of the type asked.
fn fits(kind: Kind, ip: &IpAddr) -> bool {
    match kind {
        Kind::A => ip.is_ipv4(),
        Kind::Aaaa => ip.is_ipv6(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_catalog::{CheckRecord, MachineRecord};

    fn machine(
        id: &str,
        app: &str,
        region: &str,
        host: &str,
        ip: &str,
        state: &str,
    ) -> MachineView {
        MachineView {
            record: MachineRecord {
                id: id.into(),
                app: app.into(),
                region: region.into(),
                host_id: host.into(),
                state: state.into(),
                private_ip: Some(ip.into()),
                ..Default::default()
            },
            host_status: "ok",
            deleted: false,
            version: 1,
        }
    }

    fn app(name: &str, org: &str) -> AppRecord {
        AppRecord {
            name: name.into(),
            org_slug: org.into(),
            ..Default::default()
        }
    }

    /// Host `h1` in `ams`: web has m1 (h1, ams), m2 (h2, ams), m3 (h3, iad), m4 stopped;
    /// db (other org) has d1 on h1.
    fn zone() -> Zone {
        let mut m2 = machine("m2", "web", "ams", "h2", "10.0.2.2", "started");
        m2.record
            .metadata
            .insert(PROCESS_GROUP_KEY.into(), "worker".into());
        let mut m1 = machine("m1", "web", "ams", "h1", "10.0.1.1", "started");
        m1.record
            .metadata
            .insert(PROCESS_GROUP_KEY.into(), "app".into());
        Zone::build(
            "h1",
            "ams",
            &[
                machine("m3", "web", "iad", "h3", "fd00::3", "started"),
                m2,
                m1,
                machine("m4", "web", "ams", "h1", "10.0.1.4", "stopped"),
                machine("d1", "db", "ams", "h1", "10.0.1.9", "started"),
            ],
            &[app("web", "acme"), app("db", "other")],
        )
    }

    fn ips(list: &[&str]) -> Answer {
        Answer::Addresses(list.iter().map(|s| s.parse().unwrap()).collect())
    }

    const HOST: Viewer = Viewer::Host;

    #[test]
    fn every_name_form_answers_its_machines() {
        let z = zone();
        assert_eq!(
            z.resolve("web.internal", Kind::Addresses, &HOST),
            ips(&["10.0.1.1", "10.0.2.2", "fd00::3"])
        );
        assert_eq!(
            z.resolve("web.internal.", Kind::A, &HOST),
            ips(&["10.0.1.1", "10.0.2.2"])
        );
        assert_eq!(
            z.resolve("web.internal", Kind::Aaaa, &HOST),
            ips(&["fd00::3"])
        );
        assert_eq!(
            z.resolve("iad.web.internal", Kind::Addresses, &HOST),
            ips(&["fd00::3"])
        );
        assert_eq!(
            z.resolve("ams.web.internal", Kind::A, &HOST),
            ips(&["10.0.1.1", "10.0.2.2"])
        );
        assert_eq!(
            z.resolve("m2.vm.web.internal", Kind::A, &HOST),
            ips(&["10.0.2.2"])
        );
        assert_eq!(
            z.resolve("worker.process.web.internal", Kind::A, &HOST),
            ips(&["10.0.2.2"])
        );
        assert_eq!(
            z.resolve("app.process.web.internal", Kind::A, &HOST),
            ips(&["10.0.1.1"])
        );
        assert_eq!(
            z.resolve("_apps.internal", Kind::Txt, &HOST),
            Answer::Txt(vec!["db,web".into()])
        );
        let Answer::Txt(instances) = z.resolve("_instances.internal", Kind::Txt, &HOST) else {
            panic!("no TXT");
        };
        assert!(
            instances[0].contains("instance=m1,app=web,ip=10.0.1.1,region=ams;"),
            "{instances:?}"
        );
        assert_eq!(z.resolve("web.internal", Kind::Txt, &HOST), Answer::NoData);
        assert_eq!(z.resolve("_apps.internal", Kind::A, &HOST), Answer::NoData);
    }

    #[test]
    fn nearest_is_this_host_then_this_region_then_the_rest() {
        let z = zone();
        let all = Kind::Addresses;
        assert_eq!(
            z.resolve("top1.nearest.of.web.internal", all, &HOST),
            ips(&["10.0.1.1"])
        );
        assert_eq!(
            z.resolve("top2.nearest.of.web.internal", all, &HOST),
            ips(&["10.0.1.1", "10.0.2.2"])
        );
        assert_eq!(
            z.resolve("top9.nearest.of.web.internal", all, &HOST),
            ips(&["10.0.1.1", "10.0.2.2", "fd00::3"])
        );
        // Seen from h3 in iad: its own first, then the others (none in iad).
        let from_h3 = Zone::build(
            "h3",
            "iad",
            &[
                machine("m1", "web", "ams", "h1", "10.0.1.1", "started"),
                machine("m3", "web", "iad", "h3", "10.0.3.3", "started"),
                machine("m5", "web", "iad", "h5", "10.0.5.5", "started"),
            ],
            &[app("web", "acme")],
        );
        assert_eq!(
            from_h3.resolve("top2.nearest.of.web.internal", Kind::A, &HOST),
            ips(&["10.0.3.3", "10.0.5.5"])
        );
        assert_eq!(
            z.resolve("top0.nearest.of.web.internal", all, &HOST),
            Answer::NxDomain
        );
        assert_eq!(
            z.resolve("topx.nearest.of.web.internal", all, &HOST),
            Answer::NxDomain
        );
    }

    #[test]
    fn stopped_unhealthy_and_unreachable_machines_leave_the_answers() {
        let mut sick = machine("s1", "web", "ams", "h1", "10.0.1.5", "started");
        sick.record.checks.push(CheckRecord {
            name: "http".into(),
            status: "critical".into(),
            output: String::new(),
            updated_at_ms: 0,
        });
        let mut away = machine("a1", "web", "ams", "h2", "10.0.2.6", "started");
        away.host_status = "unreachable";
        let mut gone = machine("g1", "web", "ams", "h1", "10.0.1.7", "started");
        gone.deleted = true;
        let z = Zone::build(
            "h1",
            "ams",
            &[
                machine("m1", "web", "ams", "h1", "10.0.1.1", "started"),
                machine("m4", "web", "ams", "h1", "10.0.1.4", "stopped"),
                sick,
                away,
                gone,
            ],
            &[app("web", "acme")],
        );
        assert_eq!(
            z.resolve("web.internal", Kind::A, &HOST),
            ips(&["10.0.1.1"])
        );
        assert_eq!(
            z.resolve("m4.vm.web.internal", Kind::A, &HOST),
            Answer::NxDomain
        );
        assert_eq!(
            z.resolve("s1.vm.web.internal", Kind::A, &HOST),
            Answer::NxDomain
        );
        // An app whose machines are all stopped still exists: no addresses.
        let idle = Zone::build(
            "h1",
            "ams",
            &[machine("m4", "web", "ams", "h1", "10.0.1.4", "stopped")],
            &[app("web", "acme")],
        );
        assert_eq!(idle.resolve("web.internal", Kind::A, &HOST), ips(&[]));
    }

    #[test]
    fn unknown_internal_names_are_nxdomain_and_others_forwarded() {
        let z = zone();
        for name in [
            "nope.internal",
            "internal",
            "m9.vm.web.internal",
            "m1.vm.db.internal",
            "a.b.c.web.internal",
            "x.nearest.of.web.internal",
            "m1.other.web.internal",
        ] {
            assert_eq!(z.resolve(name, Kind::A, &HOST), Answer::NxDomain, "{name}");
        }
        for name in [
            "example.com",
            "example.com.",
            "internal.example.com",
            "internals",
        ] {
            assert_eq!(z.resolve(name, Kind::A, &HOST), Answer::Forward, "{name}");
        }
    }

    #[test]
    fn names_are_case_insensitive() {
        let z = zone();
        assert_eq!(
            z.resolve("WEB.Internal.", Kind::A, &HOST),
            ips(&["10.0.1.1", "10.0.2.2"])
        );
        assert_eq!(
            z.resolve("M2.VM.web.INTERNAL", Kind::A, &HOST),
            ips(&["10.0.2.2"])
        );
        assert_eq!(
            z.resolve("TOP1.Nearest.Of.Web.Internal", Kind::A, &HOST),
            ips(&["10.0.1.1"])
        );
    }

    #[test]
    fn a_machine_sees_only_its_organization() {
        let z = zone();
        // m1 (web, acme) asks from its address; d1 (db, other) from its own.
        let acme = z.viewer("10.0.1.1".parse().unwrap());
        assert_eq!(acme, Viewer::Org("acme".into()));
        assert_eq!(
            z.viewer("10.0.1.4".parse().unwrap()),
            Viewer::Org("acme".into())
        );
        assert_eq!(z.viewer("127.0.0.1".parse().unwrap()), Viewer::Host);
        assert_eq!(
            z.viewer("10.0.2.2".parse().unwrap()),
            Viewer::Nobody,
            "not this host's"
        );
        assert_eq!(
            z.resolve("web.internal", Kind::A, &acme),
            ips(&["10.0.1.1", "10.0.2.2"])
        );
        assert_eq!(z.resolve("db.internal", Kind::A, &acme), Answer::NxDomain);
        assert_eq!(
            z.resolve("_apps.internal", Kind::Txt, &acme),
            Answer::Txt(vec!["web".into()])
        );
        let other = z.viewer("10.0.1.9".parse().unwrap());
        assert_eq!(z.resolve("web.internal", Kind::A, &other), Answer::NxDomain);
        assert_eq!(
            z.resolve("db.internal", Kind::A, &other),
            ips(&["10.0.1.9"])
        );
        assert_eq!(
            z.resolve("web.internal", Kind::A, &Viewer::Nobody),
            Answer::NxDomain
        );
        assert_eq!(
            z.resolve("example.com", Kind::A, &Viewer::Nobody),
            Answer::Forward
        );
    }
}
