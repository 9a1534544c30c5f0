//! The DNS server shell: hickory's server on the sockets it is given, each question
//! answered from the current [`Zone`] (kept fresh from the catalog's change stream by
//! [`Dns::start`]) or forwarded, unchanged, to the host's resolvers.

use crate::zone::{Answer, Kind, Zone};
use bazaar_catalog::{Catalog, Change, MachineFilter};
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Message, Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, TXT};
use hickory_server::proto::rr::{RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Time to live of every `.internal` answer: a change in the catalog shows within it.
pub const TTL: u32 = 5;
/// How long a forwarded question waits for the upstream resolver.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(3);
/// A TCP connection that sends nothing for this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// After a catalog change, further changes within this window are folded into one rebuild.
const REBUILD_DEBOUNCE: Duration = Duration::from_millis(20);

/// The zone shared by the server's handlers, replaced whole on rebuild.
#[derive(Clone, Debug, Default)]
pub struct SharedZone(Arc<RwLock<Arc<Zone>>>);

impl SharedZone {
    /// The current zone.
    pub fn get(&self) -> Arc<Zone> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the zone.
    pub fn set(&self, zone: Zone) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(zone);
    }
}

/// A running DNS server of one host.
#[derive(Debug, Clone)]
pub struct Dns {
    zone: SharedZone,
    upstreams: Arc<Vec<SocketAddr>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Dns {
    /// Starts keeping a zone of host `host_id` (in `region`) from `catalog`, forwarding
    /// other names to `upstreams`. Serves nothing until [`Dns::serve`]. Stops with
    /// `shutdown`; its tasks run on `tasks`, so draining that tracker waits for them.
    pub fn start(
        catalog: Catalog,
        host_id: String,
        region: String,
        upstreams: Vec<SocketAddr>,
        (tasks, shutdown): (TaskTracker, CancellationToken),
    ) -> Dns {
        let zone = SharedZone::default();
        let build = {
            let (catalog, zone) = (catalog.clone(), zone.clone());
            move || {
                // A machine of an app that lost its name is not the app's of that name.
                let losing = catalog.losing_app_ids();
                let mut machines = catalog.machines(&MachineFilter::default());
                machines.retain(|m| !losing.contains(&m.record.app_id));
                zone.set(Zone::build(&host_id, &region, &machines, &catalog.apps()));
            }
        };
        let mut changes = catalog.subscribe();
        build();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    change = changes.recv() => match change {
                        Ok(Change::Volume { .. }) => continue,
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
                tokio::time::sleep(REBUILD_DEBOUNCE).await;
                while let Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) =
                    changes.try_recv()
                {}
                build();
            }
        });
        Dns {
            zone,
            upstreams: Arc::new(upstreams),
            shutdown,
            tasks,
        }
    }

    /// The zone served now.
    pub fn zone(&self) -> Arc<Zone> {
        self.zone.get()
    }

    /// Serves DNS on UDP and TCP at `addr` (port 0: any free port), until shutdown; returns
    /// the address bound.
    pub async fn serve(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let udp = UdpSocket::bind(addr).await?;
        let bound = udp.local_addr()?;
        let tcp = TcpListener::bind(bound).await?;
        let mut server = hickory_server::Server::new(Handler {
            zone: self.zone.clone(),
            upstreams: self.upstreams.clone(),
        });
        server.register_socket(udp);
        server.register_listener(tcp, TCP_IDLE, 64 * 1024);
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {
                    let _ = server.shutdown_gracefully().await;
                }
                res = server.block_until_done() => {
                    if let Err(err) = res {
                        tracing::warn!(%bound, error = %err, "DNS server stopped");
                    }
                }
            }
        });
        tracing::info!(%bound, "internal DNS listening");
        Ok(bound)
    }
}

/// Answers one request.
#[derive(Debug)]
struct Handler {
    zone: SharedZone,
    upstreams: Arc<Vec<SocketAddr>>,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let builder = MessageResponseBuilder::from_message_request(request);
        let failed = || {
            let mut meta = Metadata::response_from_request(&request.metadata);
            meta.response_code = ResponseCode::ServFail;
            ResponseInfo::from(hickory_server::proto::op::Header {
                metadata: meta,
                counts: Default::default(),
            })
        };
        let Ok(info) = request.request_info() else {
            let msg = builder.error_msg(&request.metadata, ResponseCode::FormErr);
            return response
                .send_response(msg)
                .await
                .unwrap_or_else(|_| failed());
        };
        let query = info.query;
        let name = query.name().to_string();
        let kind = match query.query_type() {
            RecordType::A => Kind::A,
            RecordType::AAAA => Kind::Aaaa,
            RecordType::TXT => Kind::Txt,
            RecordType::ANY => Kind::Addresses,
            _ => Kind::Other,
        };
        let zone = self.zone.get();
        let answer = zone.resolve(&name, kind, &zone.viewer(info.src.ip()));
        drop(zone);
        let mut meta = Metadata::response_from_request(&request.metadata);
        meta.authoritative = true;
        meta.recursion_available = true;
        let owner = query.original().name().clone();
        let records: Vec<Record> = match answer {
            Answer::Forward => {
                return match forward(&self.upstreams, request.as_slice()).await {
                    Some(up) => {
                        let mut meta = up.metadata;
                        meta.id = request.metadata.id;
                        let msg = builder.build(
                            meta,
                            up.answers.iter(),
                            up.authorities.iter(),
                            [],
                            up.additionals.iter(),
                        );
                        response
                            .send_response(msg)
                            .await
                            .unwrap_or_else(|_| failed())
                    }
                    None => {
                        let msg = builder.error_msg(&request.metadata, ResponseCode::ServFail);
                        response
                            .send_response(msg)
                            .await
                            .unwrap_or_else(|_| failed())
                    }
                };
            }
            Answer::NxDomain => {
                meta.response_code = ResponseCode::NXDomain;
                Vec::new()
            }
            Answer::NoData => Vec::new(),
            Answer::Addresses(ips) => ips
                .into_iter()
                .map(|ip| {
                    let data = match ip {
                        IpAddr::V4(v4) => RData::A(A(v4)),
                        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
                    };
                    Record::from_rdata(owner.clone(), TTL, data)
                })
                .collect(),
            Answer::Txt(strings) => vec![Record::from_rdata(
                owner.clone(),
                TTL,
                RData::TXT(TXT::new(strings.iter().flat_map(|s| chunks(s)).collect())),
            )],
        };
        let msg = builder.build(meta, records.iter(), [], [], []);
        response
            .send_response(msg)
            .await
            .unwrap_or_else(|_| failed())
    }
}

/// `text` cut in the 255-byte character-strings a TXT record is made of (readers join
/// them again).
fn chunks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > 255 {
        let mut cut = 255;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(rest[..cut].to_string());
        rest = &rest[cut..];
    }
    out.push(rest.to_string());
    out
}

/// Sends the raw question to each upstream in turn over UDP and returns the first answer
/// with the question's id.
async fn forward(upstreams: &[SocketAddr], question: &[u8]) -> Option<Message> {
    let id = u16::from_be_bytes([*question.first()?, *question.get(1)?]);
    for upstream in upstreams {
        let local: SocketAddr = if upstream.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let Ok(socket) = UdpSocket::bind(local).await else {
            continue;
        };
        if socket.connect(upstream).await.is_err() || socket.send(question).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 4096];
        let wait = async {
            loop {
                let n = socket.recv(&mut buf).await.ok()?;
                match Message::from_vec(&buf[..n]) {
                    Ok(msg) if msg.metadata.id == id => return Some(msg),
                    _ => continue,
                }
            }
        };
        match tokio::time::timeout(FORWARD_TIMEOUT, wait).await {
            Ok(Some(msg)) => return Some(msg),
            _ => tracing::debug!(%upstream, "no answer from the upstream resolver"),
        }
    }
    None
}

/// The name servers of a `resolv.conf` (port 53), without `skip` (this server itself).
pub fn resolv_conf_nameservers(text: &str, skip: &[IpAddr]) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            let ip: IpAddr = words.next()?.split('%').next()?.parse().ok()?;
            (!skip.contains(&ip)).then_some(SocketAddr::new(ip, 53))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_txt_is_cut_in_character_strings() {
        let long = "é".repeat(200);
        let parts = chunks(&long);
        assert!(parts.iter().all(|p| p.len() <= 255), "{parts:?}");
        assert_eq!(parts.concat(), long);
        assert_eq!(chunks(""), vec![String::new()]);
    }

    #[test]
    fn nameservers_come_from_resolv_conf() {
        let text = "# comment\nsearch example.com\nnameserver 10.1.2.3\nnameserver fe80::1%eth0\n\
                    nameserver 10.213.0.1\nnameserver\noptions ndots:2\n";
        let skip = ["10.213.0.1".parse().unwrap()];
        assert_eq!(
            resolv_conf_nameservers(text, &skip),
            vec![
                "10.1.2.3:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }
}
