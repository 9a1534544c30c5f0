//! Raw TCP services: every public port of `services[].ports[]` without the `http` handler
//! gets a listener on the proxy's address (the first app by name wins a port two apps
//! claim; a port this host cannot bind is logged once and skipped). Each connection is
//! routed by the same rule as an HTTP request ([`crate::route`], counting connections
//! against the service's limits; nothing pins a connection to a machine, as on Fly), a
//! stopped machine is woken first (autostart) and a starting one waited for, a refused
//! connection is retried on another machine, then bytes are copied both ways.
//!
//! A machine of another host is reached through that host's proxy, as HTTP requests are:
//! the entry proxy opens an HTTP/1.1 upgrade to [`TCP_PROTOCOL`] on the owner's proxy
//! listener with the hop headers and the public port; the owner admits the connection
//! against the machine's limits (waking it if asked), connects to it, answers `101` and
//! splices. A machine's address is only ever dialled on its own host.

use crate::body::{retry_reply, Guard, RespBody};
use crate::hop_tls::{Stream, Upstream};
use crate::metrics::{AppLabel, KindLabels};
use crate::route::{self, Decision};
use crate::shared::Shared;
use crate::table::{Backend, RouteState};
use crate::wire::{HOP_MACHINE, HOP_TCP_PORT, HOP_TOKEN, HOP_WAKE, TCP_PROTOCOL};
use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, UPGRADE};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Longest response head a TCP hop accepts from the owner's proxy.
const MAX_HOP_HEAD: usize = 16 * 1024;

/// Starts the loop that keeps one listener per TCP service port. It, the listeners and
/// their connections are tasks of the node's tracker; at `shutdown` the listeners close and
/// the connections are cut.
pub(crate) fn spawn(shared: Arc<Shared>, ip: IpAddr, shutdown: CancellationToken) {
    shared.node.clone().spawn(async move {
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
                        shared.node.spawn(accept_loop(
                            shared.clone(),
                            port,
                            listener,
                            token,
                            shutdown.clone(),
                        ));
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

/// Accepts connections to `port` until `stop` (the port's service is gone, or shutdown);
/// a connection lasts until it ends or `shutdown` cuts it.
async fn accept_loop(
    shared: Arc<Shared>,
    port: u16,
    listener: TcpListener,
    stop: CancellationToken,
    shutdown: CancellationToken,
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
        let (shared, shutdown) = (shared.clone(), shutdown.clone());
        shared.node.clone().spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = serve(shared, port, stream) => {}
            }
        });
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
        // A connection carries no header: nothing pins it to a machine.
        let now_ms = crate::clock::now_ms();
        let b: Arc<Backend> =
            match route::decide(&route.backends, None, &tried, now_ms, rand::random()) {
                Decision::Send(i) | Decision::Wake(i) => route.backends[i].clone(),
                Decision::Wait | Decision::NoMachine => {
                    if Instant::now() >= deadline {
                        return;
                    }
                    tried.clear();
                    shared.wait_for_slot(Duration::from_millis(50)).await;
                    continue;
                }
            };
        let wake = b.state != RouteState::Ready;
        if b.local && wake {
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
            shared: Arc::new(crate::shared::Local(shared.clone())),
            gauge: false,
        };
        let connected = if b.local {
            TcpStream::connect(b.addr)
                .await
                .map(|upstream| (Stream::Plain(upstream), Vec::new()))
        } else {
            hop_connect(&shared, &b, port, wake).await
        };
        match connected {
            Ok((mut upstream, early)) => {
                if b.local {
                    count_delivered(&shared, &app);
                }
                if !early.is_empty() && client.write_all(&early).await.is_err() {
                    return;
                }
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
                        kind: if b.local { "tcp_connect" } else { "tcp_hop" },
                    })
                    .inc();
                b.load
                    .failed_until_ms
                    .store(crate::clock::now_ms() + 1000, Ordering::Relaxed);
                tried.push(b.id.clone());
            }
        }
    }
}

fn count_delivered(shared: &Shared, app: &str) {
    shared
        .metrics
        .tcp_connections
        .get_or_create(&AppLabel {
            app: app.to_string(),
        })
        .inc();
}

/// Opens a connection to machine `b` of another host through that host's proxy (over
/// mTLS to its hop listener when both hosts have certificates, else with the cluster
/// secret). Returns the stream and any bytes the machine already sent after the owner's
/// `101` head.
async fn hop_connect(
    shared: &Shared,
    b: &Backend,
    port: u16,
    wake: bool,
) -> std::io::Result<(Stream, Vec<u8>)> {
    let up = match (&shared.hop_tls, b.hop_tls, &b.hop_name) {
        (Some(tls), Some(addr), Some(name)) => Upstream {
            addr,
            tls: Some((&tls.connector, name)),
        },
        _ => Upstream::plain(
            b.hop
                .ok_or_else(|| std::io::Error::other("the machine's host has no proxy address"))?,
        ),
    };
    let hop = up.addr;
    let mut stream = crate::hop_tls::connect(up)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut head = format!(
        "GET / HTTP/1.1\r\nhost: {hop}\r\nconnection: upgrade\r\nupgrade: {TCP_PROTOCOL}\r\n\
         {HOP_MACHINE}: {}\r\n{HOP_TCP_PORT}: {port}\r\n",
        b.id
    );
    if up.tls.is_none() {
        head.push_str(&format!("{HOP_TOKEN}: {}\r\n", shared.secret));
    }
    if wake {
        head.push_str(&format!("{HOP_WAKE}: 1\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.flush().await?;
    // The owner may take a while when it wakes the machine first.
    let answer = tokio::time::timeout(crate::scale::WAKE_TIMEOUT + Duration::from_secs(5), async {
        let mut buf = Vec::with_capacity(512);
        let mut chunk = [0u8; 2048];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::other("the owner's proxy closed the hop"));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let early = buf.split_off(end + 4);
                return Ok((buf, early));
            }
            if buf.len() > MAX_HOP_HEAD {
                return Err(std::io::Error::other(
                    "the owner's proxy sent an oversized head",
                ));
            }
        }
    })
    .await
    .map_err(|_| std::io::Error::other("the owner's proxy did not answer the hop in time"))??;
    let (head, early) = answer;
    if !head.starts_with(b"HTTP/1.1 101") {
        let status =
            String::from_utf8_lossy(head.split(|&c| c == b'\r').next().unwrap_or_default())
                .into_owned();
        return Err(std::io::Error::other(format!(
            "the owner's proxy refused the hop: {status}"
        )));
    }
    Ok((stream, early))
}

/// The owner side of a TCP hop: admit the connection to this host's machine `id` on the
/// service of public `port`, connect to it, answer `101` and splice.
pub(crate) async fn serve_hop(
    shared: Arc<Shared>,
    mut req: Request<Incoming>,
    port: u16,
    id: &str,
    wake: bool,
) -> Response<RespBody> {
    let table = shared.table();
    let Some((app, b)) = table.tcp.get(&port).and_then(|(app, route)| {
        let b = route.backends.iter().find(|b| b.id == id && b.local)?;
        Some((app.clone(), b.clone()))
    }) else {
        return retry_reply(
            true,
            format!("bazaar proxy: no machine {id:?} with TCP port {port} on this host"),
        );
    };
    drop(table);
    if let Err(refused) = crate::scale::ready_for_hop(&shared, &b, wake).await {
        return refused;
    }
    if !b.load.try_admit(b.limits.hard) {
        return retry_reply(
            false,
            format!("bazaar proxy: machine {id} is at its hard limit"),
        );
    }
    let guard = Guard {
        load: b.load.clone(),
        shared: Arc::new(crate::shared::Local(shared.clone())),
        gauge: false,
    };
    let mut upstream = match TcpStream::connect(b.addr).await {
        Ok(s) => s,
        Err(err) => {
            b.load
                .failed_until_ms
                .store(crate::clock::now_ms() + 1000, Ordering::Relaxed);
            return retry_reply(true, format!("bazaar proxy: machine {id}: {err}"));
        }
    };
    let _ = upstream.set_nodelay(true);
    count_delivered(&shared, &app);
    let client = hyper::upgrade::on(&mut req);
    // On the proxy thread that serves the hop: cut, at the latest, with its runtime.
    shared.node.spawn(async move {
        let _in_flight = guard;
        match client.await {
            Ok(client) => {
                let mut client = TokioIo::new(client);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
            Err(err) => tracing::debug!(error = %err, "TCP hop upgrade failed"),
        }
    });
    let mut resp = Response::new(RespBody::full(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(UPGRADE, HeaderValue::from_static(TCP_PROTOCOL));
    resp
}
