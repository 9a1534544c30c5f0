//! Resolves [`ShimSpec::user`](crate::ShimSpec::user) into numeric credentials by reading
//! `/etc/passwd` and `/etc/group` directly. NSS (`getpwnam`) is avoided on purpose: it may
//! load shared modules and open sockets, which a small forking supervisor should not do.

use std::fs;

/// The uid and gid of `nobody`, used when the spec names no user and the shim is root.
pub(crate) const NOBODY: u32 = 65534;

/// Numeric credentials for the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group included, as `initgroups` does).
    pub groups: Vec<u32>,
}

/// Resolves `user` for a shim running with effective ids `(euid, egid)`.
///
/// Returns `Ok(None)` when no switch is needed: not root, and the spec asks for the current
/// user or for none. A non-root shim cannot run anyone else.
pub(crate) fn resolve(
    user: Option<&str>,
    euid: u32,
    egid: u32,
) -> Result<Option<Credentials>, String> {
    let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
    let creds = match user {
        None if euid == 0 => Credentials {
            uid: NOBODY,
            gid: NOBODY,
            groups: vec![NOBODY],
        },
        None => return Ok(None),
        Some(user) => resolve_in(user, &read("/etc/passwd"), &read("/etc/group"))?,
    };
    if euid == 0 {
        Ok(Some(creds))
    } else if creds.uid == euid && creds.gid == egid {
        Ok(None)
    } else {
        Err(format!(
            "permission denied: cannot run as user {:?} without root",
            user.unwrap_or("nobody")
        ))
    }
}

/// Resolves `user` (`name`, `uid`, `name:group`, `uid:gid`...) against the given file contents.
///
/// A numeric uid without a passwd entry gets its own number as gid (never root's group).
fn resolve_in(user: &str, passwd: &str, group: &str) -> Result<Credentials, String> {
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let entry = if let Ok(uid) = user_part.parse::<u32>() {
        passwd_entries(passwd)
            .find(|e| e.uid == uid)
            .unwrap_or(PasswdEntry {
                name: "",
                uid,
                gid: uid,
            })
    } else {
        passwd_entries(passwd)
            .find(|e| e.name == user_part && !user_part.is_empty())
            .ok_or_else(|| format!("unknown user: {user_part}"))?
    };
    let gid = match group_part {
        None => entry.gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group_entries(group)
                .find(|e| e.name == g)
                .map(|e| e.gid)
                .ok_or_else(|| format!("unknown group: {g}"))?,
        },
    };
    let mut groups = vec![gid];
    if !entry.name.is_empty() {
        let member_of =
            group_entries(group).filter(|e| e.members.split(',').any(|m| m == entry.name));
        for g in member_of {
            if !groups.contains(&g.gid) {
                groups.push(g.gid);
            }
        }
    }
    Ok(Credentials {
        uid: entry.uid,
        gid,
        groups,
    })
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
}

fn passwd_entries(passwd: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    passwd.lines().filter_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some(PasswdEntry { name, uid, gid })
    })
}

struct GroupEntry<'a> {
    name: &'a str,
    gid: u32,
    members: &'a str,
}

fn group_entries(group: &str) -> impl Iterator<Item = GroupEntry<'_>> {
    group.lines().filter_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let gid = fields.next()?.parse().ok()?;
        let members = fields.next().unwrap_or("");
        Some(GroupEntry { name, gid, members })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                          nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
                          alice:x:1000:1000::/home/alice:/bin/sh\n\
                          # comment\n";
    const GROUP: &str = "root:x:0:\nalice:x:1000:\ndocker:x:999:bob,alice\nstaff:x:50:alice\n";

    fn creds(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn names_and_numbers_resolve() {
        assert_eq!(resolve_in("root", PASSWD, GROUP), Ok(creds(0, 0, &[0])));
        assert_eq!(
            resolve_in("alice", PASSWD, GROUP),
            Ok(creds(1000, 1000, &[1000, 999, 50]))
        );
        assert_eq!(
            resolve_in("1000", PASSWD, GROUP),
            Ok(creds(1000, 1000, &[1000, 999, 50]))
        );
        assert_eq!(
            resolve_in("4242", PASSWD, GROUP),
            Ok(creds(4242, 4242, &[4242]))
        );
        assert_eq!(
            resolve_in("4242:7", PASSWD, GROUP),
            Ok(creds(4242, 7, &[7]))
        );
        assert_eq!(
            resolve_in("alice:staff", PASSWD, GROUP),
            Ok(creds(1000, 50, &[50, 999]))
        );
    }

    #[test]
    fn unknown_names_are_errors() {
        assert_eq!(
            resolve_in("mallory", PASSWD, GROUP),
            Err("unknown user: mallory".into())
        );
        assert_eq!(
            resolve_in("alice:nogroup", PASSWD, GROUP),
            Err("unknown group: nogroup".into())
        );
        assert!(resolve_in("", PASSWD, GROUP).is_err());
    }

    #[test]
    fn non_root_can_only_be_itself() {
        assert_eq!(resolve(None, 1000, 1000), Ok(None));
        assert_eq!(resolve(Some("1000:1000"), 1000, 1000), Ok(None));
        assert!(resolve(Some("0"), 1000, 1000).is_err());
        assert_eq!(
            resolve(None, 0, 0),
            Ok(Some(creds(NOBODY, NOBODY, &[NOBODY])))
        );
    }
}
