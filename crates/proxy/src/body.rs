//! Egress: request and response bodies of the proxy, the proxy's own answers ([`reply`]),
//! and the guard that counts a request in flight on a machine until its response body has
//! been sent.

use crate::h1::FastBody;
use crate::shared::Local;
use crate::table::Load;
use bytes::Bytes;
use http::header::HeaderValue;
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A request body sent upstream: buffered (replayable) or streamed once.
#[derive(Debug)]
pub enum ReqBody {
    Full(Option<Bytes>),
    Stream(Incoming),
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReqBody::Stream(s) => Pin::new(s).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Full(b) => b.is_none(),
            ReqBody::Stream(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Full(None) => SizeHint::with_exact(0),
            ReqBody::Stream(s) => s.size_hint(),
        }
    }
}

/// Counts one request in flight on a machine; dropping it ends the request.
pub struct Guard {
    pub load: Arc<Load>,
    pub shared: Arc<Local>,
    /// Counted in its app's in-flight gauge too (`load.app_in_flight`).
    pub gauge: bool,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guard")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.load.touch(crate::clock::now_ms());
        self.load.inflight.fetch_sub(1, Ordering::SeqCst);
        if let (true, Some(g)) = (self.gauge, self.load.app_in_flight.get()) {
            g.dec();
        }
        self.shared.request_ended();
    }
}

/// A response body: from a machine (holding its in-flight guard) or made by the proxy.
#[derive(Debug)]
pub struct RespBody {
    inner: RespInner,
    guard: Option<Guard>,
}

#[derive(Debug)]
enum RespInner {
    Full(Option<Bytes>),
    Upstream(Incoming),
    Fast(FastBody),
}

/// Why a response body could not be passed on.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl RespBody {
    /// A body made by the proxy.
    pub fn full(b: impl Into<Bytes>) -> RespBody {
        let b = b.into();
        RespBody {
            inner: RespInner::Full((!b.is_empty()).then_some(b)),
            guard: None,
        }
    }

    /// A machine's body; the request stays in flight until it is sent (or dropped).
    pub fn upstream(b: Incoming, guard: Guard) -> RespBody {
        RespBody {
            inner: RespInner::Upstream(b),
            guard: Some(guard),
        }
    }

    /// A machine's body read by the fast path ([`crate::h1`]).
    pub(crate) fn fast(b: FastBody, guard: Guard) -> RespBody {
        RespBody {
            inner: RespInner::Fast(b),
            guard: Some(guard),
        }
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let r = match &mut this.inner {
            RespInner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespInner::Upstream(s) => Pin::new(s).poll_frame(cx).map_err(Into::into),
            RespInner::Fast(s) => Pin::new(s).poll_frame(cx).map_err(Into::into),
        };
        if let Poll::Ready(None) = r {
            // Finished: the machine is done with this request.
            this.guard = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            RespInner::Full(b) => b.is_none(),
            RespInner::Upstream(s) => s.is_end_stream(),
            RespInner::Fast(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            RespInner::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespInner::Full(None) => SizeHint::with_exact(0),
            RespInner::Upstream(s) => s.size_hint(),
            RespInner::Fast(s) => s.size_hint(),
        }
    }
}

/// A response made by the proxy itself.
pub(crate) fn reply(status: StatusCode, text: impl Into<String>) -> Response<RespBody> {
    let mut text = text.into();
    text.push('\n');
    let mut r = Response::new(RespBody::full(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A hop's answer when the request was not delivered: busy, or failed (retry elsewhere).
pub(crate) fn retry_reply(failed: bool, text: String) -> Response<RespBody> {
    let mut r = reply(StatusCode::SERVICE_UNAVAILABLE, text);
    r.headers_mut().insert(
        crate::wire::HOP_RETRY,
        HeaderValue::from_static(if failed { "failed" } else { "busy" }),
    );
    r
}
