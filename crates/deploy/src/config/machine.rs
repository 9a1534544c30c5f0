//! The translation of a parsed file into one `MachineConfig` per process group.

use super::*;

fn applies(list: &[String], group: &str) -> bool {
    list.is_empty() || list.iter().any(|g| g == group)
}

fn check_config(kind: &str, c: &ServiceCheck) -> CheckConfig {
    let mut extra = BTreeMap::new();
    if !c.headers.is_empty() {
        // fly.toml's spelling ({"X": "a"}), which the agent reads as Fly's.
        extra.insert("headers".to_string(), serde_json::json!(c.headers.clone()));
    }
    CheckConfig {
        kind: Some(kind.into()),
        port: None,
        interval: c.interval.map(|d| GoDuration(d.0)),
        timeout: c.timeout.map(|d| GoDuration(d.0)),
        grace_period: c.grace_period.map(|d| GoDuration(d.0)),
        method: c.method.as_ref().map(|m| m.to_ascii_uppercase()),
        path: c.path.clone(),
        extra,
    }
}

fn concurrency(c: &Option<ConcurrencySection>) -> Option<Concurrency> {
    c.as_ref().map(|c| Concurrency {
        kind: match c.kind {
            Some(ConcurrencyKind::Requests) => "requests".into(),
            _ => "connections".into(),
        },
        soft_limit: c.soft_limit,
        hard_limit: c.hard_limit,
    })
}

impl AppConfig {
    /// The process groups: the keys of `[processes]`, or [`DEFAULT_GROUP`].
    pub fn groups(&self) -> Vec<String> {
        if self.processes.is_empty() {
            vec![DEFAULT_GROUP.to_string()]
        } else {
            self.processes.keys().cloned().collect()
        }
    }

    /// The guest size of a group: its `[[vm]]` (or the one without `processes`), else
    /// shared-cpu-1x.
    pub fn guest(&self, group: &str) -> Result<Guest, String> {
        let vm = self.vm_of(group);
        let mut guest = Guest::default();
        if let Some(vm) = vm {
            if let Some(Size(g)) = &vm.size {
                guest = g.clone();
            }
            if let Some(k) = vm.cpu_kind {
                guest.cpu_kind = match k {
                    CpuKind::Shared => "shared".into(),
                    CpuKind::Performance => "performance".into(),
                };
                if vm.size.is_none() && k == CpuKind::Performance && vm.memory.is_none() {
                    guest.memory_mb = 2048 * guest.cpus;
                }
            }
            if let Some(n) = vm.cpus {
                guest.cpus = n as i64;
            }
            if let Some(Memory(mb)) = vm.memory {
                guest.memory_mb = mb as i64;
            }
        }
        guest
            .validate()
            .map_err(|e| format!("[[vm]] for process group {group:?}: {e}"))?;
        Ok(guest)
    }

    /// The priority class of a group's machines: its `[[vm]]`'s (or the one without
    /// `processes`) `priority`, if set.
    pub fn priority(&self, group: &str) -> Option<bazaar_types::priority::Priority> {
        self.vm
            .iter()
            .find(|v| v.processes.iter().any(|g| g == group))
            .or_else(|| self.vm.iter().find(|v| v.processes.is_empty()))
            .and_then(|v| v.priority)
    }

    /// Whether a group's machines are per-host (its `[[vm]]`'s `per_host = true`): one on
    /// every host meeting its constraints (`bazaar_types::per_host`).
    pub fn per_host(&self, group: &str) -> bool {
        self.vm_of(group).and_then(|v| v.per_host).unwrap_or(false)
    }

    /// The strategy (`[deploy] strategy`, default rolling).
    pub fn strategy(&self) -> Strategy {
        self.deploy.strategy.unwrap_or(Strategy::Rolling)
    }

    /// How long to wait for a machine to start and pass its checks (default 5 min, as Fly).
    pub fn wait_timeout(&self) -> Duration {
        self.deploy
            .wait_timeout
            .map(|m| m.0)
            .unwrap_or(Duration::from_secs(300))
    }

    /// The `[[vm]]` of a process group: the one naming it, else the one naming none.
    fn vm_of(&self, group: &str) -> Option<&super::Vm> {
        self.vm
            .iter()
            .find(|v| v.processes.iter().any(|g| g == group))
            .or_else(|| self.vm.iter().find(|v| v.processes.is_empty()))
    }

    /// The machine config of one process group (without release metadata).
    pub fn machine_config(&self, group: &str) -> Result<MachineConfig, String> {
        let process = self.build.driver == Some(Driver::Process);
        let mut cfg = MachineConfig {
            image: self.build.image.clone().unwrap_or_else(|| "process".into()),
            driver: self.build.driver.map(|d| match d {
                Driver::Process => "process".to_string(),
                Driver::Oci => "oci".to_string(),
            }),
            guest: Some(self.guest(group)?),
            priority: self.priority(group),
            runtime: self.vm_of(group).and_then(|v| v.runtime.clone()),
            ..Default::default()
        };
        cfg.check_runtime()
            .map_err(|e| format!("[[vm]] runtime: {e}"))?;
        if let Some(p) = self.vm_of(group).and_then(|v| v.placement.clone()) {
            p.validate().map_err(|e| format!("[[vm]] {e}"))?;
            cfg.placement = Some(p);
        }
        let e = &self.experimental;
        if e.cmd.is_some() || e.entrypoint.is_some() || e.exec.is_some() {
            let argv = |c: &Option<Command>| c.as_ref().map(|c| c.0.clone()).unwrap_or_default();
            cfg.init = Some(InitConfig {
                exec: argv(&e.exec),
                entrypoint: argv(&e.entrypoint),
                cmd: argv(&e.cmd),
                ..Default::default()
            });
        }
        if let Some(Command(argv)) = self.processes.get(group) {
            cfg.init = Some(if process {
                InitConfig {
                    exec: argv.clone(),
                    ..Default::default()
                }
            } else {
                InitConfig {
                    cmd: argv.clone(),
                    ..cfg.init.take().unwrap_or_default()
                }
            });
        }
        cfg.env = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        if let Some(h) = self
            .http_service
            .as_ref()
            .filter(|h| applies(&h.processes, group))
        {
            cfg.services.push(MachineService {
                protocol: "tcp".into(),
                internal_port: h.internal_port,
                ports: vec![
                    MachinePort {
                        port: Some(80),
                        handlers: vec!["http".into()],
                        force_https: Some(h.force_https),
                        ..Default::default()
                    },
                    MachinePort {
                        port: Some(443),
                        handlers: vec!["tls".into(), "http".into()],
                        ..Default::default()
                    },
                ],
                concurrency: concurrency(&h.concurrency),
                autostart: h.auto_start_machines,
                autostop: h.auto_stop_machines.map(|a| a.0),
                min_machines_running: h.min_machines_running,
                checks: h.checks.iter().map(|c| check_config("http", c)).collect(),
                extra: Default::default(),
            });
        }
        for s in self
            .services
            .iter()
            .filter(|s| applies(&s.processes, group))
        {
            cfg.services.push(MachineService {
                protocol: s.protocol.clone(),
                internal_port: s.internal_port,
                ports: s
                    .ports
                    .iter()
                    .map(|p| MachinePort {
                        port: p.port,
                        start_port: p.start_port,
                        end_port: p.end_port,
                        handlers: p.handlers.clone(),
                        force_https: p.force_https,
                        extra: Default::default(),
                    })
                    .collect(),
                concurrency: concurrency(&s.concurrency),
                autostart: s.auto_start_machines,
                autostop: s.auto_stop_machines.map(|a| a.0),
                min_machines_running: s.min_machines_running,
                checks: s
                    .tcp_checks
                    .iter()
                    .map(|c| check_config("tcp", c))
                    .chain(s.http_checks.iter().map(|c| check_config("http", c)))
                    .collect(),
                extra: Default::default(),
            });
        }
        for (name, c) in self
            .checks
            .iter()
            .filter(|(_, c)| applies(&c.processes, group))
        {
            cfg.checks.insert(
                name.clone(),
                CheckConfig {
                    kind: Some(
                        match c.kind {
                            Some(CheckKind::Http) => "http",
                            _ => "tcp",
                        }
                        .into(),
                    ),
                    port: c.port,
                    interval: c.interval.map(|d| GoDuration(d.0)),
                    timeout: c.timeout.map(|d| GoDuration(d.0)),
                    grace_period: c.grace_period.map(|d| GoDuration(d.0)),
                    method: c.method.clone(),
                    path: c.path.clone(),
                    extra: Default::default(),
                },
            );
        }
        if let Some(r) = self
            .restart
            .iter()
            .find(|r| r.processes.iter().any(|g| g == group))
            .or_else(|| self.restart.iter().find(|r| r.processes.is_empty()))
        {
            cfg.restart = Some(RestartConfig {
                policy: r.policy.0,
                max_retries: r.retries,
            });
        }
        if self.kill_signal.is_some() || self.kill_timeout.is_some() {
            cfg.stop_config = Some(StopConfig {
                signal: self.kill_signal.map(|s| s.0),
                timeout: self.kill_timeout.map(|s| GoDuration(s.0)),
            });
        }
        cfg.files = super::files::of_group(self, group)?;
        if let Some(m) = self.mount(group) {
            cfg.mounts = vec![super::mounts::mount_value(m)];
        }
        cfg.metadata
            .insert(crate::META_GROUP.into(), group.to_string());
        cfg.metadata
            .insert(crate::META_PLATFORM.into(), "v2".into());
        if self.deploy.replace_on_host_failure {
            cfg.metadata.insert(
                bazaar_types::replacement::METADATA_KEY.into(),
                "true".into(),
            );
        }
        if self.per_host(group) {
            cfg.metadata
                .insert(bazaar_types::per_host::METADATA_KEY.into(), "true".into());
        }
        bazaar_types::replacement::validate(&cfg)
            .map_err(|e| format!("process group {group:?}: {e}"))?;
        Ok(cfg)
    }
}
