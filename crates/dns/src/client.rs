//! A small DNS client over UDP (one question, one answer), for tests, benchmarks and
//! whoever wants to ask a host's internal DNS without a system resolver.

use hickory_server::proto::op::{Message, MessageType, OpCode, Query};
use hickory_server::proto::rr::{Name, RData, RecordType};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;

/// What a server answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The response code as DNS spells it (`NoError`, `NXDomain`, `ServFail`, ...).
    pub code: String,
    /// The A and AAAA answers, in order.
    pub addresses: Vec<IpAddr>,
    /// The TXT answers, each record's strings joined.
    pub txt: Vec<String>,
    /// The smallest TTL of the answers.
    pub min_ttl: Option<u32>,
}

/// The wire form of a question for `name` of type `rtype` with id `id`.
pub fn question(id: u16, name: &str, rtype: RecordType) -> std::io::Result<Vec<u8>> {
    let name = Name::from_ascii(name).map_err(std::io::Error::other)?;
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name, rtype));
    msg.to_vec().map_err(std::io::Error::other)
}

/// Reads an answer from its wire form; the message id with it.
pub fn reply(bytes: &[u8]) -> std::io::Result<(u16, Reply)> {
    let msg = Message::from_vec(bytes).map_err(std::io::Error::other)?;
    let mut out = Reply {
        code: format!("{:?}", msg.metadata.response_code),
        addresses: Vec::new(),
        txt: Vec::new(),
        min_ttl: msg.answers.iter().map(|r| r.ttl).min(),
    };
    for record in &msg.answers {
        match &record.data {
            RData::A(a) => out.addresses.push(IpAddr::V4(a.0)),
            RData::AAAA(a) => out.addresses.push(IpAddr::V6(a.0)),
            RData::TXT(t) => out.txt.push(t.to_string()),
            _ => {}
        }
    }
    Ok((msg.metadata.id, out))
}

/// Asks `server` once about `name` (waiting at most `timeout`).
pub async fn ask(
    server: SocketAddr,
    name: &str,
    rtype: RecordType,
    timeout: Duration,
) -> std::io::Result<Reply> {
    let local: SocketAddr = if server.is_ipv4() {
        ([127, 0, 0, 1], 0).into()
    } else {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    let id = rand_id();
    socket.send(&question(id, name, rtype)?).await?;
    let mut buf = vec![0u8; 4096];
    tokio::time::timeout(timeout, async {
        loop {
            let n = socket.recv(&mut buf).await?;
            let (got, answer) = reply(&buf[..n])?;
            if got == id {
                return Ok(answer);
            }
        }
    })
    .await
    .map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{server}: no answer"))
    })?
}

/// A message id that differs between calls.
fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (nanos as u16) ^ NEXT.fetch_add(0x9e37, Ordering::Relaxed)
}
