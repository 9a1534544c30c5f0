//! Raw TCP services: every public port of `services[].ports[]` without the `http` handler
//! gets a listener on the proxy's address (the first app by name wins a port two apps
//! claim; a port this host cannot bind is logged once and skipped). Each connection is
//! balanced like an HTTP request ([`crate::balance`], counting connections against the
//! service's limits), a stopped machine of this host is woken first (autostart), a refused
//! connection is retried on another machine, then bytes are copied both ways.

use crate::balance::{self, Availability, Candidate, Choice};
use crate::body::Guard;
use crate::metrics::{AppLabel, KindLabels};
use crate::table::{Backend, RouteState};
use crate::Shared;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Starts the loop that keeps one listener per TCP service port.
pub(crate) fn spawn(shared: Arc<Shared>, ip: IpAddr, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut listening: HashMap<u16, CancellationToken> = HashMap::new();
        let mut failed: HashSet<u16> = HashSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let table = shared.table();
            let wanted: HashSet<u16> = table.tcp.keys().copied().collect();
            listening.retain(|port, token| {
                let keep = wanted.contains(port);
                if !keep {
                    token.cancel();
                }
                keep
            });
            failed.retain(|p| wanted.contains(p));
            for port in wanted {
                if listening.contains_key(&port) || failed.contains(&port) {
                    continue;
                }
                match TcpListener::bind(SocketAddr::new(ip, port)).await {
                    Ok(listener) => {
                        let token = shutdown.child_token();
                        listening.insert(port, token.clone());
                        tracing::info!(port, "proxy: TCP service listening");
                        tokio::spawn(accept_loop(shared.clone(), port, listener, token));
                    }
                    Err(err) => {
                        tracing::warn!(port, error = %err, "proxy: cannot listen for a TCP service");
                        failed.insert(port);
                    }
                }
            }
        }
        for token in listening.values() {
            token.cancel();
        }
    });
}

async fn accept_loop(
    shared: Arc<Shared>,
    port: u16,
    listener: TcpListener,
    stop: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve(shared.clone(), port, stream));
    }
}

async fn serve(shared: Arc<Shared>, port: u16, mut client: TcpStream) {
    let deadline = Instant::now() + shared.queue_timeout;
    let mut tried: Vec<String> = Vec::new();
    loop {
        let table = shared.table();
        let Some((app, route)) = table.tcp.get(&port).cloned() else {
            return;
        };
        drop(table);
        let now_ms = bazaar_types::now_ms();
        let candidates: Vec<Candidate> = route
            .backends
            .iter()
            .map(|b| candidate(b, &tried, now_ms))
            .collect();
        let b: Arc<Backend> = match balance::choose(&candidates, rand::random()) {
            Choice::Send(i) | Choice::Wake(i) => route.backends[i].clone(),
            Choice::Wait => {
                if Instant::now() >= deadline {
                    return;
                }
                tried.clear();
                tokio::select! {
                    () = shared.slot_freed.notified() => {}
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                continue;
            }
        };
        if b.local && b.state != RouteState::Ready {
            if let Err(err) = crate::scale::ensure_awake(&shared, &b).await {
                tracing::warn!(machine.id = %b.id, error = %err, "waking a machine");
                tried.push(b.id.clone());
                continue;
            }
        }
        if !b.load.try_admit(b.limits.hard) {
            tried.push(b.id.clone());
            continue;
        }
        let _guard = Guard {
            load: b.load.clone(),
            shared: shared.clone(),
            gauge: None,
        };
        match TcpStream::connect(b.addr).await {
            Ok(mut upstream) => {
                let _ = upstream.set_nodelay(true);
                shared
                    .metrics
                    .tcp_connections
                    .get_or_create(&AppLabel { app: app.clone() })
                    .inc();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                return;
            }
            Err(err) => {
                tracing::debug!(machine.id = %b.id, error = %err, "TCP connect");
                shared
                    .metrics
                    .upstream_errors
                    .get_or_create(&KindLabels {
                        app: app.clone(),
                        kind: "tcp_connect",
                    })
                    .inc();
                b.load
                    .failed_until_ms
                    .store(bazaar_types::now_ms() + 1000, Ordering::Relaxed);
                tried.push(b.id.clone());
            }
        }
    }
}

fn candidate(b: &Backend, tried: &[String], now_ms: u64) -> Candidate {
    let skipped = tried.contains(&b.id)
        || b.load.failed_until_ms.load(Ordering::Relaxed) > now_ms
        || b.load.draining.load(Ordering::Relaxed);
    let state = match b.state {
        _ if skipped => Availability::Unavailable,
        RouteState::Ready => Availability::Ready,
        // Only this host's machines can be woken from here (no hop for raw TCP).
        RouteState::Starting | RouteState::Stopped if b.local && b.limits.autostart => {
            Availability::Wakeable
        }
        _ => Availability::Unavailable,
    };
    Candidate {
        load: b.load.inflight.load(Ordering::Relaxed),
        soft_limit: b.limits.soft,
        hard_limit: b.limits.hard,
        distance: b.distance,
        state,
    }
}
