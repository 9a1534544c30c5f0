//! The HTTP request path, from a request an ingress read ([`crate::ingress`]) to the answer
//! it writes back: the app by Host (or an attached hostname, ACME, `force_https`:
//! [`crate::certs`]), the request made ready to send with `X-Forwarded-*` and a request id
//! ([`crate::request`]), then per attempt the machine chosen ([`crate::route`], with
//! `fly-force-instance-id`), woken ([`crate::scale`]) and sent to directly or through its
//! host's proxy ([`crate::h1`], [`crate::pool`]), and its answer passed on
//! ([`crate::body`]); retries and bounded waiting. Also the owner side of a hop
//! ([`serve_hop`]).

use crate::body::{reply, retry_reply, Guard, RespBody};
use crate::h1;
use crate::hop_tls::{SendError, Upstream};
use crate::metrics::{AppLabel, KindLabels};
use crate::request::{origin_target, origin_uri, prepare, request_id, ClientBody, Prepared};
use crate::route::{self, Decision};
use crate::shared::Local;
use crate::table::{Backend, RouteState};
use crate::wire::{
    strip_hop_by_hop, FORCE_INSTANCE, HOP_MACHINE, HOP_RETRY, HOP_TCP_PORT, HOP_TOKEN, HOP_WAKE,
    REQUEST_ID,
};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, HOST};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// A machine whose connection failed is skipped this long.
const FAILED_SKIP_MS: u64 = 1000;
/// The app a Host header names: `<app>.<domain>`, port and trailing dot ignored.
pub(crate) fn app_of_host<'a>(host: &'a str, suffix: &str) -> Option<&'a str> {
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.len() <= suffix.len() || !host.is_char_boundary(host.len() - suffix.len()) {
        return None;
    }
    let (app, tail) = host.split_at(host.len() - suffix.len());
    (tail.eq_ignore_ascii_case(suffix) && !app.is_empty() && !app.contains('.')).then_some(app)
}

/// The Host header (or the URI's authority, as in HTTP/2): a cheap reference to the
/// request's bytes.
fn host_of(req: &http::request::Parts) -> Option<HeaderValue> {
    match req.headers.get(HOST) {
        Some(h) => Some(h.clone()),
        None => HeaderValue::from_str(req.uri.authority()?.as_str()).ok(),
    }
}

/// A client's request (or a hop from another host's proxy), from either server.
pub(crate) async fn handle_parts(
    shared: Arc<Local>,
    peer_ip: &HeaderValue,
    req: http::request::Parts,
    body: ClientBody,
) -> Response<RespBody> {
    if let Some(token) = req.headers.get(&HOP_TOKEN) {
        if shared.hop_tls.is_some() {
            // Hops to a host with a certificate come over mTLS, to its hop listener.
            return reply(
                StatusCode::FORBIDDEN,
                "bazaar proxy: hops to this host go over mTLS",
            );
        }
        if bazaar_node::secrets::constant_time_eq(token.as_bytes(), shared.secret.as_bytes()) {
            return serve_hop(shared, req, body).await;
        }
        return reply(StatusCode::FORBIDDEN, "bazaar proxy: bad hop token");
    }
    if let Some(answer) = crate::certs::acme_answer(&shared, &req) {
        return answer;
    }
    let started = Instant::now();
    let Some(host) = host_of(&req).filter(|h| h.to_str().is_ok()) else {
        return reply(
            StatusCode::BAD_REQUEST,
            "bazaar proxy: the request has no Host header",
        );
    };
    let lowered;
    let host = match host.to_str().unwrap_or_default() {
        h if h.bytes().any(|b| b.is_ascii_uppercase()) => {
            lowered = h.to_ascii_lowercase();
            lowered.as_str()
        }
        h => h,
    };
    let attached;
    let app = match app_of_host(host, &shared.domain_suffix) {
        Some(app) => app,
        None => match crate::certs::app_of_hostname(&shared, host) {
            Some(app) => {
                attached = app;
                attached.as_str()
            }
            None => {
                return reply(
                    StatusCode::NOT_FOUND,
                    format!(
                        "bazaar proxy: no app is served at {host:?} (apps are served at <app>{})",
                        shared.domain_suffix
                    ),
                )
            }
        },
    };
    let resp = forward(&shared, app, host, peer_ip, req, body, started).await;
    shared
        .metrics
        .record_request(app, resp.status().as_u16(), started.elapsed().as_secs_f64());
    resp
}

/// What the table says to do with a request.
enum Pick {
    Reply(Response<RespBody>),
    /// Send to this machine; `true`: wake it first.
    Machine(Arc<Backend>, bool),
    Wait,
}

/// What one attempt at a machine came to.
enum Attempt {
    Done(Response<RespBody>),
    /// Not delivered; another machine may take it. `failed`: the machine (or its host)
    /// failed, rather than being busy.
    Retry {
        failed: bool,
    },
}

/// The edge side: choose a machine, send, retry, wait, wake.
async fn forward(
    shared: &Arc<Local>,
    app: &str,
    host: &str,
    peer_ip: &HeaderValue,
    req: http::request::Parts,
    body: ClientBody,
    started: Instant,
) -> Response<RespBody> {
    let https = req.extensions.get::<crate::request::Https>().is_some();
    match shared.with_table(|t| t.apps.get(app).map(|r| r.force_https)) {
        None => {
            return reply(
                StatusCode::NOT_FOUND,
                format!("bazaar proxy: no app named {app:?}"),
            )
        }
        Some(true) if !https => return crate::certs::redirect_to_https(shared, host, &req),
        Some(_) => {}
    }
    let force = req
        .headers
        .get(&FORCE_INSTANCE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let rid = request_id(&shared.region);
    let xff = match req.headers.get(&X_FORWARDED_FOR).map(HeaderValue::to_str) {
        Some(Ok(prev)) => {
            HeaderValue::from_str(&format!("{prev}, {}", peer_ip.to_str().unwrap_or("")))
                .unwrap_or_else(|_| peer_ip.clone())
        }
        _ => peer_ip.clone(),
    };
    let extra = vec![
        (X_FORWARDED_FOR, xff),
        (
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if https { "https" } else { "http" }),
        ),
        (REQUEST_ID, rid.clone()),
    ];
    let mut prepared = match prepare(req, body, extra).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let deadline = started + shared.queue_timeout;
    let mut tried: Vec<String> = Vec::new();
    let mut last_failure: Option<&'static str> = None;
    let mut resp = loop {
        let now_ms = crate::clock::now_ms();
        let pick = shared.with_table(|table| {
            let Some(route) = table.apps.get(app) else {
                return Pick::Reply(reply(
                    StatusCode::NOT_FOUND,
                    format!("bazaar proxy: no app named {app:?}"),
                ));
            };
            let backends = &route.backends;
            match route::decide(backends, force.as_deref(), &tried, now_ms, rand::random()) {
                Decision::Send(i) => Pick::Machine(backends[i].clone(), false),
                Decision::Wake(i) => Pick::Machine(backends[i].clone(), true),
                Decision::Wait => Pick::Wait,
                Decision::NoMachine => Pick::Reply(match &force {
                    Some(id) => reply(
                        StatusCode::NOT_FOUND,
                        format!(
                            "bazaar proxy: app {app:?} has no machine {id:?} (fly-force-instance-id)"
                        ),
                    ),
                    None => reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("bazaar proxy: app {app:?} has no machines with an HTTP service"),
                    ),
                }),
            }
        });
        let (b, wake) = match pick {
            Pick::Reply(r) => break r,
            Pick::Machine(b, wake) => (b, wake),
            Pick::Wait => {
                let now = Instant::now();
                if now >= deadline {
                    let why = match last_failure {
                        Some(w) => format!(" (last attempt: {w})"),
                        None => String::new(),
                    };
                    break reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "bazaar proxy: no machine of app {app:?} could take the request within {:?}{why}",
                            shared.queue_timeout
                        ),
                    );
                }
                // Machines that were only busy may have room now.
                tried.clear();
                let pause = (deadline - now).min(Duration::from_millis(50));
                shared.wait_for_slot(pause).await;
                continue;
            }
        };
        let attempt = if b.local {
            if wake || b.state != RouteState::Ready {
                match crate::scale::ensure_awake(shared, &b).await {
                    Ok(()) => send_local(shared, &b, &mut prepared).await,
                    Err(err) => {
                        tracing::warn!(machine.id = %b.id, error = %err, "waking a machine");
                        Attempt::Retry { failed: true }
                    }
                }
            } else {
                send_local(shared, &b, &mut prepared).await
            }
        } else {
            send_remote(shared, &b, &mut prepared, wake).await
        };
        match attempt {
            Attempt::Done(r) => break r,
            Attempt::Retry { failed } => {
                if failed {
                    last_failure = Some("the machine failed");
                } else {
                    last_failure = Some("the machine was busy");
                }
                if !prepared.replayable() {
                    break reply(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "bazaar proxy: machine {} failed and the request cannot be replayed",
                            b.id
                        ),
                    );
                }
                shared
                    .metrics
                    .retries
                    .get_or_create(&AppLabel {
                        app: app.to_string(),
                    })
                    .inc();
                tried.push(b.id.clone());
                if force.is_some() && Instant::now() >= deadline {
                    break reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("bazaar proxy: machine {} cannot take the request", b.id),
                    );
                }
            }
        }
    };
    resp.headers_mut().insert(REQUEST_ID, rid);
    resp
}

/// A machine's answer, from either upstream client.
enum Answer {
    Fast(Response<h1::FastBody>),
    Hyper(Response<Incoming>),
}

impl Answer {
    fn headers(&self) -> &http::HeaderMap {
        match self {
            Answer::Fast(r) => r.headers(),
            Answer::Hyper(r) => r.headers(),
        }
    }
}

/// One attempt at exchanging `prepared` with `up` (plus `hop` headers): on the fast
/// path when its body is buffered and it asks for no upgrade, through hyper otherwise
/// (a new connection's task tracked by `shared`'s node). `None` when its streamed body was
/// already used by an earlier attempt.
async fn exchange(
    shared: &Local,
    up: Upstream<'_>,
    prepared: &mut Prepared,
    hop: &[(HeaderName, HeaderValue)],
) -> Option<Result<Answer, SendError>> {
    if let (Some(body), None) = (&prepared.body, &prepared.upgrade) {
        if prepared.parts.method != Method::CONNECT {
            let ex = h1::Exchange {
                method: &prepared.parts.method,
                target: origin_target(&prepared.parts.uri),
                headers: &prepared.parts.headers,
                extra: &prepared.extra,
                hop,
                body,
            };
            return Some(h1::send(up, &ex).await.map(Answer::Fast));
        }
    }
    let uri = origin_uri(&prepared.parts);
    let mut req = prepared.build(uri)?;
    for (name, value) in hop {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    Some(
        crate::pool::send(up, req, shared.node.tasks())
            .await
            .map(Answer::Hyper),
    )
}

/// Sends to a machine of this host, counting it against the machine's hard limit.
async fn send_local(shared: &Arc<Local>, b: &Backend, prepared: &mut Prepared) -> Attempt {
    if !b.load.try_admit(b.limits.hard) {
        return Attempt::Retry { failed: false };
    }
    b.load
        .app_in_flight
        .get_or_init(|| shared.metrics.in_flight_of(&b.app))
        .inc();
    let guard = Guard {
        load: b.load.clone(),
        shared: shared.clone(),
        gauge: true,
    };
    b.load.touch(crate::clock::now_ms());
    let Some(result) = exchange(shared, Upstream::plain(b.addr), prepared, &[]).await else {
        return Attempt::Retry { failed: true };
    };
    match result {
        Ok(resp) => Attempt::Done(pass_on(prepared, resp, guard)),
        Err(err) => {
            let connect = err.is_connect();
            let kind = if connect { "connect" } else { "request" };
            tracing::debug!(machine.id = %b.id, error = %err, kind, "upstream error");
            shared
                .metrics
                .upstream_errors
                .get_or_create(&KindLabels {
                    app: b.app.clone(),
                    kind,
                })
                .inc();
            b.load
                .failed_until_ms
                .store(crate::clock::now_ms() + FAILED_SKIP_MS, Ordering::Relaxed);
            drop(guard);
            if connect || prepared.idempotent() {
                Attempt::Retry { failed: true }
            } else {
                Attempt::Done(reply(
                    StatusCode::BAD_GATEWAY,
                    format!("bazaar proxy: machine {} failed: {err}", b.id),
                ))
            }
        }
    }
}

/// The machine's response to pass on to the client; a switched protocol is spliced
/// ([`crate::upgrade`]).
fn pass_on(prepared: &mut Prepared, answer: Answer, guard: Guard) -> Response<RespBody> {
    let resp = match answer {
        // The fast path keeps no hop-by-hop header of the answer.
        Answer::Fast(resp) => return resp.map(|body| RespBody::fast(body, guard)),
        Answer::Hyper(resp) => resp,
    };
    if let Some(upgrade) = prepared.upgrade.as_mut() {
        if let Some(client) = upgrade.switched(&resp) {
            return upgrade
                .splice(client, resp, guard)
                .map(|()| RespBody::full(Bytes::new()));
        }
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, RespBody::upstream(body, guard))
}

/// Sends to a machine of another host, through that host's proxy.
async fn send_remote(
    shared: &Arc<Local>,
    b: &Backend,
    prepared: &mut Prepared,
    wake: bool,
) -> Attempt {
    // Over mTLS to the owner's hop listener when both hosts have certificates, else to
    // its proxy port with the cluster secret.
    let (up, secret) = match (&shared.hop_tls, b.hop_tls, &b.hop_name) {
        (Some(tls), Some(addr), Some(name)) => (
            Upstream {
                addr,
                tls: Some((&tls.connector, name)),
            },
            None,
        ),
        _ => match b.hop {
            Some(addr) => (Upstream::plain(addr), Some(&shared.secret)),
            None => return Attempt::Retry { failed: true },
        },
    };
    let hop = up.addr;
    // This proxy's own share of the machine's load: never above its hard limit either.
    if !b.load.try_admit(b.limits.hard) {
        return Attempt::Retry { failed: false };
    }
    let guard = Guard {
        load: b.load.clone(),
        shared: shared.clone(),
        gauge: false,
    };
    let mut extra = Vec::with_capacity(3);
    if let Some(Ok(v)) = secret.map(|s| HeaderValue::from_str(s)) {
        extra.push((HOP_TOKEN, v));
    }
    if let Ok(v) = HeaderValue::from_str(&b.id) {
        extra.push((HOP_MACHINE, v));
    }
    if wake {
        extra.push((HOP_WAKE, HeaderValue::from_static("1")));
    }
    let Some(result) = exchange(shared, up, prepared, &extra).await else {
        return Attempt::Retry { failed: true };
    };
    match result {
        Ok(resp) => {
            if let Some(v) = resp.headers().get(&HOP_RETRY) {
                let failed = v.as_bytes() == b"failed";
                if failed {
                    b.load
                        .failed_until_ms
                        .store(crate::clock::now_ms() + FAILED_SKIP_MS, Ordering::Relaxed);
                }
                return Attempt::Retry { failed };
            }
            Attempt::Done(pass_on(prepared, resp, guard))
        }
        Err(err) => {
            let connect = err.is_connect();
            tracing::debug!(machine.id = %b.id, %hop, error = %err, "hop error");
            shared
                .metrics
                .upstream_errors
                .get_or_create(&KindLabels {
                    app: b.app.clone(),
                    kind: if connect {
                        "hop_connect"
                    } else {
                        "hop_request"
                    },
                })
                .inc();
            b.load
                .failed_until_ms
                .store(crate::clock::now_ms() + FAILED_SKIP_MS, Ordering::Relaxed);
            if connect || prepared.idempotent() {
                Attempt::Retry { failed: true }
            } else {
                Attempt::Done(reply(
                    StatusCode::BAD_GATEWAY,
                    format!("bazaar proxy: the host of machine {} failed: {err}", b.id),
                ))
            }
        }
    }
}

/// The owner side of a hop: deliver to one machine of this host, or say why not.
pub(crate) async fn serve_hop(
    shared: Arc<Local>,
    req: http::request::Parts,
    body: ClientBody,
) -> Response<RespBody> {
    let id = req
        .headers
        .get(&HOP_MACHINE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let wake = req.headers.contains_key(&HOP_WAKE);
    if shared.closing.load(Ordering::SeqCst) {
        // Shutting down (an agent restart, say): the entry proxy sends it to another
        // machine, or to this one again once this host's proxy is back.
        return retry_reply(true, "bazaar proxy: this host is shutting down".to_string());
    }
    if let Some(port) = req.headers.get(&HOP_TCP_PORT) {
        // An upgrade: always served by hyper ([`crate::ingress::h1`] hands those over).
        return match (port.to_str().ok().and_then(|p| p.parse::<u16>().ok()), body) {
            (Some(port), ClientBody::Hyper(body)) => {
                let req = Request::from_parts(req, body);
                crate::tcp::serve_hop(shared.0.clone(), req, port, &id, wake).await
            }
            _ => reply(StatusCode::BAD_REQUEST, "bazaar proxy: bad TCP hop"),
        };
    }
    let found = shared.with_table(|table| {
        table
            .apps
            .values()
            .flat_map(|r| r.backends.iter())
            .find(|b| b.id == id && b.local)
            .cloned()
    });
    let Some(b) = found else {
        return retry_reply(
            true,
            format!("bazaar proxy: no machine {id:?} on this host"),
        );
    };
    if let Err(refused) = crate::scale::ready_for_hop(&shared, &b, wake).await {
        return refused;
    }
    // Sent on as the first proxy made it (its hop headers are not passed on).
    let mut prepared = match prepare(req, body, Vec::new()).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    match send_local(&shared, &b, &mut prepared).await {
        Attempt::Done(r) => r,
        Attempt::Retry { failed } => retry_reply(
            failed,
            format!("bazaar proxy: machine {id} could not take the request"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apps_from_hosts() {
        assert_eq!(app_of_host("web.localhost", ".localhost"), Some("web"));
        assert_eq!(app_of_host("web.localhost:8080", ".localhost"), Some("web"));
        assert_eq!(app_of_host("web.localhost.", ".localhost"), Some("web"));
        assert_eq!(app_of_host("a.b.localhost", ".localhost"), None);
        assert_eq!(app_of_host("localhost", ".localhost"), None);
        assert_eq!(app_of_host(".localhost", ".localhost"), None);
        assert_eq!(app_of_host("web.example.com", ".localhost"), None);
        assert_eq!(app_of_host("wéb.localhost", ".localhost"), Some("wéb"));
    }
}
