//! Scaling and the app config file through the CLI (issue 6, acceptance 3 and 4): scale to
//! zero and back, across regions, `scale vm`; the immediate strategy; `--dry-run` changes nothing; a realistic
//! fly.toml loads and plans; a broken one gives file:line:col errors; app status and logs.

use crate::deploy_support;

use deploy_support::*;
use serde_json::Value;
use std::time::Duration;

fn ids_and_versions(ms: &[Value]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = ms
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["instance_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

const FLY_TOML: &str = r#"
# fly.toml app configuration file generated for web
app = "web"
primary_region = "ams"
kill_signal = "SIGINT"
kill_timeout = "5s"
console_command = "bin/rails console"

[build]
  image = "registry.fly.io/web:deployment-01HQXYZ"

[env]
  PORT = "8080"
  LOG_LEVEL = "info"

[processes]
  web = "bin/rails server -b 0.0.0.0 -p 8080"
  worker = "bundle exec sidekiq"

[http_service]
  internal_port = 8080
  force_https = true
  auto_stop_machines = "stop"
  auto_start_machines = true
  min_machines_running = 0
  processes = ["web"]
  [http_service.concurrency]
    type = "requests"
    soft_limit = 200
    hard_limit = 250
  [[http_service.checks]]
    grace_period = "10s"
    interval = "30s"
    method = "GET"
    timeout = "5s"
    path = "/up"

[checks]
  [checks.alive]
    type = "tcp"
    port = 8080
    interval = "15s"
    timeout = "2s"
    grace_period = "5s"
    processes = ["web"]

[[vm]]
  memory = "1gb"
  cpu_kind = "shared"
  cpus = 2
  processes = ["web"]

[[vm]]
  size = "shared-cpu-1x"
  processes = ["worker"]

[deploy]
  strategy = "rolling"
  max_unavailable = 0.33

[[restart]]
  policy = "on-failure"
  retries = 3
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scale_to_zero_and_back_across_regions_and_dry_runs_change_nothing() {
    let env = Env::start();
    let app = "web";
    let v1 = env.write_config(app, 1, true, "");
    let v1 = v1.to_str().unwrap();
    let (ok, out, err) = env.cli_json(&["deploy", "-c", v1, "--count", "2"]);
    assert!(ok, "{out}\n{err}");
    let ms = env.machines(app).await;
    assert_eq!(regions(&ms).get("ams"), Some(&2), "primary_region: {ms:#?}");
    let before = ids_and_versions(&ms);

    // Dry runs: a new release and a scale show their plan and change nothing.
    let v2 = env.write_config(app, 2, true, "");
    let (ok, out, err) = env.cli_json(&["deploy", "-c", v2.to_str().unwrap(), "--dry-run"]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(out["dry_run"], true);
    assert_eq!(
        out["plan"]["steps"][0]["update"].as_array().unwrap().len(),
        2,
        "{out}"
    );
    assert!(out.get("report").is_none(), "{out}");
    let (ok, text, err) = env.cli(&["scale", "count", "5", "-a", app, "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        text.contains("create 3") && text.contains("dry run"),
        "{text}"
    );
    // A dry run of a new app plans its machines and creates nothing, not even the app.
    let fresh = env.write_config("fresh", 1, true, "");
    let (ok, out, err) = env.cli_json(&[
        "deploy",
        "-c",
        fresh.to_str().unwrap(),
        "--count",
        "2",
        "--dry-run",
    ]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(out["plan"]["steps"][0]["create"], 2, "{out}");
    let apps = env.api("/apps").await;
    assert!(
        !apps["apps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "fresh"),
        "{apps}"
    );
    // A realistic fly.toml loads (with a warning for a key that changes nothing) and
    // plans; keys bazaar cannot honour stop it, each named.
    let fly = env.dir.path().join("fly.toml");
    std::fs::write(
        &fly,
        format!("swap_size_mb = 512\n{FLY_TOML}\n[[statics]]\n  guest_path = \"/rails/public\"\n  url_prefix = \"/\"\n"),
    )
    .unwrap();
    let (ok, _, err) = env.cli(&["deploy", "-c", fly.to_str().unwrap(), "--dry-run"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("`swap_size_mb`") && err.contains("`statics`"),
        "{err}"
    );
    std::fs::write(&fly, FLY_TOML).unwrap();
    let (ok, out, err) = env.cli_json(&["deploy", "-c", fly.to_str().unwrap(), "--dry-run"]);
    assert!(ok, "{out}\n{err}");
    assert!(err.contains("`console_command`"), "{err}");
    let groups: Vec<&str> = out["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["group"].as_str().unwrap())
        .collect();
    assert_eq!(groups, vec!["app", "web", "worker"], "{out}");
    assert_eq!(ids_and_versions(&env.machines(app).await), before);

    // A file that builds from a Dockerfile deploys an image built elsewhere with
    // `--image`, as `fly deploy --image` does (the build itself: deploy_build.rs).
    let dockerfile = FLY_TOML.replace(
        "image = \"registry.fly.io/web:deployment-01HQXYZ\"",
        "dockerfile = \"Dockerfile\"",
    );
    std::fs::write(&fly, &dockerfile).unwrap();
    // Without --image it is built (a dry run plans without building) and pushed to the
    // cluster's registry; with no Dockerfile here, the build fails and nothing changes.
    let (ok, _, err) = env.cli(&["deploy", "-c", fly.to_str().unwrap(), "--dry-run"]);
    assert!(ok, "{err}");
    let (ok, _, err) = env.cli(&["deploy", "-c", fly.to_str().unwrap()]);
    assert!(!ok && err.contains("Dockerfile"), "{err}");
    assert_eq!(ids_and_versions(&env.machines(app).await), before);
    let built = "registry.example.com/web:built-elsewhere";
    let (ok, out, err) = env.cli_json(&[
        "deploy",
        "-c",
        fly.to_str().unwrap(),
        "--image",
        built,
        "--dry-run",
    ]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out["plan"]["steps"].as_array().map(Vec::len),
        Some(3),
        "{out}"
    );
    assert_eq!(ids_and_versions(&env.machines(app).await), before);

    // A broken file: file, line and column, and what is wrong.
    let broken = env.dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        "app = \"web\"\n[build]\n  driver = \"process\"\n[deploy]\n  strategy = \"fast\"\n",
    )
    .unwrap();
    let (ok, _, err) = env.cli(&["deploy", "-c", broken.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("broken.toml:5:14:") && err.contains("fast"),
        "{err}"
    );
    std::fs::write(&broken, "app = \"web\"\n[[vm]]\n  memory = \"lots\"\n").unwrap();
    let (ok, _, err) = env.cli(&["deploy", "-c", broken.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("broken.toml:3:") && err.contains("lots"),
        "{err}"
    );

    // Across regions: 4 over ams and ord, then 2 in ord only.
    let (ok, out, err) = env.cli_json(&["scale", "count", "4", "--region", "ams,ord", "-a", app]);
    assert!(ok, "{out}\n{err}");
    let ms = env.machines(app).await;
    assert_eq!(regions(&ms).get("ams"), Some(&2), "{ms:#?}");
    assert_eq!(regions(&ms).get("ord"), Some(&2), "{ms:#?}");
    assert!(ms.iter().all(|m| m["state"] == "started"));
    assert_eq!(versions(&ms), vec![("1".into(), "1".into()); 4]);
    let (ok, out, err) = env.cli_json(&["scale", "count", "2", "--region", "ord", "-a", app]);
    assert!(ok, "{out}\n{err}");
    // The list is this node's catalog: a machine destroyed on another host leaves it once
    // that host's row arrives.
    let ms = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let ms = env.machines(app).await;
        (regions(&ms).len() == 1).then_some(ms)
    })
    .await
    .expect("only ord's machines are listed");
    assert_eq!(regions(&ms).len(), 1, "{ms:#?}");
    assert_eq!(regions(&ms).get("ord"), Some(&2), "{ms:#?}");

    // To zero and back: the config comes from the release history.
    let (ok, out, err) = env.cli_json(&["scale", "count", "0", "-a", app]);
    assert!(ok, "{out}\n{err}");
    assert!(env.machines(app).await.is_empty());
    let (ok, out, err) = env.cli_json(&["scale", "count", "3", "--region", "ams,ord", "-a", app]);
    assert!(ok, "{out}\n{err}");
    let ms = env.machines(app).await;
    assert_eq!(ms.len(), 3);
    assert_eq!(regions(&ms).get("ams"), Some(&2), "{ms:#?}");
    assert_eq!(versions(&ms), vec![("1".into(), "1".into()); 3]);
    env.wait_routable(app).await;

    // scale vm: every machine gets the new size, rolling.
    let (ok, out, err) = env.cli_json(&["scale", "vm", "shared-cpu-2x", "-a", app]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out["report"]["updated"].as_array().unwrap().len(),
        3,
        "{out}"
    );
    let ms = env.machines(app).await;
    assert!(
        ms.iter()
            .all(|m| m["config"]["guest"]["cpus"] == 2 && m["state"] == "started"),
        "{ms:#?}"
    );

    // immediate: every machine at once (not health-gated, but started).
    let (ok, out, err) = env.cli_json(&[
        "deploy",
        "-c",
        v2.to_str().unwrap(),
        "--strategy",
        "immediate",
    ]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out["report"]["updated"].as_array().unwrap().len(),
        3,
        "{out}"
    );
    let ms = env.machines(app).await;
    assert_eq!(versions(&ms), vec![("2".into(), "2".into()); 3]);
    assert!(ms.iter().all(|m| m["state"] == "started"), "{ms:#?}");
    env.wait_routable(app).await;
    // Not gated: checks pass a little later.
    bazaar_testkit::eventually(std::time::Duration::from_secs(20), || async {
        let ms = env.machines(app).await;
        ms.iter()
            .all(|m| {
                m["checks"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["status"] == "passing"))
            })
            .then_some(())
    })
    .await
    .expect("checks pass");

    // A stopped machine (say, autostopped) gets the new config but stays stopped.
    let stopped = ms[0]["id"].as_str().unwrap().to_string();
    let r = env
        .http
        .post(format!(
            "{}/v1/apps/{app}/machines/{stopped}/stop",
            env.agents[0].url()
        ))
        .bearer_auth(bazaar_testkit::api_token())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    bazaar_testkit::eventually(std::time::Duration::from_secs(20), || async {
        let m = env.api(&format!("/apps/{app}/machines/{stopped}")).await;
        (m["state"] == "stopped").then_some(())
    })
    .await
    .expect("stopped");
    let v3 = env.write_config(app, 3, true, "");
    let (ok, out, err) = env.cli_json(&["deploy", "-c", v3.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    let ms = env.machines(app).await;
    assert_eq!(versions(&ms), vec![("3".into(), "3".into()); 3]);
    for m in &ms {
        let want = if m["id"] == stopped.as_str() {
            "stopped"
        } else {
            "started"
        };
        assert_eq!(m["state"], want, "{m:#}");
    }

    // Status and logs of the whole app.
    let (ok, text, err) = env.cli(&["app-status", "-a", app]);
    assert!(ok, "{err}");
    assert!(
        text.contains("ams") && text.contains("ord") && text.contains("v3"),
        "{text}"
    );
    assert!(
        text.contains("1/1 passing") && text.contains("stopped"),
        "{text}"
    );
    let (ok, st, err) = env.cli_json(&["app-status", "-a", app]);
    assert!(ok, "{err}");
    assert_eq!(st["machines"].as_array().unwrap().len(), 3);
    // Start it again for the logs below.
    let r = env
        .http
        .post(format!(
            "{}/v1/apps/{app}/machines/{stopped}/start",
            env.agents[0].url()
        ))
        .bearer_auth(bazaar_testkit::api_token())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (ok, text, err) = env.cli(&["logs", "-a", app]);
    assert!(ok, "{err}");
    let serving = text
        .lines()
        .filter(|l| l.contains("serving version"))
        .count();
    assert!(serving >= 3, "{text}");
}
