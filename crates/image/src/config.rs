//! The image config (Entrypoint, Cmd, Env, WorkingDir, User) and how it merges with a
//! machine's `init` overrides and env into the process to run.

use crate::digest::Digest;
use bazaar_types::config::InitConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `PATH` when the image sets none (Docker's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The image config blob (the parts bazaar reads; the rest is kept in the blob).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ContainerConfig>,
    #[serde(default)]
    pub rootfs: RootFs,
}

/// The `config` section: how the image wants to be run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// The `rootfs` section: the digests of the uncompressed layers, bottom first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

/// What to run in a machine made from an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// argv; never empty.
    pub args: Vec<String>,
    /// `KEY=value`, image env overridden by the machine's.
    pub env: Vec<String>,
    /// Working directory inside the rootfs (`/` when the image gives none).
    pub cwd: String,
    /// User as the image or `init.user` says (`name`, `uid`, `uid:gid`); `None` is root.
    pub user: Option<String>,
}

impl ContainerConfig {
    /// Merges with Fly's `init` overrides and the machine's env. `init.exec` replaces the whole
    /// command; `init.entrypoint` replaces the image's Entrypoint and, as in Docker, drops its
    /// Cmd unless `init.cmd` is given; `init.cmd` replaces the Cmd. The machine's env wins
    /// over the image's; `PATH` defaults to [`DEFAULT_PATH`]. Returns `None` if nothing is
    /// left to run.
    pub fn process(
        &self,
        init: Option<&InitConfig>,
        machine_env: &BTreeMap<String, String>,
    ) -> Option<Process> {
        let empty = InitConfig::default();
        let init = init.unwrap_or(&empty);
        let image_entry = self.entrypoint.clone().unwrap_or_default();
        let image_cmd = self.cmd.clone().unwrap_or_default();
        let args = if !init.exec.is_empty() {
            init.exec.clone()
        } else {
            let (entry, cmd) = match (init.entrypoint.is_empty(), init.cmd.is_empty()) {
                (true, true) => (image_entry, image_cmd),
                (true, false) => (image_entry, init.cmd.clone()),
                (false, true) => (init.entrypoint.clone(), vec![]),
                (false, false) => (init.entrypoint.clone(), init.cmd.clone()),
            };
            entry.into_iter().chain(cmd).collect()
        };
        if args.is_empty() {
            return None;
        }
        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: &str| match env.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.to_string(),
            None => env.push((k.to_string(), v.to_string())),
        };
        set("PATH", DEFAULT_PATH);
        for kv in self.env.iter().flatten() {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            set(k, v);
        }
        for (k, v) in machine_env {
            set(k, v);
        }
        let cwd = match self.working_dir.as_deref() {
            Some(d) if !d.is_empty() => d.to_string(),
            _ => "/".into(),
        };
        let user = init
            .user
            .clone()
            .or_else(|| self.user.clone())
            .filter(|u| !u.is_empty());
        Some(Process {
            args,
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd,
            user,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    fn image() -> ContainerConfig {
        serde_json::from_str(
            r#"{"Entrypoint":["/bin/tini","--"],"Cmd":["serve","-p","80"],
                "Env":["PATH=/opt/bin:/bin","A=image","B=image"],"WorkingDir":"/app","User":"web"}"#,
        )
        .unwrap()
    }

    fn init(json: &str) -> InitConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn image_defaults() {
        let p = image().process(None, &BTreeMap::new()).unwrap();
        assert_eq!(p.args, v(&["/bin/tini", "--", "serve", "-p", "80"]));
        assert_eq!(p.env, v(&["PATH=/opt/bin:/bin", "A=image", "B=image"]));
        assert_eq!((p.cwd.as_str(), p.user.as_deref()), ("/app", Some("web")));
    }

    #[test]
    fn init_overrides() {
        let env = BTreeMap::new();
        let i = image();
        let p = |j: &str| i.process(Some(&init(j)), &env).unwrap().args;
        assert_eq!(
            p(r#"{"exec":["sh","-c","x"],"cmd":["y"]}"#),
            v(&["sh", "-c", "x"])
        );
        assert_eq!(p(r#"{"cmd":["other"]}"#), v(&["/bin/tini", "--", "other"]));
        assert_eq!(p(r#"{"entrypoint":["/bin/sh"]}"#), v(&["/bin/sh"]));
        assert_eq!(
            p(r#"{"entrypoint":"/bin/sh","cmd":"-c"}"#),
            v(&["/bin/sh", "-c"])
        );
        let u = i.process(Some(&init(r#"{"user":"0:0"}"#)), &env).unwrap();
        assert_eq!(u.user.as_deref(), Some("0:0"));
    }

    #[test]
    fn machine_env_wins_and_path_defaults() {
        let env = BTreeMap::from([("B".to_string(), "machine".to_string())]);
        let p = image().process(None, &env).unwrap();
        assert_eq!(p.env, v(&["PATH=/opt/bin:/bin", "A=image", "B=machine"]));
        let bare = ContainerConfig {
            cmd: Some(v(&["true"])),
            ..Default::default()
        };
        let p = bare.process(None, &BTreeMap::new()).unwrap();
        assert_eq!(p.env, vec![format!("PATH={DEFAULT_PATH}")]);
        assert_eq!((p.cwd.as_str(), p.user), ("/", None));
        assert!(ContainerConfig::default()
            .process(None, &BTreeMap::new())
            .is_none());
    }
}
