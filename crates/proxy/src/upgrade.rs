//! Connection upgrades through the proxy: WebSockets and any other protocol a client asks
//! for with `Connection: upgrade` + `Upgrade: <protocol>` on HTTP/1.1. The request is routed
//! like any other (balancing, limits, the hop to the owner's proxy); when the machine answers
//! `101 Switching Protocols`, the two upgraded connections are spliced together and the
//! machine counts the connection as in flight until either side closes it.

use crate::body::Guard;
use http::header::{HeaderValue, CONNECTION, UPGRADE};
use http::{HeaderMap, Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// A client's pending upgrade: the protocol it asked for and its side of the connection.
#[derive(Debug)]
pub(crate) struct ClientUpgrade {
    protocol: HeaderValue,
    client: Option<OnUpgrade>,
}

impl ClientUpgrade {
    /// Takes the upgrade a request asks for, if it asks for one (HTTP/1.1 only; call before
    /// hop-by-hop headers are stripped).
    pub(crate) fn take(parts: &mut http::request::Parts) -> Option<ClientUpgrade> {
        if parts.version != Version::HTTP_11 || !asks_for_upgrade(&parts.headers) {
            return None;
        }
        let protocol = parts.headers.get(UPGRADE)?.clone();
        let client = parts.extensions.remove::<OnUpgrade>()?;
        Some(ClientUpgrade {
            protocol,
            client: Some(client),
        })
    }

    /// Puts the upgrade request back on a request to send upstream.
    pub(crate) fn mark(&self, headers: &mut HeaderMap) {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, self.protocol.clone());
    }

    /// The client's side of the connection, when the machine's `resp` switches protocols.
    pub(crate) fn switched<B>(&mut self, resp: &Response<B>) -> Option<OnUpgrade> {
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return None;
        }
        self.client.take()
    }

    /// Splices the client's connection to the machine's in the background, a task of the
    /// node's tracker (the machine keeps `guard` until the spliced connection closes), and
    /// returns the head to send to the client.
    pub(crate) fn splice<B>(
        &self,
        client: OnUpgrade,
        mut resp: Response<B>,
        guard: Guard,
    ) -> Response<()> {
        let upstream = hyper::upgrade::on(&mut resp);
        let (parts, _) = resp.into_parts();
        let tasks = guard.shared.node.tasks().clone();
        tasks.spawn(async move {
            let _in_flight = guard;
            match tokio::try_join!(client, upstream) {
                Ok((client, upstream)) => {
                    let mut client = TokioIo::new(client);
                    let mut upstream = TokioIo::new(upstream);
                    if let Err(err) =
                        tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                    {
                        tracing::debug!(error = %err, "upgraded connection ended");
                    }
                }
                Err(err) => tracing::debug!(error = %err, "connection upgrade failed"),
            }
        });
        let mut head = Response::from_parts(parts, ());
        head.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        head.headers_mut().insert(UPGRADE, self.protocol.clone());
        head
    }
}

/// Whether the `Connection` header lists `upgrade`.
fn asks_for_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_tokens_are_matched_as_a_list() {
        let mut h = HeaderMap::new();
        assert!(!asks_for_upgrade(&h));
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(asks_for_upgrade(&h));
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(!asks_for_upgrade(&h));
        h.insert(CONNECTION, HeaderValue::from_static("upgrader"));
        assert!(!asks_for_upgrade(&h));
    }
}
