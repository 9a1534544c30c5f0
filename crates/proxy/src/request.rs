//! A client's request made ready to send to a machine, possibly several times: its head as
//! received, its body buffered when small enough to be replayed, the headers this proxy
//! adds (`X-Forwarded-*`, the request id), and the rule for which received headers are
//! passed on (hop-by-hop ones are not).

use crate::body::{reply, ReqBody, RespBody};
use crate::upgrade::ClientUpgrade;
use crate::wire::{idempotent, strip_hop_by_hop, HOP_MACHINE, HOP_TOKEN, HOP_WAKE};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, HOST};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// Bodies up to this size are buffered, so the request can be retried elsewhere.
pub(crate) const REPLAYABLE_BODY: u64 = 64 * 1024;

/// A request ready to be sent (possibly several times). Its headers are kept as received:
/// what is not passed on ([`crate::wire::forwarded`]) is left out when it is sent, and `extra` is added.
pub(crate) struct Prepared {
    pub parts: http::request::Parts,
    /// Headers this proxy sets, in place of any received under the same name.
    pub extra: Vec<(HeaderName, HeaderValue)>,
    /// `Some` when the body can be replayed.
    pub body: Option<Bytes>,
    pub stream: Option<Incoming>,
    /// The client asked to switch protocols (WebSocket).
    pub upgrade: Option<ClientUpgrade>,
}

impl Prepared {
    pub(crate) fn replayable(&self) -> bool {
        self.body.is_some()
    }

    /// The request for one attempt, or `None` when the streamed body was already used.
    pub(crate) fn build(&mut self, uri: Uri) -> Option<Request<ReqBody>> {
        let body = match (&self.body, self.stream.take()) {
            (Some(b), _) => ReqBody::Full((!b.is_empty()).then(|| b.clone())),
            (None, Some(s)) => ReqBody::Stream(s),
            (None, None) => return None,
        };
        let mut req = Request::new(body);
        *req.method_mut() = self.parts.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_11;
        let headers = req.headers_mut();
        *headers = self.parts.headers.clone();
        strip_hop_by_hop(headers);
        for h in [HOP_TOKEN, HOP_MACHINE, HOP_WAKE] {
            headers.remove(h);
        }
        for (name, value) in &self.extra {
            headers.insert(name.clone(), value.clone());
        }
        if let Some(u) = &self.upgrade {
            u.mark(req.headers_mut());
        }
        Some(req)
    }

    pub(crate) fn idempotent(&self) -> bool {
        idempotent(&self.parts.method)
    }
}

/// Marks a request that came over TLS (the `X-Forwarded-Proto` it gets, and no redirect
/// by `force_https`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Https;

/// A client's request body as it arrived: still to be read through hyper, or already read
/// whole by the plain HTTP/1.1 server ([`crate::ingress::h1`]).
pub(crate) enum ClientBody {
    Hyper(Incoming),
    Buffered(Bytes),
}

/// Reads what is needed of a request to send it: its head, and its body when it is small
/// enough to be replayed. `extra`: headers to set on it.
pub(crate) async fn prepare(
    mut parts: http::request::Parts,
    body: ClientBody,
    mut extra: Vec<(HeaderName, HeaderValue)>,
) -> Result<Prepared, Response<RespBody>> {
    if !parts.headers.contains_key(HOST) {
        if let Some(a) = parts.uri.authority() {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                extra.push((HOST, v));
            }
        }
    }
    let upgrade = ClientUpgrade::take(&mut parts);
    let (body, stream) = match body {
        ClientBody::Buffered(b) => (Some(b), None),
        ClientBody::Hyper(body) if http_body::Body::is_end_stream(&body) => {
            (Some(Bytes::new()), None)
        }
        ClientBody::Hyper(body)
            if http_body::Body::size_hint(&body)
                .upper()
                .is_some_and(|n| n <= REPLAYABLE_BODY) =>
        {
            match body.collect().await {
                Ok(b) => (Some(b.to_bytes()), None),
                Err(err) => {
                    return Err(reply(
                        StatusCode::BAD_REQUEST,
                        format!("bazaar proxy: reading the request body: {err}"),
                    ))
                }
            }
        }
        ClientBody::Hyper(body) => (None, Some(body)),
    };
    Ok(Prepared {
        parts,
        extra,
        body,
        stream,
        upgrade,
    })
}

/// `<ulid>-<region>`, in one allocation that also holds the reference count the request
/// and its answer share (a `Vec`'s bytes take a second allocation when first shared).
pub(crate) fn request_id(region: &str) -> HeaderValue {
    let mut id = RequestId {
        bytes: [0; RequestId::ROOM],
        len: 0,
    };
    let region = region.as_bytes();
    let len = ulid::ULID_LEN + 1 + region.len();
    if len > RequestId::ROOM {
        let mut long = vec![0; len];
        write_request_id(&mut long, region);
        return HeaderValue::from_maybe_shared(Bytes::from(long))
            .unwrap_or_else(|_| HeaderValue::from_static("-"));
    }
    write_request_id(&mut id.bytes[..len], region);
    id.len = len as u8;
    HeaderValue::from_maybe_shared(Bytes::from_owner(id))
        .unwrap_or_else(|_| HeaderValue::from_static("-"))
}

fn write_request_id(out: &mut [u8], region: &[u8]) {
    let (ulid, rest) = out.split_at_mut(ulid::ULID_LEN);
    ulid::Ulid::from_parts(crate::clock::now_ms(), rand::random())
        .array_to_str(ulid.try_into().expect("ULID_LEN bytes"));
    rest[0] = b'-';
    rest[1..].copy_from_slice(region);
}

/// A request id's bytes, kept inline.
struct RequestId {
    bytes: [u8; RequestId::ROOM],
    len: u8,
}

impl RequestId {
    /// Room for the ULID, a dash and a region name of up to 37 bytes.
    const ROOM: usize = 64;
}

impl AsRef<[u8]> for RequestId {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// The request target in origin form (`/path?query`), as written by the fast path.
pub(crate) fn origin_target(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |pq| pq.as_str())
}

/// The request's URI in origin form (`/path?query`), as sent upstream over HTTP/1.1.
pub(crate) fn origin_uri(parts: &http::request::Parts) -> Uri {
    let uri = &parts.uri;
    if uri.scheme().is_none() && uri.authority().is_none() && uri.path_and_query().is_some() {
        return uri.clone();
    }
    match uri.path_and_query() {
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_a_ulid_and_the_region() {
        for region in ["ams", "a-region-name-of-forty-bytes-1234567890"] {
            let id = request_id(region);
            let text = id.to_str().unwrap();
            let (ulid, rest) = text.split_at(ulid::ULID_LEN);
            assert!(ulid::Ulid::from_string(ulid).is_ok(), "{text}");
            assert_eq!(rest, format!("-{region}"));
            assert_eq!(id.clone(), id);
        }
        assert_ne!(request_id("ams"), request_id("ams"));
    }
}
