//! Connecting upstream: to a machine of this host over TCP, or to another host's proxy over
//! mTLS, used when this host and the machine's host both have a certificate of the cluster
//! CA ([`bazaar_node::HostLink`]).
//!
//! - The owner side's listener is an ingress (`ingress/hop.rs`); the acceptor's config is
//!   here ([`HopTls`]). The cluster secret no longer authorizes anything: a hop with the
//!   secret on the plain proxy port is refused (403).
//! - The entry side: the connection to the owner checks that the server's certificate
//!   names the machine's host ([`Upstream::tls`]), presents this host's certificate, and is
//!   kept in the same per-thread pools as connections to machines ([`crate::h1`],
//!   [`crate::pool`]); one client config per proxy keeps TLS sessions for resumption.
//! - [`Stream`]: a connection upstream, plain TCP or TLS, for both clients and TCP hops.

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Longest a TLS handshake may take, either side.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a request could not be exchanged with a machine.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The request was not delivered (no connection, or the connection closed before the
    /// request was written): any request may go elsewhere.
    Connect(String),
    /// The exchange failed after the request was (possibly) delivered.
    Request(String),
}

impl SendError {
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "connecting: {e}"),
            SendError::Request(e) => write!(f, "{e}"),
        }
    }
}

/// This host's TLS for hops: the client to other hosts' hop listeners and the server of its
/// own. Both present the host's current certificate (renewals included).
pub(crate) struct HopTls {
    pub connector: TlsConnector,
    pub acceptor: TlsAcceptor,
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
    let tcp = connect_tcp(up.addr).await?;
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

/// A new TCP connection to `addr` (no Nagle delay), within [`CONNECT_TIMEOUT`].
pub(crate) async fn connect_tcp(addr: SocketAddr) -> Result<tokio::net::TcpStream, SendError> {
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(err)) => return Err(SendError::Connect(err.to_string())),
            Err(_) => {
                return Err(SendError::Connect(format!(
                    "timed out after {CONNECT_TIMEOUT:?}"
                )))
            }
        };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
