//! The pages as HTML, from data already read: no I/O, no clock. Every page is the same
//! frame ([`page`]) around a `<main id="live">` that the script swaps for a fresh copy when
//! the catalog says something on it changed. Text is escaped by maud.

use bazaar_catalog::{AppRecord, HostView, MachineView};
use maud::{html, Markup, DOCTYPE};
use serde_json::Value;
use std::collections::BTreeMap;

/// What the viewer may do: decided once per request by [`crate::access::may_act`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Viewer {
    /// False for a read-only token: no action is rendered.
    pub may_act: bool,
}

/// The frame of every page: navigation, the sign-out link and the script. `scope` says which
/// catalog changes make the page stale (read by the script from `data-live`): `all`,
/// `app:<name>`, `machine:<id>` or `none`.
pub fn page(title: &str, scope: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · bazaar" }
                link rel="stylesheet" href="/ui/assets/dashboard.css";
                link rel="icon" href="data:,";
                script src="/ui/assets/dashboard.js" defer {}
            }
            body data-live=(scope) {
                nav {
                    a.brand href="/ui/" { "bazaar" }
                    a href="/ui/" { "Fleet" }
                    a href="/ui/apps" { "Apps" }
                    a href="/ui/placements" { "Placements" }
                    span.spacer {}
                    span #readonly-banner hidden { "read-only" }
                    a #sign-out href="/ui/signin" { "Sign out" }
                }
                main #live { (body) }
            }
        }
    }
    .into_string()
}

/// The sign-in page: a token field; the script sends it to `/ui/session`.
pub fn sign_in(message: Option<&str>) -> String {
    page(
        "Sign in",
        "none",
        html! {
            h1 { "Sign in" }
            @if let Some(m) = message { p.error { (m) } }
            form #signin-form {
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
            p.hint { "Or open a link of the form " code { "/ui/#token=…" } " (as " code { "bazaar dev" } " prints)." }
        },
    )
}

/// A bar of `used` out of `total`, with its numbers. The fill's width is set by the script
/// from `data-pct`: the Content-Security-Policy allows no inline style.
fn capacity_bar(label: &str, used: u64, total: u64, unit: &str) -> Markup {
    let pct = (used * 100).checked_div(total).unwrap_or(0).min(100);
    html! {
        div.cap {
            span.caplabel { (label) }
            span.bar { span.fill data-pct=(pct) {} }
            span.capnum { (used) " / " (total) " " (unit) " committed" }
        }
    }
}

/// The fleet: hosts grouped by region with liveness, capacity bars and machine counts.
pub fn fleet(hosts: &[HostView], machines_per_host: &BTreeMap<String, usize>) -> String {
    let mut by_region: BTreeMap<&str, Vec<&HostView>> = BTreeMap::new();
    for h in hosts {
        by_region.entry(&h.record.region).or_default().push(h);
    }
    page(
        "Fleet",
        "all",
        html! {
            h1 { "Fleet" }
            p.summary { (hosts.len()) " hosts, " (machines_per_host.values().sum::<usize>()) " machines" }
            @for (region, hosts) in &by_region {
                section.region {
                    h2 { "Region " (region) }
                    table.hosts {
                        thead { tr { th { "host" } th { "liveness" } th { "capacity" } th { "machines" } th { "api" } } }
                        tbody {
                            @for h in hosts {
                                @let r = &h.record;
                                tr.host data-host=(r.id) {
                                    td { (r.id) @if r.draining { " " span.tag { "cordoned" } } }
                                    td { span class=(format!("status {}", h.status)) { (h.status) } }
                                    td {
                                        (capacity_bar("cpus", u64::from(r.capacity.cpus.saturating_sub(r.free.cpus)), u64::from(r.capacity.cpus), ""))
                                        (capacity_bar("memory", r.capacity.memory_mb.saturating_sub(r.free.memory_mb), r.capacity.memory_mb, "MB"))
                                    }
                                    td.count { (machines_per_host.get(&r.id).copied().unwrap_or(0)) }
                                    td { code { (r.api_addr) } }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// Every app with its machine counts (total, started).
pub fn apps(apps: &[AppRecord], counts: &BTreeMap<String, (usize, usize)>) -> String {
    page(
        "Apps",
        "all",
        html! {
            h1 { "Apps" }
            @if apps.is_empty() { p { "No apps yet." } }
            table.apps {
                thead { tr { th { "app" } th { "machines" } th { "started" } th { "created by" } } }
                tbody {
                    @for a in apps {
                        @let (total, started) = counts.get(&a.name).copied().unwrap_or((0, 0));
                        tr {
                            td { a href=(format!("/ui/apps/{}", a.name)) { (a.name) } }
                            td { (total) } td { (started) } td { code { (a.created_by_host) } }
                        }
                    }
                }
            }
        },
    )
}

/// A machine's health: its checks' worst status, or `-` without checks.
fn health(m: &MachineView) -> &str {
    let checks = &m.record.checks;
    if checks.is_empty() {
        return "-";
    }
    for worst in ["critical", "warning"] {
        if checks.iter().any(|c| c.status == worst) {
            return worst;
        }
    }
    "passing"
}

/// The action buttons of a machine (none for a read-only viewer).
fn actions(viewer: Viewer, app: &str, id: &str) -> Markup {
    html! {
        @if viewer.may_act {
            span.actions {
                @for action in ["start", "stop", "restart", "cordon", "destroy"] {
                    button.action data-action=(action) data-app=(app) data-machine=(id) { (action) }
                }
            }
        }
    }
}

/// One app: machines by process group and region, and its releases.
pub fn app(name: &str, machines: &[MachineView], viewer: Viewer) -> String {
    let mut groups: BTreeMap<(String, String), Vec<&MachineView>> = BTreeMap::new();
    let mut releases: BTreeMap<u64, usize> = BTreeMap::new();
    for m in machines {
        let group = m
            .record
            .metadata
            .get("fly_process_group")
            .cloned()
            .unwrap_or_else(|| "app".into());
        groups
            .entry((group, m.record.region.clone()))
            .or_default()
            .push(m);
        if let Some(v) = m
            .record
            .metadata
            .get("fly_release_version")
            .and_then(|v| v.parse().ok())
        {
            *releases.entry(v).or_default() += 1;
        }
    }
    page(
        name,
        &format!("app:{name}"),
        html! {
            h1 { "App " (name) }
            p.summary { (machines.len()) " machines" }
            @if machines.is_empty() { p { "No machines." } }
            @for ((group, region), ms) in &groups {
                section.group {
                    h2 { "Process group " (group) " · region " (region) }
                    table.machines {
                        thead { tr { th { "machine" } th { "name" } th { "state" } th { "health" } th { "release" } th { "host" } th { "runtime" } th {} } }
                        tbody {
                            @for m in ms {
                                @let r = &m.record;
                                tr.machine data-machine=(r.id) {
                                    td { a href=(format!("/ui/apps/{name}/machines/{}", r.id)) { code { (r.id) } } }
                                    td { (r.name) }
                                    td { span class=(format!("state {}", r.state)) data-state=(r.state) { (r.state) }
                                         @if r.cordoned { " " span.tag { "cordoned" } }
                                         @if m.host_status != "ok" { " " span.tag.warn { "host " (m.host_status) } } }
                                    td { (health(m)) }
                                    td { (r.metadata.get("fly_release_version").map_or("-", String::as_str)) }
                                    td { code { (r.host_id) } }
                                    td.runtime { (r.config.as_ref().map_or("-", |c| c.runtime())) }
                                    td { (actions(viewer, name, &r.id)) }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Releases" }
            @if releases.is_empty() { p { "No release recorded (machines made outside " code { "bazaar deploy" } ")." } }
            ul.releases { @for (v, n) in releases.iter().rev() { li { "v" (v) ": " (n) " machines" } } }
        },
    )
}

/// What the machine page shows, as the owner's API answered it.
#[derive(Debug, Default)]
pub struct MachineDetail<'a> {
    pub app: &'a str,
    pub id: &'a str,
    /// `GET /v1/apps/{app}/machines/{id}`.
    pub machine: Value,
    /// `GET .../events` (newest first or last; shown as given).
    pub events: Value,
    /// `GET .../placement`, or `None` when the machine has no placement record.
    pub placement: Option<Value>,
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS.mmm` (UTC).
pub fn utc(ms: u64) -> String {
    let (days, rem) = (ms / 86_400_000, ms % 86_400_000);
    // Civil date from a day count (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}.{milli:03}")
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// One machine: state and actions, config, events as a timeline, placement, log tail.
pub fn machine(d: &MachineDetail<'_>, viewer: Viewer) -> String {
    let m = &d.machine;
    let config = serde_json::to_string_pretty(&m["config"]).unwrap_or_default();
    let events = d.events.as_array().cloned().unwrap_or_default();
    page(
        d.id,
        &format!("machine:{}", d.id),
        html! {
            h1 { "Machine " code { (d.id) } }
            p {
                "app " a href=(format!("/ui/apps/{}", d.app)) { (d.app) }
                " · state " span class=(format!("state {}", text(&m["state"]))) data-state=(text(&m["state"])) { (text(&m["state"])) }
                " · region " (text(&m["region"])) " · host " code { (text(&m["host_id"])) }
                " · image " code { (text(&m["config"]["image"])) }
            }
            (actions(viewer, d.app, d.id))
            div.columns {
                section {
                    h2 { "Events" }
                    ol.timeline {
                        @for e in &events {
                            li { span.when { (e["timestamp"].as_u64().map_or_else(|| text(&e["timestamp"]), utc)) } " " b { (text(&e["type"])) } " " (text(&e["status"])) " " span.source { (text(&e["source"])) } }
                        }
                    }
                }
                section {
                    h2 { "Placement" }
                    (placement(d.placement.as_ref()))
                }
            }
            h2 { "Config" }
            pre.config { (config) }
            h2 { "Log" }
            pre #log data-log=(format!("/ui/apps/{}/machines/{}/logs", d.app, d.id)) {}
        },
    )
}

/// A placement record: the rounds, each host asked and its answer, the winners and why.
pub fn placement(record: Option<&Value>) -> Markup {
    let Some(p) = record else {
        return html! { p { "Created directly on its host, not through the market." } };
    };
    let winners: Vec<String> = p["winners"]
        .as_array()
        .map(|w| w.iter().map(text).collect())
        .unwrap_or_default();
    html! {
        p.reason { b { "Won by " (winners.join(", ")) } ": " (text(&p["reason"])) }
        @for (i, round) in p["rounds"].as_array().into_iter().flatten().enumerate() {
            h3 { "Round " (i + 1) " · regions " (round["regions"].as_array().map(|r| r.iter().map(text).collect::<Vec<_>>().join(",")).unwrap_or_default()) }
            table.bids {
                thead { tr { th { "host" } th { "answer" } th { "score / why" } th { "µs" } } }
                tbody {
                    @for ask in round["asked"].as_array().into_iter().flatten() {
                        @let host = text(&ask["host_id"]);
                        tr.winner[winners.contains(&host)] {
                            td { code { (host) } }
                            td { (text(&ask["outcome"])) }
                            td { @if let Some(s) = ask["score"].as_f64() { (format!("{s:.3}")) } @else { (ask["reason"].as_str().or(ask["error"].as_str()).unwrap_or("")) } }
                            td { (text(&ask["elapsed_us"])) }
                        }
                    }
                }
            }
        }
        @let excluded = p["excluded"].as_array().cloned().unwrap_or_default();
        @if !excluded.is_empty() {
            h3 { "Not asked" }
            ul { @for e in &excluded { li { (e.to_string()) } } }
        }
    }
}

/// The dry-run form and, once asked, the hosts that would bid.
pub fn placements(size: &str, region: &str, answer: Option<Result<&Value, &str>>) -> String {
    page(
        "Placements",
        "none",
        html! {
            h1 { "Placement dry run" }
            form.dryrun method="get" action="/ui/placements" {
                label { "size " input name="size" value=(size) placeholder="shared-cpu-1x"; }
                label { "region " input name="region" value=(region) placeholder="ams or ams,any"; }
                button type="submit" { "Ask the market" }
            }
            @match answer {
                None => {}
                Some(Err(why)) => p.error { (why) }
                Some(Ok(v)) => {
                    h2 { "Would be placed on" }
                    ul.would-win { @for (host, n) in v["hosts"].as_object().into_iter().flatten() { li { code { (host) } " × " (text(n)) } } }
                    (placement(Some(&v["placement"])))
                }
            }
        },
    )
}

/// A page for a failure (unknown app, an API error), with the API's message.
pub fn failure(title: &str, message: &str) -> String {
    page(
        title,
        "none",
        html! { h1 { (title) } p.error { (message) } },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(951_782_400_123), "2000-02-29 00:00:00.123");
        assert_eq!(utc(1_795_616_989_665), "2026-11-25 14:29:49.665");
    }

    /// The Content-Security-Policy (`shell::CONTENT_SECURITY_POLICY`) allows scripts and
    /// styles from files only: a page with an inline script, handler or style would break.
    #[test]
    fn pages_carry_no_inline_script_or_style() {
        let mut record = bazaar_catalog::HostRecord {
            id: "h1".into(),
            region: "ams".into(),
            ..Default::default()
        };
        record.capacity.cpus = 8;
        record.free.cpus = 2;
        let hosts = [HostView {
            record,
            status: bazaar_catalog::HostStatus::Alive,
            version: 1,
        }];
        let page = fleet(&hosts, &BTreeMap::new());
        assert!(page.contains("data-pct=\"75\""), "{page}");
        for page in [page, sign_in(Some("x")), failure("a", "b")] {
            assert!(!page.contains("style="), "{page}");
            // No event handler attribute (` onclick=`, ...).
            let handler = page.split(" on").skip(1).any(|rest| {
                let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
                name_len > 0 && rest[name_len..].starts_with('=')
            });
            assert!(!handler, "{page}");
            assert_eq!(
                page.matches("<script").count(),
                page.matches("<script src=").count(),
                "{page}"
            );
        }
    }

    #[test]
    fn text_is_escaped() {
        let html = failure("<b>", "<script>alert(1)</script>");
        assert!(!html.contains("<script>alert"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn read_only_viewer_gets_no_actions() {
        let m = MachineView {
            record: bazaar_catalog::MachineRecord {
                id: "m1".into(),
                app: "web".into(),
                state: "started".into(),
                ..Default::default()
            },
            host_status: "ok",
            deleted: false,
            version: 1,
        };
        let full = app("web", std::slice::from_ref(&m), Viewer { may_act: true });
        assert!(full.contains("data-action=\"stop\""));
        let read_only = app("web", &[m], Viewer { may_act: false });
        assert!(!read_only.contains("data-action"));
        assert!(read_only.contains("data-state=\"started\""));
    }
}
