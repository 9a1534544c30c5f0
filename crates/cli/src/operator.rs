//! How the operator commands (`bazaar host`, `hosts`, `status`, `image`, `cluster revoke`,
//! `cluster gossip-key`) reach one agent's host interface and catalog view, so that the
//! cluster secret never crosses the network in clear (issue 31, item 8):
//!
//! - with `--host-data-dir DATA` (the operator on that host): over mTLS to its host
//!   listener, presenting the host's own certificate (`DATA/tls/host.pem`, trusted through
//!   `DATA/tls/ca.crt`, the listener's address from `DATA/host.addr`); no secret is sent;
//! - else with the cluster secret as a bearer token: over HTTPS (an agent with `--api-tls`;
//!   `--ca-cert` / `BAZAAR_CA_CERT` trusts the cluster CA), or over plain HTTP to a loopback
//!   address only (`bazaar dev`, or an operator on the host). Plain HTTP to any other
//!   address is refused before anything is sent.

use anyhow::Context;
use bazaar_client::HostClient;
use bazaar_types::api::CatalogHost;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where an operator command finds its agent and its credential.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct OperatorConn {
    /// The agent's URL (https, or http on a loopback address).
    #[arg(
        long,
        env = "BAZAAR_API_URL",
        default_value = "http://127.0.0.1:4280",
        global = true
    )]
    pub(crate) api_url: String,
    /// The cluster secret (`bazaar dev` writes it to .bazaar-dev/dev.env; an agent keeps
    /// it in DATA_DIR/cluster-secret). Sent only over HTTPS or to a loopback address.
    #[arg(
        long,
        env = "BAZAAR_CLUSTER_SECRET",
        hide_env_values = true,
        global = true
    )]
    pub(crate) cluster_secret: Option<String>,
    /// The cluster CA certificate (PEM) to trust for an agent served over HTTPS
    /// (`bazaar agent --api-tls`).
    #[arg(long, env = "BAZAAR_CA_CERT", global = true)]
    pub(crate) ca_cert: Option<PathBuf>,
    /// The data dir of the agent on this machine: call its host listener over mTLS with
    /// its own certificate instead of sending the cluster secret (needs read access to
    /// DATA/tls, as root).
    #[arg(long, env = "BAZAAR_HOST_DATA_DIR", global = true)]
    pub(crate) host_data_dir: Option<PathBuf>,
}

impl OperatorConn {
    /// The client of the agent's host interface.
    pub(crate) fn client(&self) -> anyhow::Result<HostClient> {
        match &self.host_data_dir {
            Some(dir) => {
                let own = OwnHost::load(dir)?;
                own.client(&own.host_id, own.addr)
            }
            None => with_secret(&self.api_url, &self.secret()?, self.ca_cert.as_deref()),
        }
    }

    /// The client of another host the catalog lists, the same way: over its host listener
    /// (the `host_addr` label) with this host's certificate, or with the cluster secret
    /// over the scheme of `--api-url` (plain HTTP only to a loopback address).
    pub(crate) fn peer(&self, host: &CatalogHost) -> anyhow::Result<HostClient> {
        match &self.host_data_dir {
            Some(dir) => {
                let addr: SocketAddr = host
                    .labels
                    .get(bazaar_node::host_link::HOST_ADDR_LABEL)
                    .context("it has no host listener")?
                    .parse()
                    .context("its host listener's address does not parse")?;
                OwnHost::load(dir)?.client(&host.id, addr)
            }
            None => {
                let scheme = self.api_url.split("://").next().unwrap_or("http");
                with_secret(
                    &format!("{scheme}://{}", host.api_addr),
                    &self.secret()?,
                    self.ca_cert.as_deref(),
                )
            }
        }
    }

    fn secret(&self) -> anyhow::Result<String> {
        crate::host_cmd::require_secret(self.cluster_secret.clone())
    }
}

/// A client that sends `secret` to `api_url`: over HTTPS, or plain HTTP to loopback only.
pub(crate) fn with_secret(
    api_url: &str,
    secret: &str,
    ca_cert: Option<&Path>,
) -> anyhow::Result<HostClient> {
    check_transport(api_url)?;
    let mut builder = reqwest::Client::builder();
    if let Some(path) = ca_cert {
        let pem = std::fs::read(path)
            .with_context(|| format!("reading the CA certificate {}", path.display()))?;
        builder = builder.tls_certs_merge(
            reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{}: not a PEM certificate", path.display()))?,
        );
    }
    Ok(HostClient::with_http(api_url, secret, builder.build()?))
}

/// Refuses a URL over which the cluster secret would travel in clear to another machine.
pub(crate) fn check_transport(api_url: &str) -> anyhow::Result<()> {
    let url = reqwest::Url::parse(api_url).with_context(|| format!("not a URL: {api_url}"))?;
    let host = url.host_str().unwrap_or_default();
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        "http" => anyhow::bail!(
            "refusing to send the cluster secret over plain HTTP to {api_url}: use https (an \
             agent started with --api-tls; --ca-cert or BAZAAR_CA_CERT trusts the cluster CA), \
             or run the command on that host with --host-data-dir DATA (its certificate, over \
             the host listener) or against http://127.0.0.1"
        ),
        other => anyhow::bail!("{api_url}: unsupported scheme {other} (http or https)"),
    }
}

/// The host of this machine, as its data dir tells: its certificate (the TLS config that
/// presents it) and its host listener.
struct OwnHost {
    host_id: String,
    addr: SocketAddr,
    identity: bazaar_pki::IdentityHandle,
    ca_pem: String,
}

impl OwnHost {
    fn load(data_dir: &Path) -> anyhow::Result<OwnHost> {
        let tls = data_dir.join("tls");
        let host_file = tls.join(bazaar_pki::HOST_FILE);
        let pem = std::fs::read_to_string(&host_file).with_context(|| {
            format!(
                "reading {}: the agent has no cluster certificate (or run as root)",
                host_file.display()
            )
        })?;
        let host_id = bazaar_pki::host_id_of_pem(&pem)
            .with_context(|| format!("{}: no host certificate", host_file.display()))?;
        let identity = bazaar_pki::HostIdentity::load(&tls, &host_id)?
            .with_context(|| format!("no certificate in {}", tls.display()))?;
        let addr_file = data_dir.join("host.addr");
        let addr: SocketAddr = std::fs::read_to_string(&addr_file)
            .with_context(|| {
                format!(
                    "reading {}: is the agent running with a host listener?",
                    addr_file.display()
                )
            })?
            .trim()
            .parse()
            .with_context(|| format!("{}: not an address", addr_file.display()))?;
        // A listener bound to every address is reached on loopback.
        let addr = if addr.ip().is_unspecified() {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        } else {
            addr
        };
        Ok(OwnHost {
            host_id,
            addr,
            identity: bazaar_pki::IdentityHandle::new(&identity)?,
            ca_pem: identity.ca_pem().to_string(),
        })
    }

    /// A client of host `host_id`'s host listener at `addr`, presenting this host's
    /// certificate; the server must prove it is `host_id`. No bearer token: the
    /// certificate is the credential.
    fn client(&self, host_id: &str, addr: SocketAddr) -> anyhow::Result<HostClient> {
        let name = bazaar_pki::host_dns_name(host_id);
        let config = bazaar_pki::client_config(&self.identity, &self.ca_pem)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*config).clone())
            .resolve(&name, addr)
            .build()?;
        Ok(HostClient::with_http(
            &format!("https://{name}:{}", addr.port()),
            "",
            http,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::check_transport;

    #[test]
    fn the_secret_goes_over_https_or_to_loopback_only() {
        for ok in [
            "http://127.0.0.1:4280",
            "http://127.9.9.9:1",
            "http://localhost:4280",
            "http://[::1]:4280",
            "https://10.0.0.5:4280",
            "https://example.com",
        ] {
            assert!(check_transport(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://10.250.0.2:4280",
            "http://example.com:4280",
            "http://[fd00::1]:4280",
            "ftp://127.0.0.1",
            "127.0.0.1:4280",
        ] {
            assert!(check_transport(refused).is_err(), "{refused}");
        }
    }
}
