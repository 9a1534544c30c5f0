//! docs/INSTALL.md followed on hosts in network namespaces (root): the guide's own
//! commands and config files, taken from its `install-guide` blocks, with its example
//! paths and addresses swapped for the test's. The first server makes the CA, the token key
//! and the cluster secret and runs the agent as the package's unit does; two servers join
//! with tokens; an app is deployed and reached through every proxy and by `.internal`; a
//! fourth server joins later; the host of the app's machine is drained (the machine
//! replaced elsewhere while requests go through the first server's proxy: every one is
//! answered, and then every other proxy serves the moved machine), then removed (stopped,
//! reset, revoked). Not through
//! `bazaar lab`: only its namespace plumbing (`bazaar_lab::net`). Everything it makes is
//! removed at the end.

use crate::common;

use bazaar_lab::{net, HostPlan, LabPlan, Subnet};
use common::{is_root, EXE};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const GUIDE: &str = include_str!("../../../docs/INSTALL.md");
const UNIT: &str = include_str!("../../../packaging/debian/bazaar-agent.service");

/// The code blocks of the guide marked `lang install-guide`, in order.
fn blocks(lang: &str) -> Vec<&'static str> {
    let fence = format!("```{lang} install-guide\n");
    GUIDE
        .split(&fence)
        .skip(1)
        .map(|rest| rest.split_once("```").expect("a closed block").0)
        .collect()
}

/// The guide's block of `lang` that contains `needle`.
fn block(lang: &str, needle: &str) -> &'static str {
    blocks(lang)
        .into_iter()
        .find(|b| b.contains(needle))
        .unwrap_or_else(|| panic!("no {lang} install-guide block with {needle:?}"))
}

/// Polls `probe` with the test kit's `eventually` until it answers `Some`, for `within`.
fn eventually<T>(within: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(bazaar_testkit::eventually(within, || {
        let v = probe();
        async move { v }
    }))
    .ok()
}

struct Cluster {
    dir: PathBuf,
    plan: LabPlan,
    agents: Vec<(usize, Child)>,
}

impl Cluster {
    /// The guide's text for server `index` (1-based): its paths and addresses ours.
    fn localize(&self, text: &str, index: usize) -> String {
        let d = self.dir.display();
        let mut t = text
            .replace("/var/lib/bazaar-ca", &format!("{d}/ca"))
            .replace("/etc/bazaar/", &format!("{d}/etc/"))
            .replace("/var/lib/bazaar", &format!("{d}/h{index}"))
            .replace("10.0.0.1", &self.addr(1));
        // A next server's own addresses (the guide's example is 10.0.0.2).
        t = t.replace("10.0.0.2", &self.addr(index));
        t
    }

    fn host(&self, index: usize) -> &HostPlan {
        &self.plan.hosts[index - 1]
    }

    fn addr(&self, index: usize) -> String {
        self.host(index).addr.to_string()
    }

    /// Runs a shell script inside server `index`'s namespace with the binary on PATH; it
    /// must succeed.
    fn sh(&self, index: usize, script: &str, env: &[(&str, &str)]) -> Output {
        let out = self.try_sh(index, script, env);
        assert!(
            out.status.success(),
            "on h{index}:\n{script}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn try_sh(&self, index: usize, script: &str, env: &[(&str, &str)]) -> Output {
        let bin = Path::new(EXE).parent().unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.host(index).netns,
                "bash",
                "-euo",
                "pipefail",
                "-c",
            ])
            .arg(script)
            .env("PATH", path)
            .envs(env.iter().copied())
            .env_remove("BAZAAR_API_URL")
            .env_remove("BAZAAR_TOKEN")
            .output()
            .unwrap()
    }

    /// Starts server `index`'s agent as the package's unit does, with its config from the
    /// guide.
    fn start(&mut self, index: usize, config: &str, join_token: Option<&str>) {
        std::fs::create_dir_all(self.dir.join(format!("h{index}"))).unwrap();
        let file = self.dir.join(format!("etc/agent-h{index}.toml"));
        std::fs::write(&file, self.localize(config, index)).unwrap();
        let exec = UNIT
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("the unit's ExecStart")
            .replace("/usr/bin/bazaar", EXE)
            .replace("/etc/bazaar/agent.toml", file.to_str().unwrap());
        let log = std::fs::File::create(self.dir.join(format!("h{index}.log"))).unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(index).netns])
            .args(exec.split_whitespace())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null());
        if let Some(token) = join_token {
            cmd.env("BAZAAR_JOIN_TOKEN", token);
        }
        self.agents.push((index, cmd.spawn().unwrap()));
    }

    fn stop(&mut self, index: usize) {
        if let Some(at) = self.agents.iter().position(|(i, _)| *i == index) {
            let (_, mut child) = self.agents.remove(at);
            // SAFETY: kill on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    fn log(&self, index: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("h{index}.log"))).unwrap_or_default()
    }

    /// The operator's environment of the guide's "first app", localized.
    fn operator_env(&self) -> String {
        let app = block("sh", "bazaar apps create");
        app.lines()
            .take_while(|l| !l.starts_with("bazaar "))
            .map(|l| self.localize(l, 1))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Hosts alive in server 1's catalog.
    fn alive_hosts(&self) -> usize {
        let out = self.try_sh(
            1,
            &format!("{}\nbazaar hosts --json", self.operator_env()),
            &[],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v.as_array()
            .map(|hosts| {
                hosts
                    .iter()
                    .filter(|h| h.to_string().contains("\"alive\""))
                    .count()
            })
            .unwrap_or(0)
    }

    /// The index of the server whose host id is `id` (by its API address in `bazaar hosts`).
    fn index_of(&self, env: &str, id: &str) -> usize {
        let out = self.sh(1, &format!("{env}\nbazaar hosts --json"), &[]);
        let hosts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let row = hosts
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {hosts}"));
        let api = row["api_addr"].as_str().unwrap();
        (1..=self.plan.hosts.len())
            .find(|i| api.starts_with(&format!("{}:", self.addr(*i))))
            .unwrap_or_else(|| panic!("no server has the address of {row}"))
    }

    fn wait_alive(&self, n: usize) {
        let alive = eventually(Duration::from_secs(60), || {
            (self.alive_hosts() == n).then_some(())
        });
        assert!(
            alive.is_some(),
            "{n} hosts never alive; logs:\n{}",
            (1..=self.plan.hosts.len())
                .map(|i| format!("h{i}: {}", self.log(i)))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let running: Vec<usize> = self.agents.iter().map(|(i, _)| *i).collect();
        for i in running {
            self.stop(i);
        }
        for h in &self.plan.hosts {
            let data = self.dir.join(format!("h{}", h.index));
            if data.join("agent.redb").exists() {
                let _ = Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        &h.netns,
                        EXE,
                        "host",
                        "reset",
                        "--data-dir",
                    ])
                    .arg(&data)
                    .status();
            }
            net::remove_machine_namespaces(&data);
        }
        let _ = net::remove(&self.plan);
    }
}

#[test]
fn the_install_guide_builds_a_cluster_that_grows_and_shrinks() {
    if !bazaar_testkit::can_run(
        is_root(),
        "root (network namespaces, the agents' sandboxes)",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    let pool = Subnet::new("10.250.0.0".parse().unwrap(), 16).unwrap();
    let subnet = bazaar_lab::plan::pick_subnet(&pool, 24, &net::subnets_in_use().unwrap())
        .expect("a free /24");
    let id = format!("i{}", std::process::id() % 1000);
    let plan = LabPlan::new(&id, subnet, 4, &["ams".to_string()]).unwrap();
    // The guard first: a failed create is removed too.
    let mut c = Cluster {
        dir,
        plan,
        agents: Vec::new(),
    };
    net::create(&c.plan).unwrap();

    // The first server: the CA, the token key, the cluster secret, its agent.
    let secrets = c.localize(block("sh", "bazaar cluster init"), 1);
    c.sh(1, &secrets, &[]);
    assert!(c.dir.join("ca/ca.key").exists());
    let configs = blocks("toml");
    let first = configs.iter().find(|b| b.contains("cluster_ca")).unwrap();
    let next = configs.iter().find(|b| b.contains("join_addr")).unwrap();
    c.start(1, first, None);
    c.wait_alive(1);

    // Every next server joins with a token of its own.
    let join = |c: &Cluster| {
        let out = c.sh(
            1,
            &c.localize(block("sh", "bazaar cluster join-token"), 1),
            &[],
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert!(block("sh", "join.conf").contains("Environment=BAZAAR_JOIN_TOKEN="));
    for i in [2, 3] {
        let token = join(&c);
        c.start(i, next, Some(&token));
    }
    c.wait_alive(3);

    // The first app, as the guide runs it; then through every proxy and by name.
    let app = block("sh", "bazaar apps create");
    let script: Vec<String> = app
        .lines()
        .filter(|l| !l.contains("<id>") && !l.starts_with("curl"))
        .map(|l| c.localize(l, 1))
        .collect();
    c.sh(1, &script.join("\n"), &[]);
    let env = c.operator_env();
    let out = c.sh(
        1,
        &format!("{env}\nbazaar machine list -a hello --json"),
        &[],
    );
    let machines: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let machine = machines[0]["id"].as_str().expect("a machine").to_string();
    let curl = app.lines().find(|l| l.starts_with("curl")).unwrap();
    for i in 1..=3 {
        let line = curl
            .split('#')
            .next()
            .unwrap()
            .replace("10.0.0.2", &c.addr(i));
        let line = line.replace("curl ", "curl -fsS ");
        c.sh(1, &line, &[]);
    }
    let by_name = app.lines().find(|l| l.contains("hello.internal")).unwrap();
    let out = c.sh(
        1,
        &format!(
            "{env}\n{}",
            by_name
                .split(" # ")
                .next()
                .unwrap()
                .replace("<id>", &machine)
        ),
        &[],
    );
    assert!(!out.stdout.is_empty(), "hello.internal resolved to nothing");

    // A fourth server later, its proxy serving the app.
    let token = join(&c);
    c.start(4, next, Some(&token));
    c.wait_alive(4);
    let line = curl
        .split('#')
        .next()
        .unwrap()
        .replace("10.0.0.2", &c.addr(4));
    let line = line.replace("curl ", "curl -fsS ");
    // Alive in the catalog comes before its proxy listens.
    eventually(Duration::from_secs(30), || {
        c.try_sh(1, &line, &[]).status.success().then_some(())
    });
    c.sh(1, &line, &[]);

    // One drained while the app keeps serving: the host of the app's machine (if that is
    // the first server, which holds the CA, it is drained and taken back first, so the
    // machine moves and the drain and undrain are both run).
    let drain = block("sh", "bazaar host drain");
    let drain_line = |id: &str| c.localize(drain.trim(), 1).replace("<host id>", id);
    let machine_host = || {
        let out = c.sh(
            1,
            &format!("{env}\nbazaar machine list -a hello --json"),
            &[],
        );
        let machines: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let list = machines.as_array().unwrap();
        // Once the catalog has caught up with a move: the one machine of the app.
        (list.len() == 1).then(|| {
            (
                list[0]["host_id"].as_str().unwrap().to_string(),
                list[0]["state"].as_str().unwrap().to_string(),
            )
        })
    };
    let moved_from = |from: &str| {
        eventually(Duration::from_secs(30), || {
            machine_host().filter(|(on, state)| on != from && state == "started")
        })
        .unwrap_or_else(|| panic!("the machine never left {from}: {:?}", machine_host()))
        .0
    };
    let (mut holder, _) = machine_host().expect("one machine");
    if c.index_of(&env, &holder) == 1 {
        eprintln!("the machine is on the first server: drained and taken back first");
        c.sh(1, &format!("{env}\n{}", drain_line(&holder)), &[]);
        c.sh(1, &format!("{env}\nbazaar host undrain {holder}"), &[]);
        holder = moved_from(&holder);
    }
    let gone_index = c.index_of(&env, &holder);
    assert_ne!(gone_index, 1, "the machine moved off the first server");
    // Requests through the first server's proxy the whole time.
    let stop_file = c.dir.join("traffic.stop");
    let first_proxy = curl
        .split('#')
        .next()
        .unwrap()
        .replace("10.0.0.2", &c.addr(1))
        .replace(
            "curl ",
            "curl -fsS -m 5 -o /dev/null -w '%{http_code} %{time_total}s\\n' ",
        );
    let traffic = Command::new("ip")
        .args(["netns", "exec", &c.host(1).netns, "bash", "-c"])
        .arg(format!(
            "ok=0; failed=0; while [ ! -e {stop} ]; do if {first_proxy}; then ok=$((ok+1)); \
             else failed=$((failed+1)); fi; done; echo $ok $failed",
            stop = stop_file.display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = c.sh(1, &format!("{env}\n{} --json", drain_line(&holder)), &[]);
    std::fs::write(&stop_file, "").unwrap();
    let traffic = traffic.wait_with_output().unwrap();
    let counts = String::from_utf8(traffic.stdout).unwrap();
    let errors = String::from_utf8_lossy(&traffic.stderr).into_owned();
    let (ok, failed) = counts
        .trim()
        .lines()
        .last()
        .and_then(|l| l.split_once(' '))
        .expect("the traffic counts");
    let (ok, failed): (u64, u64) = (ok.parse().unwrap(), failed.parse().unwrap());
    let failures: Vec<&str> = counts
        .lines()
        .filter(|l| l.ends_with('s') && !l.starts_with("200 "))
        .collect();
    eprintln!(
        "through the first proxy during the drain: {ok} answered, {failed} failed {failures:?}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["machines"][0]["outcome"], "replaced", "{report}");
    moved_from(&holder);
    assert!(ok > 0, "no request went through during the drain");
    // None fails: the proxies leave the original once it is cordoned, before it stops, and
    // reach its replacement at once, even on a host whose machine network handed its
    // address to an earlier machine (the first server's, drained and taken back above).
    assert_eq!(
        failed, 0,
        "requests failed through the first proxy during the drain: {errors}\n{counts}\n{report}"
    );
    let out = c.sh(1, &format!("{env}\nbazaar hosts"), &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("draining"),
        "{out:?}"
    );
    for i in (1..=4).filter(|i| *i != gone_index) {
        let line = curl
            .split('#')
            .next()
            .unwrap()
            .replace("10.0.0.2", &c.addr(i))
            .replace("curl ", "curl -fsS ");
        // Each proxy's routes follow its own catalog, which the move reaches in a moment.
        let served = eventually(Duration::from_secs(30), || {
            c.try_sh(1, &line, &[]).status.success().then_some(())
        });
        if served.is_none() {
            let answer = c.try_sh(1, &line.replace("curl -fsS ", "curl -sS "), &[]);
            panic!(
                "h{i}'s proxy does not serve the moved machine: {}\n{}",
                String::from_utf8_lossy(&answer.stdout),
                c.log(i)
            );
        }
    }

    // Then removed: stopped and reset as the guide says, then revoked from the first.
    let gone = holder;
    c.stop(gone_index);
    let reset = block("sh", "bazaar host reset");
    let reset: Vec<&str> = reset
        .lines()
        .filter(|l| !l.starts_with("systemctl"))
        .collect();
    c.sh(gone_index, &c.localize(&reset.join("\n"), gone_index), &[]);
    let revoke = c
        .localize(block("sh", "bazaar cluster revoke"), 1)
        .replace("<host id>", &gone);
    c.sh(1, &format!("{env}\n{revoke}"), &[]);
    c.wait_alive(3);
    // The revoked host is dropped from the catalog; the app still serves.
    let listed = || {
        let out = c.sh(1, &format!("{env}\nbazaar hosts --json"), &[]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dropped = eventually(Duration::from_secs(30), || {
        (!listed().contains(&gone)).then_some(())
    });
    assert!(dropped.is_some(), "{gone} still listed: {}", listed());
    c.sh(1, &first_proxy, &[]);
}
