//! Deploys end to end (issue 6, acceptance 1 and 2) on 3 agents in 2 regions, through the
//! `bazaar` CLI: a first deploy of 3 machines over ams and ord with an HTTP service and a
//! health check, then new releases with the rolling, bluegreen and canary strategies while a
//! bounded load generator goes through the proxies (zero failed requests), then a release
//! whose check never passes (the deploy fails, exits non-zero, rolls back by itself, traffic
//! served throughout), the release history and a rollback to an older release.

use crate::deploy_support;

use deploy_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strategies_keep_serving_and_a_failed_release_rolls_back() {
    let env = Env::start();
    let app = "web";

    // v1: 3 machines over ams and ord.
    let v1 = env.write_config(app, 1, true, "");
    let (ok, out, err) = env.cli_json(&[
        "deploy",
        "-c",
        v1.to_str().unwrap(),
        "--count",
        "3",
        "--regions",
        "ams,ord",
    ]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(out["release"], 1, "{out}");
    assert_eq!(
        out["report"]["created"].as_array().unwrap().len(),
        3,
        "{out}"
    );
    let ms = env.machines(app).await;
    assert_eq!(regions(&ms).get("ams"), Some(&2), "{ms:#?}");
    assert_eq!(regions(&ms).get("ord"), Some(&1), "{ms:#?}");
    for m in &ms {
        assert_eq!(m["config"]["metadata"]["fly_process_group"], "app");
        assert_eq!(m["config"]["metadata"]["fly_platform_version"], "v2");
        assert_eq!(m["state"], "started");
    }
    env.wait_routable(app).await;

    // v2 rolling, v3 bluegreen, v4 canary, each under load: nothing fails.
    for (version, strategy) in [(2u32, "rolling"), (3, "bluegreen"), (4, "canary")] {
        let path = env.write_config(app, version, true, "");
        let load = Load::start(&env, app, 4);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let args = [
            "deploy".to_string(),
            "-c".into(),
            path.display().to_string(),
            "--strategy".into(),
            strategy.into(),
        ];
        let env_ref = &env;
        let (ok, out, err) = tokio::task::block_in_place(|| {
            env_ref.cli_json(&args.iter().map(String::as_str).collect::<Vec<_>>())
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let seen = load.finish().await;
        assert!(ok, "{strategy}: {out}\n{err}");
        assert_eq!(out["report"]["ok"], true, "{out}");
        assert_eq!(out["release"], version, "{out}");
        assert_eq!(
            seen.failed,
            0,
            "{strategy}: {} failed of {}: {:?}",
            seen.failed,
            seen.ok + seen.failed,
            seen.failures
        );
        assert!(seen.ok > 50, "{strategy}: too little load: {seen:?}");
        assert!(
            seen.versions.contains(&version.to_string()),
            "{strategy}: the new release never answered: {seen:?}"
        );
        let ms = env.machines(app).await;
        let want: Vec<(String, String)> = vec![(version.to_string(), version.to_string()); 3];
        assert_eq!(versions(&ms), want, "{strategy}");
        assert_eq!(regions(&ms).get("ams"), Some(&2), "{strategy}");
        assert_eq!(regions(&ms).get("ord"), Some(&1), "{strategy}");
        if strategy == "bluegreen" {
            assert_eq!(
                out["report"]["created"].as_array().unwrap().len(),
                3,
                "{out}"
            );
            assert_eq!(
                out["report"]["destroyed"].as_array().unwrap().len(),
                3,
                "{out}"
            );
        } else {
            assert_eq!(
                out["report"]["updated"].as_array().unwrap().len(),
                3,
                "{out}"
            );
        }
        assert!(ms.iter().all(|m| m["cordoned"] == false), "{ms:#?}");
    }

    // v5: its check never passes. The deploy fails, exits 1, rolls back to v4 by itself,
    // and traffic is served throughout.
    let v5 = env.write_config(app, 5, false, "");
    let load = Load::start(&env, app, 4);
    let (ok, out, _) = tokio::task::block_in_place(|| {
        env.cli_json(&[
            "deploy",
            "-c",
            v5.to_str().unwrap(),
            "--strategy",
            "rolling",
            "--wait-timeout",
            "4s",
        ])
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let seen = load.finish().await;
    assert!(!ok, "a failing release must exit non-zero: {out}");
    let r = &out["report"];
    assert_eq!(r["ok"], false, "{out}");
    assert_eq!(r["rolled_back"], true, "{out}");
    assert!(
        r["error"].as_str().unwrap().contains("health checks"),
        "{out}"
    );
    assert!(
        r["failed_machine"].is_string() && r["failed_region"].is_string(),
        "{out}"
    );
    assert_eq!(seen.failed, 0, "{:?}", seen.failures);
    assert!(!seen.versions.contains("5"), "{seen:?}");
    let ms = env.machines(app).await;
    assert_eq!(versions(&ms), vec![("4".into(), "4".into()); 3]);
    assert!(ms.iter().all(|m| m["cordoned"] == false), "{ms:#?}");
    // Without --json it says what failed, on stderr, and exits 1.
    let (ok, _, err) = tokio::task::block_in_place(|| {
        env.cli(&["deploy", "-c", v5.to_str().unwrap(), "--wait-timeout", "2s"])
    });
    assert!(!ok);
    assert!(
        err.contains("deploy failed") && err.contains("rolled back"),
        "{err}"
    );

    // The history: v4 runs, v5 (and v6) failed; v1-v3 superseded.
    let (ok, hist, err) = env.cli_json(&["releases", "-a", app]);
    assert!(ok, "{err}");
    let status = |v: u64| {
        hist.as_array()
            .unwrap()
            .iter()
            .find(|r| r["version"] == v)
            .map(|r| r["status"].as_str().unwrap().to_string())
    };
    assert_eq!(status(4).as_deref(), Some("deployed"), "{hist:#}");
    assert_eq!(status(5).as_deref(), Some("failed"), "{hist:#}");
    assert_eq!(status(2).as_deref(), Some("superseded"), "{hist:#}");

    // rollback 2: release 2's config again, as a new release.
    let (ok, out, err) =
        tokio::task::block_in_place(|| env.cli_json(&["rollback", "2", "-a", app]));
    assert!(ok, "{out}\n{err}");
    let n = out["release"].as_u64().unwrap();
    assert!(n >= 6, "{out}");
    let ms = env.machines(app).await;
    assert_eq!(versions(&ms), vec![(n.to_string(), "2".into()); 3]);
    env.wait_routable(app).await;
}
