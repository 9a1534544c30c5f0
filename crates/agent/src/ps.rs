//! `ps`: the processes of a started machine — its workload (for an image machine, the
//! container's init) and every descendant — read from `/proc` on this host: the pid in the
//! machine's pid namespace, start and CPU time, command line, working directory, resident
//! memory and the sockets each listens on (from the machine's network namespace).

use crate::agent::Agent;
use crate::error::AgentError;
use bazaar_types::host::{ListenSocket, ProcessStat};
use bazaar_types::state::MachineState;
use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

/// What `ps` sorts by (`sort_by`), and the direction (`order`: `asc`, the default, or
/// `desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sort {
    key: SortKey,
    descending: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SortKey {
    Pid,
    Stime,
    Rtime,
    Cpu,
    Rss,
    Command,
}

impl Sort {
    /// Parses the query parameters; unknown values are refused, naming the choices.
    pub fn parse(sort_by: Option<&str>, order: Option<&str>) -> Result<Sort, AgentError> {
        let key = match sort_by.unwrap_or("pid") {
            "pid" => SortKey::Pid,
            "stime" => SortKey::Stime,
            "rtime" => SortKey::Rtime,
            "cpu" => SortKey::Cpu,
            "rss" => SortKey::Rss,
            "command" => SortKey::Command,
            other => {
                return Err(AgentError::Invalid(format!(
                    "sort_by {other:?}: sort by pid, stime, rtime, cpu, rss or command"
                )))
            }
        };
        let descending = match order.unwrap_or("asc") {
            "asc" => false,
            "desc" => true,
            other => return Err(AgentError::Invalid(format!("order {other:?}: asc or desc"))),
        };
        Ok(Sort { key, descending })
    }

    fn apply(self, list: &mut [ProcessStat]) {
        list.sort_by(|a, b| {
            let o = match self.key {
                SortKey::Pid => a.pid.cmp(&b.pid),
                SortKey::Stime => a.stime.cmp(&b.stime),
                SortKey::Rtime => a.rtime.cmp(&b.rtime),
                SortKey::Cpu => a.cpu.cmp(&b.cpu),
                SortKey::Rss => a.rss.cmp(&b.rss),
                SortKey::Command => a.command.cmp(&b.command),
            }
            .then(a.pid.cmp(&b.pid));
            if self.descending {
                o.reverse()
            } else {
                o
            }
        });
    }
}

/// The processes of a started machine.
pub async fn ps(agent: &Agent, id: &str, sort: Sort) -> Result<Vec<ProcessStat>, AgentError> {
    let rec = agent.load_live(id)?;
    let state = agent.current_state(&rec);
    let run = rec
        .run
        .filter(|r| r.run_id > rec.exit_handled_run && r.workload_pid > 0)
        .filter(|_| state == MachineState::Started)
        .ok_or_else(|| {
            AgentError::Conflict(format!(
                "machine {id} is {state}: only a started machine has processes"
            ))
        })?;
    let root = if rec.config.runs_image() {
        // The shim's workload is `runc run`; the machine is the container.
        let pid_file = crate::oci::pid_file(&agent.driver().run_dir(id, run.run_id));
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .ok_or_else(|| {
                AgentError::Conflict(format!("machine {id}'s container is not running"))
            })?
    } else {
        run.workload_pid
    };
    let mut list = tokio::task::spawn_blocking(move || processes(root)).await?;
    sort.apply(&mut list);
    Ok(list)
}

/// `root` and its descendants, as they are now (a process that exits meanwhile is left out).
fn processes(root: i32) -> Vec<ProcessStat> {
    let clock = Clock::read();
    let sockets = listening_sockets(root);
    let mut out = Vec::new();
    for pid in tree(root) {
        if let Some(p) = process(pid, &clock, &sockets) {
            out.push(p);
        }
    }
    out
}

/// What turns `/proc` ticks and pages into times and bytes.
struct Clock {
    ticks_per_s: u64,
    page_bytes: u64,
    boot_s: u64,
    uptime_s: f64,
}

impl Clock {
    fn read() -> Clock {
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let boot_s = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        let uptime_s = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Clock {
            ticks_per_s: u64::try_from(ticks).unwrap_or(100).max(1),
            page_bytes: u64::try_from(page).unwrap_or(4096),
            boot_s,
            uptime_s,
        }
    }
}

/// The fields of `/proc/<pid>/stat` after the command name: index 0 is field 3 (state).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// `root` and every process below it, parents first.
fn tree(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = stat_fields(pid).and_then(|f| f.get(1)?.parse::<i32>().ok()) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            out.extend(kids.iter().copied());
        }
        i += 1;
    }
    out
}

fn process(pid: i32, clock: &Clock, sockets: &HashMap<u64, ListenSocket>) -> Option<ProcessStat> {
    let f = stat_fields(pid)?;
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let cpu_ticks = num(11) + num(12);
    let start_ticks = num(19);
    let rtime = cpu_ticks * 1000 / clock.ticks_per_s;
    let age_s = clock.uptime_s - start_ticks as f64 / clock.ticks_per_s as f64;
    let cpu = if age_s > 0.0 {
        (cpu_ticks as f64 / clock.ticks_per_s as f64 / age_s * 100.0).round() as u64
    } else {
        0
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let ns_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
        .unwrap_or(pid);
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let directory = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let inodes = socket_inodes(pid);
    let mut listen_sockets: Vec<ListenSocket> = inodes
        .iter()
        .filter_map(|i| sockets.get(i).cloned())
        .collect();
    listen_sockets.sort_by(|a, b| (&a.proto, &a.address).cmp(&(&b.proto, &b.address)));
    listen_sockets.dedup();
    Some(ProcessStat {
        pid: ns_pid,
        stime: clock.boot_s + start_ticks / clock.ticks_per_s,
        rtime,
        command,
        directory,
        cpu,
        rss: num(21) * clock.page_bytes,
        listen_sockets,
    })
}

/// The inodes of the sockets a process has open.
fn socket_inodes(pid: i32) -> HashSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Listening TCP and bound UDP sockets of `pid`'s network namespace, by inode.
fn listening_sockets(pid: i32) -> HashMap<u64, ListenSocket> {
    let mut out = HashMap::new();
    for (table, proto, wanted_state) in [
        ("tcp", "tcp", "0A"),
        ("tcp6", "tcp", "0A"),
        ("udp", "udp", "07"),
        ("udp6", "udp", "07"),
    ] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != wanted_state {
                continue;
            }
            let (Some(address), Ok(inode)) = (parse_address(f[1]), f[9].parse::<u64>()) else {
                continue;
            };
            out.insert(
                inode,
                ListenSocket {
                    proto: proto.into(),
                    address,
                },
            );
        }
    }
    out
}

/// `0100007F:1F90` → `127.0.0.1:8080`; 32 hex digits → `[v6]:port`. The kernel prints each
/// 32-bit word of the address in host byte order.
fn parse_address(hex: &str) -> Option<String> {
    let (ip, port) = hex.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    match ip.len() {
        8 => Some(format!("{}:{port}", Ipv4Addr::from(word(0)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(format!("[{}]:{port}", Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_socket_addresses() {
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_address("0100007F:1F90").as_deref(),
                Some("127.0.0.1:8080")
            );
            assert_eq!(
                parse_address("00000000000000000000000001000000:0050").as_deref(),
                Some("[::1]:80")
            );
        }
        assert_eq!(parse_address("zz:1"), None);
    }

    #[test]
    fn this_process_is_seen_with_its_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        let list = processes(me);
        let p = list.iter().find(|p| p.pid == me).expect("this process");
        assert!(p.rss > 0 && p.stime > 0, "{p:?}");
        assert!(
            p.listen_sockets
                .iter()
                .any(|s| s.proto == "tcp" && s.address == format!("127.0.0.1:{port}")),
            "{p:?}"
        );
        assert_eq!(
            p.directory,
            std::env::current_dir().unwrap().display().to_string()
        );
    }

    #[test]
    fn sort_choices() {
        assert!(Sort::parse(Some("rss"), Some("desc")).is_ok());
        assert!(Sort::parse(Some("memory"), None).is_err());
        assert!(Sort::parse(None, Some("up")).is_err());
    }
}
