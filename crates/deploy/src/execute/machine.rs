//! What a deploy does to one machine, as steps of the strategies in [`super`]: drain
//! (cordon, wait for in-flight requests), update and wait until it is up at the new version
//! with its checks passing, create, relabel with a release, destroy. Each records what it
//! changed in the run's [`Done`](super::Done), so that a rollback can undo it.

use super::{lock, Change, Failure, Run};
use crate::health;
use crate::lease::TTL_SECS;
use crate::progress::Event;
use bazaar_types::config::MachineConfig;
use std::time::Duration;

/// How often a draining machine's in-flight count is read.
const DRAIN_POLL: Duration = Duration::from_millis(25);

impl Run<'_> {
    pub(super) fn say(&self, id: &str, region: &str, message: impl Into<String>) {
        self.progress.event(Event::Machine {
            id: id.to_string(),
            region: region.to_string(),
            message: message.into(),
        });
    }

    pub(super) fn app(&self) -> &str {
        &self.opts.app
    }

    /// Cordons a machine (the proxies stop sending it new requests), then waits until the
    /// requests and connections it is serving have finished, as its host's proxy counts
    /// them, for at most `drain`.
    async fn drain(&self, id: &str, region: &str) -> anyhow::Result<()> {
        let nonce = self.leases.acquire(id).await?;
        self.client
            .action(self.app(), id, "cordon", None, Some(&nonce))
            .await?;
        self.say(id, region, "cordoned, draining");
        let deadline = tokio::time::Instant::now() + self.opts.drain;
        loop {
            let in_flight = self.client.in_flight(self.app(), id).await?;
            if in_flight == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                self.say(
                    id,
                    region,
                    format!(
                        "still serving {in_flight} request(s) after {:?}; stopping anyway",
                        self.opts.drain
                    ),
                );
                return Ok(());
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    pub(super) async fn uncordon(&self, id: &str) -> anyhow::Result<()> {
        let nonce = self.leases.acquire(id).await?;
        self.client
            .action(self.app(), id, "uncordon", None, Some(&nonce))
            .await?;
        Ok(())
    }

    /// Drains, updates, waits until healthy at the new version, uncordons.
    pub(super) async fn update_one(&self, c: &Change, gate: bool) -> Result<(), Failure> {
        let fail = |error: anyhow::Error| Failure {
            id: c.id.clone(),
            region: c.region.clone(),
            error,
        };
        if c.stopped {
            let nonce = self.leases.acquire(&c.id).await.map_err(fail)?;
            if !self.rolling_back.load(std::sync::atomic::Ordering::SeqCst) {
                lock(&self.done).updated.push(c.clone());
            }
            self.client
                .update(self.app(), &c.id, &c.to, true, Some(&nonce))
                .await
                .map_err(fail)?;
            self.say(&c.id, &c.region, "updated (stays stopped)");
            self.progress.event(Event::Advance);
            return Ok(());
        }
        if gate {
            self.drain(&c.id, &c.region).await.map_err(fail)?;
        }
        let nonce = self.leases.acquire(&c.id).await.map_err(fail)?;
        if !self.rolling_back.load(std::sync::atomic::Ordering::SeqCst) {
            lock(&self.done).updated.push(c.clone());
        }
        let m = self
            .client
            .update(self.app(), &c.id, &c.to, false, Some(&nonce))
            .await
            .map_err(fail)?;
        let version = Some(m.instance_id);
        self.say(&c.id, &c.region, "updated, waiting for it to start");
        self.wait_up(&c.id, &c.region, version.as_deref(), &c.to, gate)
            .await
            .map_err(fail)?;
        if gate {
            self.uncordon(&c.id).await.map_err(fail)?;
        }
        self.say(&c.id, &c.region, "healthy");
        self.progress.event(Event::Advance);
        Ok(())
    }

    async fn wait_up(
        &self,
        id: &str,
        region: &str,
        version: Option<&str>,
        config: &MachineConfig,
        gate: bool,
    ) -> anyhow::Result<()> {
        let mut timeout = self.opts.wait_timeout;
        if self.rolling_back.load(std::sync::atomic::Ordering::SeqCst) {
            timeout = timeout.max(Duration::from_secs(60));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        health::wait_started(self.client, self.app(), id, version, deadline).await?;
        if gate {
            let n = health::service_checks(config);
            if n > 0 {
                self.say(id, region, format!("started, waiting for {n} check(s)"));
            }
            health::wait_passing(self.client, self.app(), id, version, n, deadline).await?;
        }
        Ok(())
    }

    /// Creates `count` machines in a region and waits until they are up. With a mount,
    /// one at a time, each on a volume of its own ([`crate::volumes`]).
    pub(super) async fn create(
        &self,
        region: &str,
        config: &MachineConfig,
        count: usize,
        cordoned: bool,
        gate: bool,
    ) -> Result<Vec<String>, Failure> {
        let Some(wanted) = crate::volumes::wanted(config) else {
            return self
                .create_batch(region, config, count, cordoned, gate)
                .await;
        };
        let mut ids = Vec::new();
        for _ in 0..count {
            let volume = self
                .volume_for(region, &wanted, config)
                .await
                .map_err(|error| Failure {
                    id: String::new(),
                    region: region.to_string(),
                    error: error.context(format!("volume {:?}", wanted.name)),
                })?;
            let on = crate::volumes::mount_on(config, &volume);
            ids.extend(self.create_batch(region, &on, 1, cordoned, gate).await?);
        }
        Ok(ids)
    }

    /// A volume named as `wanted` in `region` for a new machine: a free one (not attached
    /// and not taken by this deploy), else a new one of `wanted.size_gb` on a host that can
    /// also run the machine.
    async fn volume_for(
        &self,
        region: &str,
        wanted: &crate::volumes::Wanted,
        config: &MachineConfig,
    ) -> anyhow::Result<String> {
        let _choosing = self.choosing_volume.lock().await;
        let taken = lock(&self.done).volumes_taken.clone();
        let free = self
            .client
            .fly()
            .volumes(self.app())
            .await?
            .into_iter()
            .find(|v| {
                v.name == wanted.name
                    && (region.is_empty() || v.region == region)
                    && v.attached_machine_id.is_none()
                    && v.state == "created"
                    && !taken.contains(&v.id)
            });
        let id = match free {
            Some(v) => {
                self.say(
                    &v.id,
                    region,
                    format!("free volume {:?} reused", wanted.name),
                );
                v.id
            }
            None => {
                let mut req = bazaar_types::volume::CreateVolumeRequest {
                    name: wanted.name.clone(),
                    region: Some(region.to_string()).filter(|r| !r.is_empty()),
                    size_gb: Some(wanted.size_gb),
                    compute: config.guest.clone(),
                    snapshot_retention: self.opts.snapshot_retention.get(&wanted.name).copied(),
                    ..Default::default()
                };
                // Spread over hosts where the region has room (Fly's default), else beside
                // another volume of the name rather than not at all.
                let v = match self.client.fly().create_volume(self.app(), &req).await {
                    Err(e) if e.to_string().contains("require_unique_zone") => {
                        self.say(
                            "",
                            region,
                            format!(
                                "every host of the region has a volume {:?}: this one goes beside one",
                                wanted.name
                            ),
                        );
                        req.require_unique_zone = Some(false);
                        self.client.fly().create_volume(self.app(), &req).await?
                    }
                    r => r?,
                };
                lock(&self.done).volumes_created.push(v.id.clone());
                self.say(
                    &v.id,
                    &v.region,
                    format!("volume {:?} created ({} GB)", wanted.name, v.size_gb),
                );
                v.id
            }
        };
        lock(&self.done).volumes_taken.push(id.clone());
        Ok(id)
    }

    /// Creates `count` machines of one config in a region and waits until they are up.
    async fn create_batch(
        &self,
        region: &str,
        config: &MachineConfig,
        count: usize,
        cordoned: bool,
        gate: bool,
    ) -> Result<Vec<String>, Failure> {
        let fail = |error: anyhow::Error| Failure {
            id: String::new(),
            region: region.to_string(),
            error,
        };
        // A batch may place only some: ask again for the rest, a few rounds.
        let mut ms = Vec::new();
        for round in 0.. {
            let want = count - ms.len();
            if want == 0 {
                break;
            }
            let got = self
                .client
                .create(self.app(), config, region, want, cordoned, TTL_SECS)
                .await;
            let got = match got {
                Ok(g) => g,
                Err(e)
                    if round < 5
                        && crate::api::status_of(&e).is_some_and(|s| s == 409 || s >= 500) =>
                {
                    Vec::new()
                }
                Err(e) => return Err(fail(e)),
            };
            for m in &got {
                if let Some(n) = &m.nonce {
                    self.leases.adopt(&m.id, n);
                }
                lock(&self.done)
                    .created
                    .push((m.id.clone(), region.to_string()));
            }
            if got.is_empty() {
                if round >= 5 {
                    return Err(fail(anyhow::anyhow!(
                        "only {} of {count} machine(s) could be placed in {}",
                        ms.len(),
                        if region.is_empty() {
                            "the default region"
                        } else {
                            region
                        }
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200 << round.min(4))).await;
            }
            ms.extend(got);
        }
        let mut ids = Vec::new();
        for m in &ms {
            self.say(&m.id, region, "created");
            ids.push((m.id.clone(), Some(m.instance_id.clone())));
        }
        let waits = ids.iter().map(|(id, v)| async move {
            self.wait_up(id, region, v.as_deref(), config, gate)
                .await
                .map_err(|error| Failure {
                    id: id.clone(),
                    region: region.to_string(),
                    error,
                })?;
            self.say(id, region, "healthy");
            self.progress.event(Event::Advance);
            Ok::<(), Failure>(())
        });
        for r in futures_util::future::join_all(waits).await {
            r?;
        }
        Ok(ids.into_iter().map(|(id, _)| id).collect())
    }

    /// Drains and destroys a machine.
    pub(super) async fn destroy(&self, id: &str, region: &str, drain: bool) -> Result<(), Failure> {
        let fail = |error: anyhow::Error| Failure {
            id: id.to_string(),
            region: region.to_string(),
            error,
        };
        if drain {
            self.drain(id, region).await.map_err(fail)?;
        }
        let nonce = self.leases.acquire(id).await.map_err(fail)?;
        // Gone means gone: stopped (kill_signal, then kill_timeout) and destroyed. A
        // destroy without force refuses a running machine, so it is stopped first; 412 on
        // the stop means there is nothing running to stop.
        let timeout = self.opts.wait_timeout.max(Duration::from_secs(30));
        match self
            .client
            .action(self.app(), id, "stop", None, Some(&nonce))
            .await
        {
            Ok(_) => self
                .client
                .wait(self.app(), id, "stopped", None, timeout)
                .await
                .map_err(fail)?,
            Err(e) if crate::api::status_of(&e) == Some(412) => {}
            Err(e) => return Err(fail(e)),
        }
        self.client
            .destroy(self.app(), id, Some(&nonce))
            .await
            .map_err(fail)?;
        self.leases.forget(id);
        self.client
            .wait(self.app(), id, "destroyed", None, timeout)
            .await
            .map_err(fail)?;
        lock(&self.done).destroyed.push(id.to_string());
        self.say(id, region, "destroyed");
        self.progress.event(Event::Advance);
        Ok(())
    }

    /// Sets a machine's release label without restarting it.
    pub(super) async fn relabel(
        &self,
        id: &str,
        region: &str,
        release: &str,
    ) -> Result<(), Failure> {
        let fail = |error: anyhow::Error| Failure {
            id: id.to_string(),
            region: region.to_string(),
            error,
        };
        let nonce = self.leases.acquire(id).await.map_err(fail)?;
        let old = self
            .client
            .machine(self.app(), id)
            .await
            .ok()
            .and_then(|m| m.config.metadata.get(crate::META_RELEASE).cloned());
        self.client
            .fly()
            .set_metadata(self.app(), id, crate::META_RELEASE, release, Some(&nonce))
            .await
            .map_err(|e| fail(e.into()))?;
        lock(&self.done).relabeled.push((id.to_string(), old));
        Ok(())
    }
}
