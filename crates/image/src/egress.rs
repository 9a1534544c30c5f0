//! Where a pull may connect. An image reference is the caller's to choose, and the agent
//! pulls as root from inside the host's network: a registry (its token realm, the places
//! its redirects lead) is reached only on public addresses, unless the operator allowed it
//! by name (`insecure_registries`: any address, plain HTTP) or allowed loopback registries
//! (`allow_loopback`: `bazaar dev` and the test kit). Names are checked as they resolve,
//! and the connection goes to the very addresses checked (a name cannot resolve public
//! for the check and private for the connection); literal addresses are checked before
//! the request.

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Which registries may be reached on which addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Registries (`host[:port]`) the operator allowed on any address.
    pub allowed: Vec<String>,
    /// Registries on loopback addresses may be reached (development, tests).
    pub allow_loopback: bool,
}

impl EgressPolicy {
    /// Whether `host` (a name or address, without port) may be reached at `addr`.
    pub fn allows(&self, host: &str, addr: IpAddr) -> bool {
        is_public(addr)
            || (self.allow_loopback && addr.is_loopback())
            || self
                .allowed
                .iter()
                .any(|a| host_of(a).eq_ignore_ascii_case(host))
    }

    /// `Ok` when `url`'s host is a name (checked when it resolves) or an address `host`
    /// may be reached at; else why not.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let host = url.host_str().ok_or_else(|| format!("{url}: no host"))?;
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        match literal.parse::<IpAddr>() {
            Ok(addr) if !self.allows(host, addr) => Err(refusal(host)),
            _ => Ok(()),
        }
    }
}

/// Why `host` is not reached.
fn refusal(host: &str) -> String {
    format!(
        "{host} is a loopback, private or link-local address: registries there are pulled \
         from only when the operator allows them (--insecure-registry {host})"
    )
}

/// The host of `host[:port]` (`[v6]:port` too), as a URL writes it.
fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return registry.split_inclusive(']').next().unwrap_or(registry);
    }
    registry.split(':').next().unwrap_or(registry)
}

/// Whether `addr` is on the public internet: not loopback, private (RFC 1918, unique
/// local), link-local (cloud metadata services live there), shared (CGNAT), unspecified,
/// multicast, broadcast, documentation or benchmarking space.
pub fn is_public(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(ip) => public_v4(ip),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => public_v4(v4),
            None => public_v6(ip),
        },
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || first == 0x2001 && ip.segments()[1] == 0x0db8
        // NAT64 and 6to4 embed IPv4 addresses that are not checked here.
        || first == 0x0064
        || first == 0x2002)
}

/// The resolver of a pull's HTTP client: the system's, keeping only the addresses the
/// policy allows for the name.
#[derive(Debug)]
pub(crate) struct GuardedResolver(pub Arc<EgressPolicy>);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| policy.allows(&host, a.ip()))
                .collect();
            if allowed.is_empty() && !found.is_empty() {
                return Err(refusal(&host).into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Redirects are followed (at most 10) only to places the policy allows.
pub(crate) fn redirect_policy(policy: Arc<EgressPolicy>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            return attempt.error("too many redirects");
        }
        match policy.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(why) => attempt.error(why),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_by_default() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = private.parse().unwrap();
            assert!(!is_public(ip), "{private}");
            assert!(!EgressPolicy::default().allows("registry.example", ip));
        }
        for public in ["1.1.1.1", "8.8.8.8", "2606:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn the_operator_allows_loopback_or_named_registries() {
        let loopback = EgressPolicy {
            allowed: Vec::new(),
            allow_loopback: true,
        };
        assert!(loopback.allows("localhost", "127.0.0.1".parse().unwrap()));
        assert!(!loopback.allows("localhost", "10.0.0.1".parse().unwrap()));
        let named = EgressPolicy {
            allowed: vec!["registry.lan:5000".into(), "[fd00::5]:5000".into()],
            allow_loopback: false,
        };
        assert!(named.allows("registry.lan", "10.0.0.1".parse().unwrap()));
        assert!(named.allows("[fd00::5]", "fd00::5".parse().unwrap()));
        assert!(!named.allows("other.lan", "10.0.0.1".parse().unwrap()));
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(named.check_url(&url("http://10.9.9.9/v2/")).is_err());
        assert!(named.check_url(&url("http://[fd00::5]:5000/v2/")).is_ok());
        assert!(
            named.check_url(&url("https://other.lan/v2/")).is_ok(),
            "names resolve later"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_unless_allowed() {
        let refused = GuardedResolver(Arc::new(EgressPolicy::default()))
            .resolve("localhost".parse().unwrap())
            .await;
        let err = refused.err().expect("refused").to_string();
        assert!(err.contains("--insecure-registry localhost"), "{err}");
        let allowed = GuardedResolver(Arc::new(EgressPolicy {
            allowed: Vec::new(),
            allow_loopback: true,
        }))
        .resolve("localhost".parse().unwrap())
        .await
        .expect("resolved");
        assert!(allowed.into_iter().all(|a| a.ip().is_loopback()));
    }
}
