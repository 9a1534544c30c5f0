//! Scale from zero and to zero, on the machine's own host.
//!
//! - [`ensure_awake`]: starts a stopped or suspended machine through the agent and waits
//!   (bounded by [`WAKE_TIMEOUT`]) until its service accepts connections, polling
//!   every millisecond; concurrent requests for the same machine share one wake-up.
//! - The autostop loop: every 250 ms, a started machine of this host whose service has
//!   `autostop` and that has served nothing for `autostop_idle` is drained (no new requests
//!   are admitted; it must have none in flight) and stopped or suspended, keeping
//!   `min_machines_running` of the app's started machines (the ones with the smallest ids,
//!   a rule every host computes alike) running.

use crate::body::{retry_reply, RespBody};
use crate::metrics::{AppLabel, KindLabels};
use crate::route::{self, AtOwner};
use crate::shared::{lock, Shared};
use crate::table::Backend;
use bazaar_types::config::Autostop;
use http::Response;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Longest time a request is held while its machine is woken.
pub const WAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// The owner side of a hop (HTTP or TCP), before it admits anything: machine `b` of this
/// host must be ready, or be woken ([`route::at_owner`]); otherwise the answer tells the
/// first proxy to go elsewhere.
pub(crate) async fn ready_for_hop(
    shared: &Arc<Shared>,
    b: &Backend,
    wake: bool,
) -> Result<(), Response<RespBody>> {
    let id = &b.id;
    match route::at_owner(b, wake) {
        AtOwner::Ready => Ok(()),
        AtOwner::Refuse => Err(retry_reply(
            true,
            format!("bazaar proxy: machine {id} cannot take traffic"),
        )),
        AtOwner::Wake => ensure_awake(shared, b)
            .await
            .map_err(|err| retry_reply(true, format!("bazaar proxy: waking machine {id}: {err}"))),
    }
}

/// Wakes a machine of this host (or waits for the wake-up already under way).
pub(crate) async fn ensure_awake(shared: &Arc<Shared>, b: &Backend) -> Result<(), String> {
    let mut rx = {
        let mut wakes = lock(&shared.wakes);
        match wakes.get(&b.id) {
            Some(rx) => rx.clone(),
            None => {
                let (tx, rx) = watch::channel(None);
                wakes.insert(b.id.clone(), rx.clone());
                let (shared, b) = (shared.clone(), b.clone());
                let shutdown = shared.node.shutdown_token();
                shared.node.clone().spawn(async move {
                    let t0 = Instant::now();
                    let r = tokio::select! {
                        () = shutdown.cancelled() => Err("the host is shutting down".to_string()),
                        r = wake(&shared, &b) => r,
                    };
                    let kind = if r.is_ok() { "ok" } else { "failed" };
                    shared
                        .metrics
                        .wakes
                        .get_or_create(&KindLabels {
                            app: b.app.clone(),
                            kind,
                        })
                        .inc();
                    if r.is_ok() {
                        shared
                            .metrics
                            .wake_latency
                            .get_or_create(&AppLabel { app: b.app.clone() })
                            .observe(t0.elapsed().as_secs_f64());
                        tracing::info!(machine.id = %b.id, app = %b.app, elapsed_ms = t0.elapsed().as_millis() as u64, "woke machine");
                    }
                    lock(&shared.wakes).remove(&b.id);
                    let _ = tx.send(Some(r));
                });
                rx
            }
        }
    };
    let result = match rx.wait_for(|v| v.is_some()).await {
        Ok(v) => v.clone().unwrap_or(Err("wake abandoned".into())),
        Err(_) => Err("wake abandoned".into()),
    };
    result
}

/// Starts machine `b` if it rests and may be started, and waits (bounded) until its service
/// accepts connections.
pub(crate) async fn wake(shared: &Arc<Shared>, b: &Backend) -> Result<(), String> {
    b.load.draining.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    let deadline = t0 + WAKE_TIMEOUT;
    let mut last_start: Option<Instant> = None;
    let mut last_error = String::new();
    loop {
        // Not started yet: the connection is refused at once (loopback).
        if tokio::net::TcpStream::connect(b.addr).await.is_ok() {
            b.load
                .last_active_ms
                .store(crate::clock::now_ms(), Ordering::SeqCst);
            return Ok(());
        }
        let state = shared.catalog.machine(&b.id).map(|v| v.record.state);
        match state.as_deref() {
            None | Some("destroyed") | Some("destroying") => {
                return Err(format!("machine {} is gone", b.id))
            }
            // Waited for while `starting` (someone else started it), it is at rest again:
            // that start failed or was undone. Only autostart may start it now; an
            // anonymous request never starts what the app's owner keeps stopped.
            Some(rest @ ("stopped" | "suspended")) if !b.limits.autostart => {
                return Err(format!(
                    "machine {} is {rest} and its service does not autostart",
                    b.id
                ))
            }
            Some("stopped") | Some("suspended")
                if last_start.is_none_or(|t| t.elapsed() > Duration::from_millis(250)) =>
            {
                last_start = Some(Instant::now());
                if let Err(err) = shared.node.start_machine(&b.id).await {
                    tracing::debug!(machine.id = %b.id, error = %err, "autostart");
                    last_error = err.to_string();
                }
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "machine {} did not accept connections within {:?}{}",
                b.id,
                WAKE_TIMEOUT,
                if last_error.is_empty() {
                    String::new()
                } else {
                    format!(" ({last_error})")
                }
            ));
        }
        let pause = if t0.elapsed() < Duration::from_millis(200) {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(10)
        };
        tokio::time::sleep(pause).await;
    }
}

/// Starts the autostop loop, a task of the node's tracker (as the stops it starts).
pub(crate) fn spawn_autostop(shared: Arc<Shared>, shutdown: CancellationToken) {
    shared.node.clone().spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => autostop_pass(&shared),
            }
        }
    });
}

fn autostop_pass(shared: &Arc<Shared>) {
    let table = shared.table();
    let now = crate::clock::now_ms();
    let idle_ms = shared.autostop_idle.as_millis() as u64;
    for route in table.apps.values() {
        let started: Vec<&Arc<Backend>> = route.backends.iter().filter(|b| b.started).collect();
        for (pos, b) in started.iter().enumerate() {
            if !b.local || b.limits.autostop == Autostop::Off {
                continue;
            }
            if (pos as u32) < b.limits.min_running {
                continue;
            }
            let load = &b.load;
            let tcp_busy = table
                .tcp
                .values()
                .flat_map(|(_, r)| r.backends.iter())
                .filter(|t| t.id == b.id)
                .any(|t| {
                    t.load.inflight.load(Ordering::SeqCst) > 0
                        || now.saturating_sub(t.load.last_active_ms.load(Ordering::SeqCst))
                            < idle_ms
                });
            if tcp_busy
                || load.draining.load(Ordering::SeqCst)
                || load.inflight.load(Ordering::SeqCst) > 0
                || now.saturating_sub(load.last_active_ms.load(Ordering::SeqCst)) < idle_ms
                || lock(&shared.wakes).contains_key(&b.id)
            {
                continue;
            }
            // Drain: admit nothing new, and go ahead only if nothing is in flight.
            load.draining.store(true, Ordering::SeqCst);
            if load.inflight.load(Ordering::SeqCst) > 0 {
                load.draining.store(false, Ordering::SeqCst);
                continue;
            }
            let (shared, b) = (shared.clone(), (*b).clone());
            shared.node.clone().spawn(async move {
                let mut action = b.limits.autostop;
                let mut r = Err(String::new());
                if action == Autostop::Suspend {
                    r = shared
                        .node
                        .suspend_machine(&b.id)
                        .await
                        .map_err(|e| e.to_string());
                    if r.is_err() {
                        // Suspend needs cgroups; stopping is the next best thing.
                        action = Autostop::Stop;
                    }
                }
                if action == Autostop::Stop {
                    r = shared
                        .node
                        .stop_machine(&b.id)
                        .await
                        .map_err(|e| e.to_string());
                }
                match r {
                    Ok(()) => {
                        let kind = if action == Autostop::Suspend {
                            "suspend"
                        } else {
                            "stop"
                        };
                        tracing::info!(machine.id = %b.id, app = %b.app, kind, "autostop: idle machine");
                        shared
                            .metrics
                            .autostops
                            .get_or_create(&KindLabels {
                                app: b.app.clone(),
                                kind,
                            })
                            .inc();
                    }
                    Err(err) => {
                        tracing::warn!(machine.id = %b.id, error = %err, "autostop");
                        b.load.draining.store(false, Ordering::SeqCst);
                    }
                }
            });
        }
    }
}
