//! The web dashboard (`/ui`) in a real browser: headless Chromium driven over WebDriver
//! (chromedriver) on a 3-host cluster. Sign-in by link and by form, the fleet, a machine
//! created through the API on its app's page, a stop through the API shown live (no
//! reload), the stop button, the machine and placement pages, and a console free of errors.
//! Screenshots of each page go to `target/dashboard-screenshots/` (CI artifacts).

use crate::common;

use bazaar_testkit::{free_port, start_cluster};
use common::*;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// chromedriver, in a process group of its own so that the browsers it starts go with it.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start() -> Driver {
        use std::os::unix::process::CommandExt;
        let port = free_port(std::net::Ipv4Addr::LOCALHOST);
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .process_group(0)
            .spawn()
            .expect("chromedriver is installed (scripts/test installs chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        bazaar_testkit::eventually(Duration::from_secs(20), || async {
            let r = reqwest::get(&status).await.ok()?;
            let v: Value = r.json().await.ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        })
        .await
        .expect("chromedriver ready");
        Driver { child, url }
    }

    async fn browser(&self) -> Client {
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--disable-breakpad", "--disable-crash-reporter",
                         "--window-size=1100,760"],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        bazaar_testkit::signal(-(self.child.id() as i32), libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// chromedriver's browser log (`POST /session/{id}/se/log`): the console's messages.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }
    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.into()))
    }
}

/// Console messages at level SEVERE (errors) since the last call.
async fn console_errors(browser: &Client) -> Vec<String> {
    let log = browser.issue_cmd(BrowserLog).await.expect("browser log");
    log.as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["level"] == "SEVERE")
        .map(|e| e["message"].to_string())
        .collect()
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    std::fs::write(screenshots_dir().join(format!("{name}.png")), png).unwrap();
}

/// The text of the first element matching `css`, if there is one.
async fn text_of(browser: &Client, css: &str) -> Option<String> {
    let el = browser.find(Locator::Css(css)).await.ok()?;
    el.text().await.ok()
}

/// Waits (at most `within`) until the text of element `css` passes `ok`; the time it took.
async fn until(
    browser: &Client,
    css: &str,
    ok: impl Fn(&str) -> bool,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        if text_of(browser, css).await.is_some_and(|t| ok(&t)) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{css} never passed within {within:?}; it shows {:?}",
            text_of(browser, css).await
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Clicks element `css`, found afresh: the page re-renders a row whenever its machine's
/// catalog row changes, so an element found a moment earlier may be gone (stale) by the
/// click; a stale one is looked up again, for at most 5 s.
async fn click(browser: &Client, css: &str) {
    let start = Instant::now();
    loop {
        let clicked = match browser.find(Locator::Css(css)).await {
            Ok(el) => el.click().await,
            Err(e) => Err(e),
        };
        match clicked {
            Ok(()) => return,
            // Only a stale or missing element is tried again (never a click that may have
            // landed).
            Err(e)
                if start.elapsed() < Duration::from_secs(5)
                    && (e.to_string().contains("stale element") || e.is_no_such_element()) =>
            {
                eprintln!("clicking {css} again: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("clicking {css}: {e}"),
        }
    }
}

/// Waits (at most `within`) until the element `css` shows `want`; the time it took.
async fn until_text(browser: &Client, css: &str, want: &str, within: Duration) -> Duration {
    until(browser, css, |t| t == want, within).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_browser() {
    let token = "dashboard-test-token-0123456789";
    let tokens = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tokens.path(), format!("{token}\n")).unwrap();
    let regions = ["ams", "ord", "ams"];
    let agents = start_cluster(std::path::Path::new(EXE), 3, |i, o| {
        o.region = regions[i].into();
        o.extra_args
            .extend(["--token-file".into(), tokens.path().display().to_string()]);
    })
    .unwrap();
    let ui = format!("{}/ui", agents[0].url());
    let fly = Fly::new(&agents[0]);
    let mut host_ids = Vec::new();
    for a in &agents {
        host_ids.push(a.client().info().await.unwrap().id);
    }
    // Every host is in this node's catalog before the fleet page is looked at.
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, v) = fly.get("/platform/regions").await;
        let hosts: u64 = v["regions"]
            .as_array()?
            .iter()
            .filter_map(|r| r["hosts"].as_u64())
            .sum();
        (hosts == 3).then_some(())
    })
    .await
    .expect("3 hosts in the catalog");

    let driver = Driver::start().await;
    let browser = driver.browser().await;

    // Not signed in: the sign-in page. A wrong token is refused with a message.
    browser.goto(&format!("{ui}/")).await.unwrap();
    screenshot(&browser, "signin").await;
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys("not-a-token")
        .await
        .unwrap();
    browser
        .find(Locator::Css("#signin-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The message says why (here: a token no key signed).
    until(
        &browser,
        "#flash",
        |t| t.starts_with("this token is not accepted here"),
        Duration::from_secs(5),
    )
    .await;
    // A 401 answer is logged by Chromium as a failed resource: expected here, cleared.
    console_errors(&browser).await;

    // A link carrying the token in its fragment signs in at once, and the fragment is gone.
    browser
        .goto(&format!("{ui}/apps#token={token}"))
        .await
        .unwrap();
    until_text(&browser, "main h1", "Apps", Duration::from_secs(5)).await;
    let url = browser.current_url().await.unwrap();
    assert_eq!(
        url.fragment(),
        None,
        "the token stays out of the address bar"
    );

    // Sign out, then in with the form.
    browser.goto(&format!("{ui}/signin")).await.unwrap();
    browser.goto(&format!("{ui}/")).await.unwrap();
    until_text(&browser, "main h1", "Sign in", Duration::from_secs(5)).await;
    let field = browser.find(Locator::Css("#token")).await.unwrap();
    field.send_keys(token).await.unwrap();
    browser
        .find(Locator::Css("#signin-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_text(&browser, "main h1", "Fleet", Duration::from_secs(5)).await;

    // The fleet lists every host, grouped by region, each alive.
    let rows = browser.find_all(Locator::Css("tr.host")).await.unwrap();
    assert_eq!(rows.len(), 3, "one row per host");
    for id in &host_ids {
        let status = text_of(&browser, &format!("tr[data-host='{id}'] .status")).await;
        assert_eq!(status.as_deref(), Some("alive"), "host {id}");
    }
    let region_titles = browser
        .find_all(Locator::Css("section.region h2"))
        .await
        .unwrap();
    assert_eq!(region_titles.len(), 2, "ams and ord");
    screenshot(&browser, "fleet").await;

    // A machine created through the API appears on its app's page, started.
    fly.create_app("web").await;
    let (s, m) = fly
        .post(
            "/apps/web/machines",
            json!({"region": "ams", "config": {"image": "process", "driver": "process",
                "init": {"exec": ["sh", "-c", "echo hello from the machine; exec sleep 1000"]},
                "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}}),
        )
        .await;
    assert!(s.is_success(), "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state("web", &id, "started").await;
    browser.goto(&format!("{ui}/apps/web")).await.unwrap();
    let state = format!("tr[data-machine='{id}'] .state");
    until_text(&browser, &state, "started", Duration::from_secs(5)).await;
    screenshot(&browser, "app").await;

    // Stopped through the API: shown stopped within 2 s, without a reload.
    browser
        .execute("window.bazaarSamePage = true;", vec![])
        .await
        .unwrap();
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/stop"), json!({}))
        .await;
    assert!(s.is_success(), "{v}");
    let took = until_text(&browser, &state, "stopped", Duration::from_secs(2)).await;
    eprintln!("stopped through the API: on screen after {took:?}");
    let same = browser
        .execute("return window.bazaarSamePage === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!(true), "the page was not reloaded");

    // The start and stop buttons work (and the page follows without a reload).
    let button = |action: &str| format!("tr[data-machine='{id}'] button[data-action='{action}']");
    click(&browser, &button("start")).await;
    fly.wait_state("web", &id, "started").await;
    until_text(&browser, &state, "started", Duration::from_secs(5)).await;
    click(&browser, &button("stop")).await;
    fly.wait_state("web", &id, "stopped").await;
    until_text(&browser, &state, "stopped", Duration::from_secs(5)).await;
    let (_, v) = fly.get(&format!("/apps/web/machines/{id}")).await;
    assert_eq!(
        v["state"], "stopped",
        "the button stopped the machine itself"
    );

    // The machine page: its events, why it was placed where it is, its log.
    browser
        .goto(&format!("{ui}/apps/web/machines/{id}"))
        .await
        .unwrap();
    until_text(
        &browser,
        "main h1",
        &format!("Machine {id}"),
        Duration::from_secs(5),
    )
    .await;
    let events = browser
        .find_all(Locator::Css(".timeline li"))
        .await
        .unwrap();
    assert!(events.len() >= 3, "launch, start, stop... {}", events.len());
    let reason = text_of(&browser, ".reason").await.unwrap_or_default();
    assert!(reason.starts_with("Won by "), "{reason}");
    let host = v["host_id"].as_str().unwrap();
    assert!(reason.contains(host), "{reason} names the owner {host}");
    until(
        &browser,
        "#log",
        |t| t.contains("hello from the machine"),
        Duration::from_secs(5),
    )
    .await;
    screenshot(&browser, "machine").await;

    // A placement dry run: which hosts would bid for a machine in ord.
    browser
        .goto(&format!("{ui}/placements?size=shared-cpu-1x&region=ord"))
        .await
        .unwrap();
    let would = text_of(&browser, ".would-win").await.unwrap_or_default();
    assert!(would.contains(&host_ids[1]), "{would} names the ord host");
    screenshot(&browser, "placements").await;

    browser.goto(&format!("{ui}/apps")).await.unwrap();
    assert!(text_of(&browser, "table.apps")
        .await
        .unwrap()
        .contains("web"));
    screenshot(&browser, "apps").await;

    // A read-only token sees everything and has no working action.
    let read_only = bazaar_testkit::tokens::mint(&bazaar_auth::Scope {
        read_only: true,
        ..Default::default()
    });
    browser
        .goto(&format!("{ui}/apps/web#token={read_only}"))
        .await
        .unwrap();
    until_text(&browser, &state, "stopped", Duration::from_secs(5)).await;
    let actions = browser
        .find_all(Locator::Css("button[data-action]"))
        .await
        .unwrap();
    assert!(actions.is_empty(), "{} action buttons", actions.len());
    screenshot(&browser, "app-read-only").await;
    // A token limited to some apps cannot see the whole fleet: it is not signed in.
    let app_only = bazaar_testkit::tokens::mint(&bazaar_auth::Scope {
        apps: ["web".to_string()].into(),
        ..Default::default()
    });
    let status = reqwest::Client::new()
        .get(format!("{ui}/apps"))
        .header("cookie", format!("bazaar_ui={app_only}"))
        .send()
        .await
        .unwrap();
    let body = status.text().await.unwrap();
    assert!(!body.contains(&id), "an app-scoped token sees no machine");

    let errors = console_errors(&browser).await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    browser.close().await.unwrap();
}
