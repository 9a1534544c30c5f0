//! The hop between proxies over mTLS, used when this host and the machine's host both have
//! a certificate of the cluster CA ([`bazaar_node::HostLink`]).
//!
//! - The owner side: a hop listener of the proxy's own (`--proxy-hop-listen`, published
//!   as the host label `proxy_hop_addr`), one SO_REUSEPORT socket per proxy thread. Its
//!   handshake refuses a client without a certificate the CA signed; every request on an
//!   accepted connection is a hop ([`crate::http::serve_hop`]). The cluster secret no longer
//!   authorizes anything: a hop with the secret on the plain proxy port is refused (403).
//! - The entry side: the connection to the owner checks that the server's certificate
//!   names the machine's host ([`Upstream::tls`]), presents this host's certificate, and is
//!   kept in the same per-thread pools as connections to machines ([`crate::h1`],
//!   [`crate::pool`]); one client config per proxy keeps TLS sessions for resumption.
//! - [`Stream`]: a connection upstream, plain TCP or TLS, for both clients and TCP hops.

use crate::pool::SendError;
use crate::Local;
use bytes::BytesMut;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

/// Longest a TLS handshake may take, either side.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// This host's TLS for hops: the client to other hosts' hop listeners and the server of its
/// own. Both present the host's current certificate (renewals included).
pub(crate) struct HopTls {
    pub connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl HopTls {
    pub(crate) fn new(
        identity: &bazaar_pki::IdentityHandle,
        ca_pem: &str,
    ) -> anyhow::Result<HopTls> {
        Ok(HopTls {
            connector: TlsConnector::from(bazaar_pki::client_config(identity, ca_pem)?),
            acceptor: TlsAcceptor::from(bazaar_pki::peer_server_config(identity, ca_pem)?),
        })
    }
}

/// Where one attempt goes: a machine of this host (`tls` `None`), or another host's hop
/// listener with the name its certificate must carry.
#[derive(Clone, Copy)]
pub(crate) struct Upstream<'a> {
    pub addr: SocketAddr,
    pub tls: Option<(&'a TlsConnector, &'a ServerName<'static>)>,
}

impl Upstream<'_> {
    pub(crate) fn plain(addr: SocketAddr) -> Upstream<'static> {
        Upstream { addr, tls: None }
    }
}

/// A connection upstream.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Opens a connection to `up`: TCP within the connect timeout, then the TLS handshake
/// (the owner's certificate checked) when it is a hop over mTLS.
pub(crate) async fn connect(up: Upstream<'_>) -> Result<Stream, SendError> {
    let tcp = crate::pool::connect_tcp(up.addr).await?;
    let Some((connector, name)) = up.tls else {
        return Ok(Stream::Plain(tcp));
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name.clone(), tcp)).await {
        Ok(Ok(tls)) => Ok(Stream::Tls(Box::new(tls))),
        Ok(Err(err)) => Err(SendError::Connect(format!("TLS handshake: {err}"))),
        Err(_) => Err(SendError::Connect(format!(
            "TLS handshake timed out after {HANDSHAKE_TIMEOUT:?}"
        ))),
    }
}

impl Stream {
    /// Whether an idle connection is still open: the peer has neither closed it nor sent
    /// anything unasked. TLS records the peer may send on its own (session tickets) are
    /// taken in by rustls and do not count.
    pub(crate) fn still_open(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self {
            Stream::Plain(s) => {
                if s.poll_read_ready(&mut cx).is_pending() {
                    return true;
                }
                matches!(s.try_read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Stream::Tls(s) => {
                if s.get_ref().0.poll_read_ready(&mut cx).is_pending() {
                    return true;
                }
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                matches!(Pin::new(s).poll_read(&mut cx, &mut buf), Poll::Pending)
            }
        }
    }

    /// Reads what is available into `buf`: the number of bytes (0 at the end).
    pub(crate) fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        match self {
            Stream::Plain(s) => loop {
                match s.try_read_buf(buf) {
                    Ok(n) => return Poll::Ready(Ok(n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        ready!(s.poll_read_ready(cx))?;
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            },
            Stream::Tls(s) => tokio_util::io::poll_read_buf(Pin::new(s), cx, buf),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Serves the hop listener `listener` on this proxy thread until `shutdown`.
pub(crate) fn spawn_listener(
    local: Arc<Local>,
    listener: std::net::TcpListener,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(err) => {
                tracing::error!(error = %err, "proxy hop listener");
                return;
            }
        };
        loop {
            let (stream, peer) = tokio::select! {
                () = shutdown.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(err) => {
                        tracing::warn!(error = %err, "proxy hop accept");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve_connection(local.clone(), stream, peer));
        }
    });
}

/// One connection from another host's proxy: the handshake (a certificate the CA signed,
/// naming a host), then its hops, served by hyper (HTTP/1.1, upgrades for TCP hops).
async fn serve_connection(local: Arc<Local>, stream: TcpStream, peer: SocketAddr) {
    let Some(acceptor) = local.hop_tls.as_ref().map(|t| t.acceptor.clone()) else {
        return;
    };
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, %peer, "proxy hop handshake refused");
            return;
        }
        Err(_) => return,
    };
    // The handshake verified the chain against the CA; the certificate must also name a
    // host, and not one the CA revoked (`bazaar cluster revoke`).
    let Some(peer_host) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(bazaar_pki::peer_host_id)
    else {
        tracing::debug!(%peer, "proxy hop from a certificate that names no host");
        return;
    };
    if local.0.catalog.is_revoked(&peer_host) {
        tracing::debug!(%peer, peer.host = %peer_host, "proxy hop from a revoked host");
        return;
    }
    let host = peer_host.clone();
    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let local = local.clone();
        // A connection kept open outlives a revocation: each hop asks again.
        let revoked = local.0.catalog.is_revoked(&host);
        async move {
            if revoked {
                return Ok::<_, std::convert::Infallible>(crate::http::reply(
                    http::StatusCode::FORBIDDEN,
                    "bazaar proxy: hop from a revoked host",
                ));
            }
            let (parts, body) = req.into_parts();
            Ok::<_, std::convert::Infallible>(
                crate::http::serve_hop(local, parts, crate::request::ClientBody::Hyper(body)).await,
            )
        }
    });
    if let Err(err) = hyper::server::conn::http1::Builder::new()
        .timer(crate::timer::CoarseTimer)
        .header_read_timeout(crate::http::HEADER_READ_TIMEOUT)
        .max_buf_size(crate::http::MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(tls), svc)
        .with_upgrades()
        .await
    {
        tracing::debug!(error = %err, %peer, peer.host = %peer_host, "proxy hop connection");
    }
}
