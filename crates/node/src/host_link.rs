//! How this host reaches the others: [`HostLink`], an mTLS client that presents this host's
//! cluster certificate and resolves `<host id>.hosts.bazaar.internal` from the catalog (so
//! the server's certificate is checked against the host meant), and the host labels naming
//! a host's listeners between hosts.

use bazaar_pki::IdentityHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The host label under which a host publishes its host listener's address.
pub const HOST_ADDR_LABEL: &str = "host_addr";

/// The host label naming the proxy's hop listener (mTLS), when the host has a certificate.
pub const PROXY_HOP_ADDR_LABEL: &str = "proxy_hop_addr";

/// The verified host id of the peer of a request on the host listener.
#[derive(Debug, Clone)]
pub struct PeerHost(pub String);

/// This host's link to other hosts' host listeners.
#[derive(Clone)]
pub struct HostLink {
    /// This host's host listener.
    pub addr: SocketAddr,
    /// The client to other hosts (no bearer token: the certificate is the credential).
    pub client: reqwest::Client,
    /// This host's current key and certificate (renewals included), for the other links
    /// between hosts (the proxy's hops).
    pub identity: IdentityHandle,
    /// The cluster CA's certificate, PEM.
    pub ca_pem: String,
    catalog: bazaar_catalog::Catalog,
}

impl std::fmt::Debug for HostLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLink")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl HostLink {
    /// The link of the host serving its host listener at `addr` with `identity`, to the
    /// others `catalog` knows.
    pub fn new(
        addr: SocketAddr,
        identity: IdentityHandle,
        ca_pem: String,
        catalog: bazaar_catalog::Catalog,
    ) -> anyhow::Result<HostLink> {
        let config = bazaar_pki::client_config(&identity, &ca_pem)?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls((*config).clone())
            .dns_resolver(Arc::new(CatalogResolver(catalog.clone())))
            .pool_max_idle_per_host(32)
            // Host listeners close connections idle for their head timeout (10 s).
            .pool_idle_timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_millis(500))
            .build()?;
        Ok(HostLink {
            addr,
            client,
            identity,
            ca_pem,
            catalog,
        })
    }

    /// The URL of `path` on the host whose API address is `api_addr`, if that host serves a
    /// host listener.
    pub fn url_for(&self, api_addr: &str, path: &str) -> Option<String> {
        let host = self
            .catalog
            .hosts()
            .into_iter()
            .find(|h| h.record.api_addr == api_addr)?;
        let addr: SocketAddr = host.record.labels.get(HOST_ADDR_LABEL)?.parse().ok()?;
        Some(format!(
            "https://{}:{}{path}",
            bazaar_pki::host_dns_name(&host.record.id),
            addr.port()
        ))
    }
}

/// Resolves host names of host certificates to the host listeners the catalog knows.
struct CatalogResolver(bazaar_catalog::Catalog);

impl reqwest::dns::Resolve for CatalogResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addr = name
            .as_str()
            .strip_suffix(bazaar_pki::HOST_NAME_SUFFIX)
            .and_then(|id| id.strip_suffix('.'))
            .and_then(|id| self.0.host(id))
            .and_then(|h| {
                h.record
                    .labels
                    .get(HOST_ADDR_LABEL)?
                    .parse::<SocketAddr>()
                    .ok()
            });
        let name = name.as_str().to_string();
        Box::pin(async move {
            match addr {
                Some(addr) => Ok(Box::new(std::iter::once(addr)) as reqwest::dns::Addrs),
                None => Err(format!("no host listener known for {name}").into()),
            }
        })
    }
}
