//! The guest kernel's command line: the console, the root disk and bazaar's own `bazaar.*`
//! keys (address, gateway, DNS, exec port) that the guest init reads back with
//! [`GuestBoot::parse`]. The image's entrypoint, env and user do not travel here (quoting
//! and the kernel's 2 KiB limit); they go in a file on the root disk.

use std::fmt;
use std::net::Ipv4Addr;

/// The guest's network, as the runtime gave the machine's namespace: the guest takes the
/// machine's usual address behind the tap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestNet {
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub dns: Vec<Ipv4Addr>,
}

/// What the kernel command line carries for bazaar's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestBoot {
    /// The root disk's device (`/dev/vda`).
    pub root: String,
    pub net: Option<GuestNet>,
    /// The init's program path inside the guest.
    pub init: String,
    /// Under TCG the kernel cannot calibrate its clock (no PIT/HPET reference on
    /// `-machine microvm`, and it hangs there): the TSC's rate and the delay loop are given.
    pub tcg: bool,
}

/// What a TCG guest is told instead of calibrating (`tsc: Unable to calibrate against
/// PIT` hangs the boot otherwise); measured to boot in ~2 s (docs/benchmarks/microvm.md).
pub const TCG_CLOCK_ARGS: [&str; 2] = ["tsc_early_khz=2000000", "lpj=4000000"];

/// Why a `bazaar.*` key on the command line could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel command line: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

/// The init inside the guest (on the root disk).
pub const GUEST_INIT: &str = "/.bazaar/init";

impl GuestBoot {
    /// The whole kernel command line: the serial console (the machine's log), no reboot
    /// on panic (QEMU exits, the shim records it), the root disk, and the `bazaar.*` keys.
    pub fn to_cmdline(&self) -> String {
        let mut parts = vec![
            "console=ttyS0".to_string(),
            "reboot=t".to_string(),
            "panic=-1".to_string(),
            "quiet".to_string(),
            format!("root={}", self.root),
            "rw".to_string(),
            "rootfstype=ext4".to_string(),
            format!("init={}", self.init),
        ];
        if self.tcg {
            parts.extend(TCG_CLOCK_ARGS.iter().map(|a| a.to_string()));
        }
        if let Some(net) = &self.net {
            parts.push(format!("bazaar.ip={}/{}", net.address, net.prefix));
            parts.push(format!("bazaar.gw={}", net.gateway));
            if !net.dns.is_empty() {
                let dns: Vec<String> = net.dns.iter().map(|d| d.to_string()).collect();
                parts.push(format!("bazaar.dns={}", dns.join(",")));
            }
        }
        parts.join(" ")
    }

    /// Reads a command line back (the guest init reads `/proc/cmdline`). Unknown words are
    /// the kernel's own and are skipped; a malformed `bazaar.*` key is an error, so a bad
    /// network never comes up half-set.
    pub fn parse(cmdline: &str) -> Result<GuestBoot, ParseError> {
        let mut root = None;
        let mut init = None;
        let mut ip: Option<(Ipv4Addr, u8)> = None;
        let mut gw = None;
        let mut dns = Vec::new();
        let mut tcg = false;
        for word in cmdline.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            match key {
                "root" => root = Some(value.to_string()),
                "init" => init = Some(value.to_string()),
                "tsc_early_khz" => tcg = true,
                "bazaar.ip" => {
                    let (addr, prefix) = value
                        .split_once('/')
                        .ok_or_else(|| ParseError(format!("bazaar.ip={value}: no /prefix")))?;
                    let addr = addr
                        .parse()
                        .map_err(|_| ParseError(format!("bazaar.ip={value}: bad address")))?;
                    let prefix: u8 = prefix
                        .parse()
                        .ok()
                        .filter(|p| *p <= 32)
                        .ok_or_else(|| ParseError(format!("bazaar.ip={value}: bad prefix")))?;
                    ip = Some((addr, prefix));
                }
                "bazaar.gw" => {
                    gw = Some(
                        value
                            .parse()
                            .map_err(|_| ParseError(format!("bazaar.gw={value}: bad address")))?,
                    )
                }
                "bazaar.dns" => {
                    for d in value.split(',').filter(|d| !d.is_empty()) {
                        dns.push(
                            d.parse()
                                .map_err(|_| ParseError(format!("bazaar.dns: bad address {d}")))?,
                        );
                    }
                }
                k if k.starts_with("bazaar.") => {
                    return Err(ParseError(format!("unknown key {k}")));
                }
                _ => {}
            }
        }
        let net = match (ip, gw) {
            (Some((address, prefix)), Some(gateway)) => Some(GuestNet {
                address,
                prefix,
                gateway,
                dns,
            }),
            (None, None) if dns.is_empty() => None,
            _ => {
                return Err(ParseError(
                    "bazaar.ip, bazaar.gw come together (and bazaar.dns only with them)".into(),
                ))
            }
        };
        Ok(GuestBoot {
            root: root.unwrap_or_else(|| "/dev/vda".to_string()),
            net,
            init: init.unwrap_or_else(|| GUEST_INIT.to_string()),
            tcg,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot() -> GuestBoot {
        GuestBoot {
            root: "/dev/vda".into(),
            net: Some(GuestNet {
                address: Ipv4Addr::new(172, 19, 4, 2),
                prefix: 30,
                gateway: Ipv4Addr::new(172, 19, 4, 1),
                dns: vec![Ipv4Addr::new(172, 19, 4, 1), Ipv4Addr::new(9, 9, 9, 9)],
            }),
            init: GUEST_INIT.into(),
            tcg: true,
        }
    }

    #[test]
    fn the_command_line_reads_back_as_written() {
        let line = boot().to_cmdline();
        assert!(line.starts_with("console=ttyS0 "), "{line}");
        assert!(line.contains(
            " bazaar.ip=172.19.4.2/30 bazaar.gw=172.19.4.1 bazaar.dns=172.19.4.1,9.9.9.9"
        ));
        assert!(
            line.contains(" tsc_early_khz=2000000 lpj=4000000"),
            "{line}"
        );
        assert_eq!(GuestBoot::parse(&line).unwrap(), boot());
        let kvm = GuestBoot {
            tcg: false,
            ..boot()
        };
        assert!(!kvm.to_cmdline().contains("tsc_early_khz"));
        assert_eq!(GuestBoot::parse(&kvm.to_cmdline()).unwrap(), kvm);
    }

    #[test]
    fn the_kernel_s_own_words_are_skipped() {
        let line = format!(
            "BOOT_IMAGE=/vmlinuz nokaslr {} earlyprintk",
            boot().to_cmdline()
        );
        assert_eq!(GuestBoot::parse(&line).unwrap(), boot());
    }

    #[test]
    fn no_network_keys_means_no_network() {
        let b = GuestBoot::parse("console=ttyS0 root=/dev/vdb").unwrap();
        assert_eq!(b.net, None);
        assert_eq!(b.root, "/dev/vdb");
        assert_eq!(b.init, GUEST_INIT);
    }

    #[test]
    fn bad_network_keys_are_refused_not_half_applied() {
        for bad in [
            "bazaar.ip=10.0.0.2 bazaar.gw=10.0.0.1",
            "bazaar.ip=10.0.0.2/33 bazaar.gw=10.0.0.1",
            "bazaar.ip=10.0.0.x/24 bazaar.gw=10.0.0.1",
            "bazaar.ip=10.0.0.2/24",
            "bazaar.gw=10.0.0.1",
            "bazaar.dns=1.1.1.1",
            "bazaar.ip=10.0.0.2/24 bazaar.gw=10.0.0.1 bazaar.dns=1.1.1",
            "bazaar.nope=1",
        ] {
            assert!(GuestBoot::parse(bad).is_err(), "{bad} was taken");
        }
    }
}
