//! The plain-HTTP side of certificates per app hostname: answers to ACME HTTP-01
//! challenges (from the catalog's challenge rows, whichever host is issuing), the app a
//! hostname attached with `bazaar certs add` routes to, and the redirect of an app that
//! forces HTTPS (`force_https`, or only `["tls", "http"]` ports), as Fly does.

use crate::body::RespBody;
use crate::shared::Shared;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, LOCATION};
use http::{Response, StatusCode};

/// Where ACME validation asks for a token's key authorization.
const ACME_PREFIX: &str = "/.well-known/acme-challenge/";

/// The answer to an ACME HTTP-01 validation request this cluster is expecting.
pub(crate) fn acme_answer(
    shared: &Shared,
    req: &http::request::Parts,
) -> Option<Response<RespBody>> {
    let token = req.uri.path().strip_prefix(ACME_PREFIX)?;
    let key_authorization = shared.certs.challenge(token)?;
    let mut r = Response::new(RespBody::full(Bytes::from(key_authorization)));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Some(r)
}

/// The app of a hostname attached to it (`host` lowercase; its port and trailing dot are
/// ignored).
pub(crate) fn app_of_hostname(shared: &Shared, host: &str) -> Option<String> {
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    shared.certs.app_of(name.trim_end_matches('.'))
}

/// The 301 that sends a plain-HTTP request to the same host, path and query over HTTPS
/// (on the HTTPS listener's port when it is not 443).
pub(crate) fn redirect_to_https(
    shared: &Shared,
    host: &str,
    req: &http::request::Parts,
) -> Response<RespBody> {
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let port = shared.tls_addr.port();
    let authority = if port == 443 {
        name.to_string()
    } else {
        format!("{name}:{port}")
    };
    let target = req.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let location = format!("https://{authority}{target}");
    let mut r = crate::body::reply(
        StatusCode::MOVED_PERMANENTLY,
        format!("bazaar proxy: this app is served over HTTPS: {location}"),
    );
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(LOCATION, v);
    }
    r
}
