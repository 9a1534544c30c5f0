//! The config file's own tests: a real fly.toml's mapping, errors with positions, command
//! lines; the fixture suite is `crates/deploy/tests/fly_toml.rs`.

use super::*;

const FLY_TOML: &str = r#"
# fly.toml app configuration file generated for hello on 2024-03-01T10:00:00Z
app = "hello"
primary_region = "ams"
kill_signal = "SIGTERM"
kill_timeout = 10
console_command = "/code/manage.py shell"

[build]
  image = "registry.fly.io/hello:deployment-01HQ"

[env]
  PORT = "8080"
  WORKERS = 4

[processes]
  web = "gunicorn --bind :8080 'hello.wsgi:application'"
  worker = "python -m celery -A hello worker"

[http_service]
  internal_port = 8080
  force_https = true
  auto_stop_machines = "stop"
  auto_start_machines = true
  min_machines_running = 1
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
path = "/healthz"

[[services]]
  protocol = "tcp"
  internal_port = 5432
  processes = ["worker"]
  [[services.ports]]
port = 5432
  [[services.tcp_checks]]
interval = 15000
timeout = "2s"

[checks]
  [checks.status]
port = 8080
type = "http"
interval = "10s"
timeout = "2s"
grace_period = "5s"
method = "GET"
path = "/status"
processes = ["web"]

[[vm]]
  size = "shared-cpu-2x"
  memory = "1gb"
  processes = ["web"]

[[vm]]
  cpu_kind = "shared"
  cpus = 1
  memory_mb = 512

[deploy]
  strategy = "canary"
  max_unavailable = 0.5
  wait_timeout = "2m"

[[restart]]
  policy = "always"
  retries = 5
  processes = ["worker"]

[mounts]
  source = "data"
  destination = "/data"
"#;

#[test]
fn a_real_fly_toml_loads_with_the_documented_mapping() {
    let l = parse("fly.toml", FLY_TOML).unwrap();
    let c = &l.config;
    assert_eq!(c.app, "hello");
    assert_eq!(c.primary_region.as_deref(), Some("ams"));
    assert_eq!(c.groups(), vec!["web", "worker"]);
    assert_eq!(c.strategy(), Strategy::Canary);
    assert_eq!(c.wait_timeout(), Duration::from_secs(120));
    assert_eq!(c.deploy.max_unavailable.unwrap().of(10), 5);
    assert!(!c.deploy.replace_on_host_failure);
    assert!(!bazaar_types::replacement::opted_in(
        &c.machine_config("web").unwrap().metadata
    ));
    assert!(
        l.warnings.iter().any(|w| w.contains("`console_command`")),
        "{:?}",
        l.warnings
    );
    assert_eq!(
        c.machine_config("worker").unwrap().mounts,
        vec![serde_json::json!({"name": "data", "path": "/data", "size_gb": 1})]
    );
    let web = c.machine_config("web").unwrap();
    assert_eq!(web.image, "registry.fly.io/hello:deployment-01HQ");
    assert_eq!(
        web.init.as_ref().unwrap().cmd,
        vec!["gunicorn", "--bind", ":8080", "hello.wsgi:application"]
    );
    assert_eq!(web.env["WORKERS"], "4");
    let g = web.guest.as_ref().unwrap();
    assert_eq!((g.cpus, g.memory_mb), (2, 1024));
    assert_eq!(web.services.len(), 1);
    let s = &web.services[0];
    assert_eq!(s.internal_port, 8080);
    assert_eq!(s.autostop, Some(Autostop::Stop));
    assert_eq!(s.autostart, Some(true));
    assert_eq!(s.min_machines_running, Some(1));
    assert_eq!(s.concurrency.as_ref().unwrap().hard_limit, Some(250));
    assert_eq!(s.checks[0].path.as_deref(), Some("/healthz"));
    assert_eq!(s.checks[0].kind.as_deref(), Some("http"));
    assert_eq!(s.ports[0].force_https, Some(true));
    assert!(web.checks.contains_key("status"));
    let (sig, t) = web.stop_signal_and_timeout();
    assert_eq!((sig, t), (Signal::TERM, Duration::from_secs(10)));
    assert_eq!(web.metadata[crate::META_GROUP], "web");
    assert!(web.restart.is_none());

    let worker = c.machine_config("worker").unwrap();
    assert_eq!(worker.services[0].internal_port, 5432);
    assert_eq!(
        worker.services[0].checks[0].interval.unwrap().get(),
        Duration::from_secs(15)
    );
    let g = worker.guest.as_ref().unwrap();
    assert_eq!((g.cpus, g.memory_mb), (1, 512));
    assert_eq!(worker.restart.unwrap().policy, RestartPolicyKind::Always);
    assert!(worker.checks.is_empty());
}

#[test]
fn process_driver_runs_the_commands() {
    let l = parse(
        "bazaar.toml",
        "app = \"p\"\n[build]\ndriver = \"process\"\n[processes]\napp = [\"python3\", \"-m\", \"http.server\"]\n",
    )
    .unwrap();
    let cfg = l.config.machine_config("app").unwrap();
    assert_eq!(cfg.driver.as_deref(), Some("process"));
    assert_eq!(cfg.init.unwrap().exec, vec!["python3", "-m", "http.server"]);
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
}

#[test]
fn deploy_image_runs_a_file_without_an_image_or_over_its_own() {
    let image = |i: &str| Overrides {
        image: Some(i.into()),
        ..Overrides::default()
    };
    // A real fly.toml that builds from a Dockerfile: `--image` deploys an image built
    // elsewhere instead.
    let dockerfile = "app = \"web\"\n[build]\n  dockerfile = \"Dockerfile\"\n";
    let empty = "app = \"web\"\n[build]\n";
    let e = parse("fly.toml", empty).unwrap_err();
    assert!(e.message.contains("[build] needs an `image`"), "{e}");
    let l = parse_with("fly.toml", dockerfile, &image("127.0.0.1:5000/web:v2")).unwrap();
    let cfg = l.config.machine_config("app").unwrap();
    assert_eq!(cfg.image, "127.0.0.1:5000/web:v2");
    // Over the file's own image.
    let l = parse_with("fly.toml", FLY_TOML, &image("registry.example/hello:v9")).unwrap();
    assert_eq!(
        l.config.build.image.as_deref(),
        Some("registry.example/hello:v9")
    );
    // Not with the process driver, and not an empty reference.
    let process =
        "app = \"p\"\n[build]\ndriver = \"process\"\n[processes]\napp = [\"sleep\", \"1\"]\n";
    let e = parse_with("bazaar.toml", process, &image("x:1")).unwrap_err();
    assert!(e.message.contains("driver = \"process\""), "{e}");
    for bad in ["", "a b"] {
        assert!(
            parse_with("fly.toml", dockerfile, &image(bad)).is_err(),
            "{bad:?}"
        );
    }
}

fn error(text: &str) -> ConfigError {
    parse("fly.toml", text).unwrap_err()
}

#[test]
fn broken_files_say_file_line_and_what() {
    let e = error("app = \"x\"\n[build]\nimage = \"i\"\n[deploy]\nstrategy = \"fast\"\n");
    assert_eq!((e.line, e.col), (Some(5), Some(12)), "{e}");
    assert!(e.to_string().starts_with("fly.toml:5:12: "), "{e}");
    assert!(e.message.contains("fast"), "{e}");

    let e = error("app = \"x\"\n[build]\nimage = \"i\"\n\n[[vm]]\n  size = \"shared-cpu-3x\"\n");
    assert_eq!(e.line, Some(6), "{e}");
    assert!(e.message.contains("shared-cpu-3x"), "{e}");

    let e =
        error("app = \"x\"\n[build]\nimage = \"i\"\n[http_service]\ninternal_port = \"eighty\"\n");
    assert_eq!(e.line, Some(5), "{e}");

    let e = error("app = \"x\"\nkill_timeout = \"forever\"\n[build]\nimage = \"i\"\n");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("forever"), "{e}");

    let e = error("app = \"x\"\n[build\nimage = \"i\"\n");
    assert_eq!(e.line, Some(2), "{e}");

    let e = error("app = \"x\"\n[build]\nimage = \"i\"\n[[vm]]\nmemory = \"lots\"\n");
    assert_eq!(e.line, Some(5), "{e}");

    let e = error("[build]\nimage = \"i\"\n");
    assert!(e.message.contains("`app`"), "{e}");

    let e = error("app = \"x\"\n[build]\ndriver = \"process\"\n");
    assert!(e.message.contains("[processes]"), "{e}");
}

#[test]
fn command_lines_split_like_a_shell() {
    assert_eq!(
        split_command(r#"sh -c 'echo "hi there"' a\ b"#).unwrap(),
        vec!["sh", "-c", "echo \"hi there\"", "a b"]
    );
    assert!(split_command("sh 'open").is_err());
}

#[test]
fn replace_on_host_failure_opts_every_machine_in() {
    let l = parse(
        "fly.toml",
        "app = \"x\"\n[build]\nimage = \"i\"\n[deploy]\nreplace_on_host_failure = true\n",
    )
    .unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let cfg = l.config.machine_config("app").unwrap();
    assert_eq!(
        cfg.metadata[bazaar_types::replacement::METADATA_KEY],
        "true"
    );
    assert!(bazaar_types::replacement::validate(&cfg).is_ok());
}

#[test]
fn a_vm_priority_becomes_the_groups_config_priority() {
    use bazaar_types::priority::Priority;
    let text = "app = \"x\"\n[build]\nimage = \"i\"\n[processes]\nweb = \"serve\"\nworker = \"work\"\n\n[[vm]]\n  priority = \"batch\"\n  processes = [\"worker\"]\n\n[[vm]]\n  priority = \"critical\"\n";
    let c = parse("fly.toml", text).unwrap().config;
    assert_eq!(
        c.machine_config("worker").unwrap().priority,
        Some(Priority::Batch)
    );
    assert_eq!(
        c.machine_config("web").unwrap().priority,
        Some(Priority::Critical)
    );
    let plain = parse("fly.toml", "app = \"x\"\n[build]\nimage = \"i\"\n")
        .unwrap()
        .config;
    assert_eq!(plain.machine_config("app").unwrap().priority, None);

    let e = error("app = \"x\"\n[build]\nimage = \"i\"\n[[vm]]\npriority = \"urgent\"\n");
    assert_eq!(e.line, Some(5), "{e}");
    assert!(
        e.message.contains("urgent") && e.message.contains("critical"),
        "{e}"
    );
}

#[test]
fn vm_runtime_sets_the_machines_runtime() {
    let l = parse(
        "fly.toml",
        "app = \"g\"\n[build]\nimage = \"busybox\"\n[[vm]]\nruntime = \"gvisor\"\n",
    )
    .unwrap();
    let cfg = l.config.machine_config("app").unwrap();
    assert_eq!(cfg.runtime.as_deref(), Some("gvisor"));
    assert_eq!(cfg.driver(), "gvisor");
    let l = parse(
        "fly.toml",
        "app = \"g\"\n[build]\nimage = \"busybox\"\n[[vm]]\nruntime = \"kata\"\n",
    )
    .unwrap();
    let err = l.config.machine_config("app").unwrap_err();
    assert!(err.contains("unknown config.runtime"), "{err}");
}

#[test]
fn a_vm_placement_becomes_the_groups_config_placement() {
    let text = "app = \"x\"\n[build]\nimage = \"i\"\n[processes]\nweb = \"serve\"\nworker = \"work\"\n\n[[vm]]\n  processes = [\"worker\"]\n  [vm.placement]\n  constraints = [{ label = \"disk\", value = \"nvme\" }]\n  spread = { by = \"host\" }\n";
    let c = parse("fly.toml", text).unwrap().config;
    let p = c.machine_config("worker").unwrap().placement.unwrap();
    assert_eq!(p.constraints[0].describe(), "disk = nvme");
    assert_eq!(p.spread.unwrap().by, "host");
    assert_eq!(c.machine_config("web").unwrap().placement, None);
    let bad = parse(
        "fly.toml",
        "app = \"x\"\n[build]\nimage = \"i\"\n[[vm]]\n[vm.placement]\nspread = { by = \"rack\" }\n",
    )
    .unwrap()
    .config;
    let e = bad.machine_config("app").unwrap_err();
    assert!(e.contains("placement.spread.by"), "{e}");
}

#[test]
fn a_vm_per_host_marks_its_groups_machines_per_host() {
    let text = "app = \"x\"\n[build]\nimage = \"i\"\n[processes]\nweb = \"serve\"\nagent = \"watch\"\n\n[[vm]]\n  per_host = true\n  processes = [\"agent\"]\n  [vm.placement]\n  constraints = [{ label = \"role\", value = \"edge\" }]\n\n[[vm]]\n  size = \"shared-cpu-1x\"\n";
    let c = parse("fly.toml", text).unwrap().config;
    assert!(c.per_host("agent"));
    assert!(!c.per_host("web"));
    let agent = c.machine_config("agent").unwrap();
    assert_eq!(agent.metadata[bazaar_types::per_host::METADATA_KEY], "true");
    assert!(!c
        .machine_config("web")
        .unwrap()
        .metadata
        .contains_key(bazaar_types::per_host::METADATA_KEY));
    // Not with re-placement: a per-host machine belongs to its host.
    let both = text.replace(
        "[processes]",
        "[deploy]\nreplace_on_host_failure = true\n[processes]",
    );
    let e = parse("fly.toml", &both)
        .unwrap()
        .config
        .machine_config("agent")
        .unwrap_err();
    assert!(e.contains("bazaar_per_host"), "{e}");
}
