//! fly.toml files shaped like real apps' (`fixtures/ok`: rails, phoenix, django, node,
//! go, a bazaar process app; `[mounts]` and `[[mounts]]` in each form) parse and plan, and
//! files with a key bazaar cannot honour (`fixtures/refused`) are refused with an error
//! that names it. Each fixture says what is expected in a comment: `# expect: groups=a,b
//! mount=GROUP:NAME:PATH:GB nomount=GROUP` or `# refused: TEXT`.

use bazaar_deploy::config::{load, parse, AppConfig};
use bazaar_deploy::plan::{plan, Existing, GroupTarget};
use bazaar_deploy::volumes;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixtures(kind: &str) -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind);
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 5, "fixtures in {}", dir.display());
    out
}

/// The value after `# {tag}: ` in a fixture.
fn expectation<'a>(text: &'a str, tag: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("# {tag}: ")))
        .unwrap_or_else(|| panic!("no `# {tag}:` line"))
}

fn targets(c: &AppConfig) -> BTreeMap<String, GroupTarget> {
    c.groups()
        .into_iter()
        .map(|g| {
            let mut config = c.machine_config(&g).unwrap();
            config
                .metadata
                .insert(bazaar_deploy::META_RELEASE.into(), "1".into());
            let region = c.primary_region.clone().unwrap_or_default();
            (
                g,
                GroupTarget {
                    config,
                    regions: BTreeMap::from([(region, 2)]),
                },
            )
        })
        .collect()
}

#[test]
fn real_world_files_parse_mount_their_volumes_and_plan() {
    for (path, text) in fixtures("ok") {
        let name = path.display().to_string();
        let loaded = load(&path).unwrap_or_else(|e| panic!("{e}"));
        let c = &loaded.config;
        let expect = expectation(&text, "expect");
        for item in expect.split_whitespace() {
            let (what, value) = item.split_once('=').unwrap();
            match what {
                "groups" => assert_eq!(c.groups().join(","), value, "{name}"),
                "mount" => {
                    let v: Vec<&str> = value.split(':').collect();
                    let cfg = c.machine_config(v[0]).unwrap();
                    let w = volumes::wanted(&cfg).unwrap_or_else(|| panic!("{name}: {v:?}"));
                    assert_eq!(
                        (
                            w.name.as_str(),
                            w.path.as_str(),
                            w.size_gb.to_string().as_str()
                        ),
                        (v[1], v[2], v[3]),
                        "{name}"
                    );
                    assert!(bazaar_types::volume::mount_of(&cfg).is_err(), "no id yet");
                }
                "files" => {
                    let (g, paths) = value.split_once(':').unwrap();
                    let files = c.machine_config(g).unwrap().files;
                    let got: Vec<&str> = files.iter().map(|f| f.guest_path.as_str()).collect();
                    assert_eq!(got.join(","), paths, "{name}");
                }
                "nomount" => {
                    assert!(c.machine_config(value).unwrap().mounts.is_empty(), "{name}")
                }
                other => panic!("{name}: unknown expectation {other}"),
            }
        }

        // A first deploy creates two machines per group; a second one of the same file
        // keeps them all, each with the volume it got.
        let t = targets(c);
        let first = plan(&t, &[]);
        assert_eq!(first.totals(), (2 * t.len(), 0, 0, 0), "{name}");
        for (step, line) in first.steps.iter().zip(first.lines()) {
            let w = volumes::wanted(&t[&step.group].config);
            let said = w.map(|w| format!("{} at {}", w.name, w.path));
            assert_eq!(step.volume, said, "{name}");
            if let Some(v) = &step.volume {
                assert!(line.ends_with(&format!("(each with volume {v})")), "{line}");
            }
        }
        let mut existing = Vec::new();
        for (g, target) in &t {
            for i in 0..2 {
                let config = match volumes::wanted(&target.config) {
                    Some(_) => volumes::mount_on(&target.config, &format!("vol_{g}{i}")),
                    None => target.config.clone(),
                };
                assert!(
                    bazaar_types::volume::mount_of(&config).is_ok(),
                    "{name}: {config:?}"
                );
                existing.push(Existing {
                    id: format!("{g}{i}"),
                    group: g.clone(),
                    region: c.primary_region.clone().unwrap_or_default(),
                    state: "started".into(),
                    config,
                });
            }
        }
        volumes::check(&t, &existing).unwrap_or_else(|e| panic!("{name}: {e}"));
        let again = plan(&t, &existing);
        assert_eq!(again.totals(), (0, 0, 2 * t.len(), 0), "{name}");
        // A change of env updates them in place, each keeping its own volume.
        let mut changed = t.clone();
        for target in changed.values_mut() {
            target.config.env.insert("NEW".into(), "1".into());
        }
        let p = plan(&changed, &existing);
        assert_eq!(p.totals(), (0, 2 * t.len(), 0, 0), "{name}");
        for m in &existing {
            let to = volumes::desired(&changed[&m.group].config, m);
            assert_eq!(to.mounts, m.config.mounts, "{name}");
        }
    }
}

#[test]
fn keys_bazaar_cannot_honour_are_refused_by_name() {
    for (path, text) in fixtures("refused") {
        let name = path.display().to_string();
        let wanted = expectation(&text, "refused");
        match parse(&name, &text) {
            Ok(l) => panic!("{name} was accepted (warnings {:?})", l.warnings),
            Err(e) => assert!(e.to_string().contains(wanted), "{name}: {e}"),
        }
    }
}

fn ok(name: &str) -> AppConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ok")
        .join(name);
    load(&path).unwrap().config
}

#[test]
fn what_the_fixtures_set_reaches_the_machine_config() {
    // [experimental] entrypoint and cmd; a group's command wins over cmd.
    let c = ok("go-experimental.toml");
    let init = c.machine_config("app").unwrap().init.unwrap();
    assert_eq!(init.entrypoint, vec!["/usr/local/bin/tini", "--"]);
    assert_eq!(
        init.cmd,
        vec!["/kvstore", "serve", "--data", "/var/lib/state"]
    );
    let backup = c.machine_config("backup").unwrap().init.unwrap();
    assert_eq!(backup.entrypoint, vec!["/usr/local/bin/tini", "--"]);
    assert_eq!(backup.cmd[1], "backup");
    assert_eq!(c.snapshot_retention()["state"], 30);

    // Check headers go to the agent in fly.toml's spelling; kill settings and restarts.
    let c = ok("rails-sqlite.toml");
    let cfg = c.machine_config("app").unwrap();
    let check = &cfg.services[0].checks[0];
    assert_eq!(
        check.extra["headers"],
        serde_json::json!({"X-Forwarded-Proto": "https"})
    );
    let c = ok("django-celery.toml");
    let web = c.machine_config("web").unwrap();
    let stop = web.stop_config.unwrap();
    assert_eq!(stop.timeout.unwrap().get().as_secs(), 10);
    assert_eq!(web.restart.unwrap().max_retries, Some(5));
    let worker = c.machine_config("worker").unwrap();
    assert_eq!(
        worker.restart.unwrap().policy,
        bazaar_types::config::RestartPolicyKind::Always
    );

    // auto_rollback and metrics: read, metrics only warned about.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ok/node-services.toml"),
    )
    .unwrap();
    let l = parse("node-services.toml", &text).unwrap();
    assert_eq!(l.config.experimental.auto_rollback, Some(true));
    assert!(
        l.warnings.iter().any(|w| w.contains("`metrics`")),
        "{:?}",
        l.warnings
    );
}

#[test]
fn every_refused_key_is_named_at_once() {
    let e = parse(
        "fly.toml",
        "app = \"x\"\nswap_size_mb = 256\n[build]\nimage = \"i\"\n[[statics]]\nguest_path = \"/p\"\nurl_prefix = \"/\"\n",
    )
    .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("`swap_size_mb`") && m.contains("`statics`") && m.contains("these keys"),
        "{m}"
    );
}

#[test]
fn a_release_command_is_read_with_its_timeout() {
    let c = ok("release-command.toml");
    let bazaar_deploy::config::Command(cmd) = c.deploy.release_command.clone().unwrap();
    assert_eq!(cmd, vec!["bin/rails", "db:prepare"]);
    assert_eq!(
        c.deploy.release_command_timeout.unwrap().0,
        std::time::Duration::from_secs(600)
    );
}

#[test]
fn files_come_from_beside_the_config_file_or_inline() {
    use base64::Engine;
    let c = ok("nginx-files.toml");
    let files = c.machine_config("app").unwrap().files;
    let decode = |f: &bazaar_types::config::FileConfig| {
        let raw = f.raw_value.as_deref().unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(raw)
                .unwrap(),
        )
        .unwrap()
    };
    assert!(decode(&files[0]).contains("listen 8080;"), "{files:?}");
    assert_eq!(decode(&files[1]), "hello\n");
    // Given to `parse` alone, a local_path is not read: making the config says so.
    let text = "app = \"x\"\n[build]\nimage = \"i\"\n[[files]]\nguest_path = \"/a\"\nlocal_path = \"a.txt\"\n";
    let e = parse("fly.toml", text)
        .unwrap()
        .config
        .machine_config("app");
    assert!(e.unwrap_err().contains("local_path"));
    // One that cannot be read stops the load, naming it.
    let dir = std::env::temp_dir().join(format!("bazaar-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fly.toml");
    std::fs::write(&path, text).unwrap();
    let e = load(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(e.to_string().contains("a.txt"), "{e}");
    for bad in [
        "guest_path = \"etc/x\"\nraw_value = \"aGk=\"",
        "guest_path = \"/x\"\nraw_value = \"not base64!\"",
        "guest_path = \"/x\"",
        "guest_path = \"/x\"\nraw_value = \"aGk=\"\nlocal_path = \"a\"",
    ] {
        let text = format!("app = \"x\"\n[build]\nimage = \"i\"\n[[files]]\n{bad}\n");
        let e = parse("fly.toml", &text).unwrap_err();
        assert!(e.to_string().contains("[[files]]"), "{bad}: {e}");
    }
}
