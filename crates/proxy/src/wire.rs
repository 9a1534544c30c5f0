//! The proxy's wire vocabulary, shared by every stage: the headers of hops between
//! proxies and of Fly's protocol, the limits on a client's request head, and the rules for
//! which headers apply to one connection only (RFC 9110 §7.6.1) and which methods may be
//! sent again.

use http::header::HeaderName;
use http::Method;
use std::time::Duration;

/// Header a proxy sets when it hands a request to the proxy of the machine's host.
pub const HOP_TOKEN: HeaderName = HeaderName::from_static("bazaar-proxy-hop");
/// The machine a hop is for.
pub const HOP_MACHINE: HeaderName = HeaderName::from_static("bazaar-proxy-machine");
/// Set on a hop's answer when the request was not delivered (safe to send elsewhere).
pub const HOP_RETRY: HeaderName = HeaderName::from_static("bazaar-proxy-retry");
/// Set on a hop when the first proxy chose to wake the machine.
pub const HOP_WAKE: HeaderName = HeaderName::from_static("bazaar-proxy-wake");
/// The request id (as Fly names it).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("fly-request-id");
/// Pins a request to one machine.
pub const FORCE_INSTANCE: HeaderName = HeaderName::from_static("fly-force-instance-id");
/// The public port of the TCP service a hop is for.
pub const HOP_TCP_PORT: HeaderName = HeaderName::from_static("bazaar-proxy-tcp-port");
/// The protocol a TCP hop upgrades to.
pub const TCP_PROTOCOL: &str = "bazaar-tcp";

/// Slow clients: the whole request head must arrive within this.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Whether a request with this method may be sent again after a failed exchange (RFC 9110
/// §9.2.2).
pub(crate) fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// Whether a received header is passed on to the machine: not one that applies to one
/// connection only (RFC 9110 §7.6.1; names a `Connection` header lists are checked apart)
/// nor one of the hop's own.
pub(crate) fn forwarded(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authorization"
            | "keep-alive"
            | "proxy-connection"
            | "bazaar-proxy-hop"
            | "bazaar-proxy-machine"
            | "bazaar-proxy-wake"
    )
}

/// Headers that apply to one connection only (RFC 9110 §7.6.1).
pub(crate) fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    if let Some(conn) = headers.get(http::header::CONNECTION).cloned() {
        if let Ok(conn) = conn.to_str() {
            for name in conn.split(',') {
                if let Ok(n) = HeaderName::from_bytes(name.trim().as_bytes()) {
                    headers.remove(n);
                }
            }
        }
    }
    for h in [
        http::header::CONNECTION,
        http::header::TE,
        http::header::TRAILER,
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        http::header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(h);
    }
}
