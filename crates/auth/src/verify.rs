//! Checking a token against one request, offline, with the cluster's public token key. The
//! signatures of a token are checked once ([`Verifier::verify`], cached by the token's
//! text); each request then runs the token's checks against its own facts
//! ([`Verified::authorize`]). Revocation is the caller's: it holds the revoked ids and
//! compares them with [`Verified::revocation_ids`].

use crate::token::{public_from_hex, strip};
use crate::{Error, Op, TokenKey};
use biscuit_auth::builder::{date, fact, string, Check, Policy};
use biscuit_auth::error::{FailedCheck, Logic, Token as TokenError};
use biscuit_auth::{AuthorizerBuilder, AuthorizerLimits, Biscuit, PublicKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

/// Longest a token's checks may run (they take microseconds; biscuit's default of 1 ms
/// refused valid tokens on a loaded host, when the thread was descheduled mid-check).
const MAX_AUTHORIZE_TIME: std::time::Duration = std::time::Duration::from_millis(50);

/// Most tokens kept verified at once (the cache is emptied when full).
const CACHE_ENTRIES: usize = 4096;

/// What a request does, as the token's checks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access<'a> {
    /// The app it concerns (`None`: the platform, e.g. listing apps or regions).
    pub app: Option<&'a str>,
    pub op: Op,
    /// Whether it creates or updates a machine with `config.driver = "process"`.
    pub process: bool,
    /// The runtime of the machine config it creates or updates (`config.runtime`, as
    /// `MachineConfig::runtime` reads it); `None` when it carries no config.
    pub runtime: Option<&'a str>,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// Not a token signed by the cluster key (or edited since): 401.
    #[error("invalid token: {0}")]
    Invalid(String),
    /// Past its expiry: 401.
    #[error("token expired")]
    Expired,
    /// Scoped to other apps: answered as if the app did not exist (404), so a token for one
    /// app learns nothing about the others.
    #[error("app not found")]
    OtherApp,
    /// Valid for this app, but not for this operation: 403.
    #[error("{0}")]
    Forbidden(String),
}

/// A token whose signatures verified against the cluster key.
#[derive(Debug)]
pub struct Verified {
    biscuit: Biscuit,
    revocation_ids: Vec<String>,
    /// Decisions of the current second: the checks see time in whole seconds, so a
    /// decision holds for the rest of its second, and a client repeating a request pays for
    /// the checks once per second.
    decisions: Mutex<Decisions>,
}

/// Decisions made in second `second` (Unix time), by request.
#[derive(Debug, Default)]
struct Decisions {
    second: u64,
    made: HashMap<DecisionKey, Result<(), Denied>>,
}

/// A request as far as a decision goes: app, operation, process driver, runtime.
type DecisionKey = (Option<String>, Op, bool, Option<String>);

/// Most decisions kept for one token and one second.
const DECISIONS: usize = 256;

impl Verified {
    /// The token's id: its last block's revocation id. Every token narrowed from this one
    /// carries it too, so revoking it revokes them all (and not the token this one was
    /// narrowed from).
    pub fn id(&self) -> &str {
        self.revocation_ids
            .last()
            .expect("a verified token has blocks")
    }

    /// Every block's revocation id: the token is revoked if any of them is.
    pub fn revocation_ids(&self) -> &[String] {
        &self.revocation_ids
    }

    /// Runs the token's checks against `access` at `now` (or answers as they did earlier
    /// in the same second).
    pub fn authorize(&self, access: &Access<'_>, now: SystemTime) -> Result<(), Denied> {
        let second = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let key = (
            access.app.map(str::to_string),
            access.op,
            access.process,
            access.runtime.map(str::to_string),
        );
        {
            let decisions = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
            if decisions.second == second {
                if let Some(decision) = decisions.made.get(&key) {
                    return decision.clone();
                }
            }
        }
        let decision = self.run_checks(access, now);
        let mut decisions = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        if decisions.second != second || decisions.made.len() >= DECISIONS {
            decisions.second = second;
            decisions.made.clear();
        }
        decisions.made.insert(key, decision.clone());
        decision
    }

    /// Runs the token's checks (biscuit's authorizer) against `access` at `now`.
    fn run_checks(&self, access: &Access<'_>, now: SystemTime) -> Result<(), Denied> {
        let (process_rule, allow) = rules();
        let subject = match access.app {
            Some(app) => fact("app", &[string(app)]),
            None => fact("platform", &[biscuit_auth::builder::boolean(true)]),
        };
        let driver = if access.process { "process" } else { "none" };
        let result = AuthorizerBuilder::new()
            .set_limits(AuthorizerLimits {
                max_time: MAX_AUTHORIZE_TIME,
                ..AuthorizerLimits::default()
            })
            .fact(fact("operation", &[string(access.op.name())]))
            .and_then(|b| b.fact(subject))
            .and_then(|b| b.fact(fact("driver", &[string(driver)])))
            .and_then(|b| b.fact(fact("runtime", &[string(access.runtime.unwrap_or("none"))])))
            .and_then(|b| b.fact(fact("time", &[date(&now)])))
            .and_then(|b| b.check(process_rule.clone()))
            .and_then(|b| b.policy(allow.clone()))
            .and_then(|b| b.build(&self.biscuit))
            .and_then(|mut a| a.authorize());
        match result {
            Ok(_) => Ok(()),
            Err(TokenError::FailedLogic(
                Logic::Unauthorized { checks, .. } | Logic::NoMatchingPolicy { checks },
            )) => Err(classify(&checks, access)),
            Err(e) => Err(Denied::Invalid(e.to_string())),
        }
    }
}

/// The authorizer's own rules, parsed once: the process driver needs a grant in the token's
/// first block (facts of later blocks are not trusted by the authorizer), and everything
/// else is up to the token's checks.
fn rules() -> &'static (Check, Policy) {
    static RULES: OnceLock<(Check, Policy)> = OnceLock::new();
    RULES.get_or_init(|| {
        (
            Check::try_from(r#"check if driver("none") or process_driver(true)"#)
                .expect("a valid check"),
            Policy::try_from("allow if true").expect("a valid policy"),
        )
    })
}

/// Which refusal failed checks amount to: expiry first, then the app, then the rest.
fn classify(checks: &[FailedCheck], access: &Access<'_>) -> Denied {
    let rules: Vec<&str> = checks
        .iter()
        .map(|c| match c {
            FailedCheck::Block(b) => b.rule.as_str(),
            FailedCheck::Authorizer(a) => a.rule.as_str(),
        })
        .collect();
    // (`runtime(` contains `time(`: the expiry is the check that starts with it.)
    if rules.iter().any(|r| r.starts_with("check if time(")) {
        Denied::Expired
    } else if access.app.is_some() && rules.iter().any(|r| r.contains("app(")) {
        Denied::OtherApp
    } else if rules.iter().any(|r| r.contains("driver(")) && access.process {
        Denied::Forbidden(
            "this token does not allow the process driver (config.driver = \"process\")".into(),
        )
    } else if let (Some(runtime), true) =
        (access.runtime, rules.iter().any(|r| r.contains("runtime(")))
    {
        Denied::Forbidden(format!(
            "this token does not allow the {runtime} runtime (config.runtime): it is limited \
             to other runtimes"
        ))
    } else if access.app.is_none() && rules.iter().any(|r| r.contains("app(")) {
        Denied::Forbidden(format!(
            "this token is scoped to apps: it does not allow {} here",
            access.op
        ))
    } else {
        Denied::Forbidden(format!("this token does not allow {}", access.op))
    }
}

/// Verifies tokens with the cluster's public token key.
#[derive(Debug)]
pub struct Verifier {
    key: PublicKey,
    cache: RwLock<HashMap<Box<str>, Arc<Verified>>>,
}

impl Verifier {
    /// A verifier for the public key in hex.
    pub fn from_public_hex(text: &str) -> Result<Verifier, Error> {
        Ok(Verifier::with_key(public_from_hex(text)?))
    }

    /// A verifier for `key`'s public half.
    pub fn for_key(key: &TokenKey) -> Verifier {
        Verifier::with_key(key.public())
    }

    fn with_key(key: PublicKey) -> Verifier {
        Verifier {
            key,
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Checks `token`'s signatures (once per distinct token: the result is cached).
    pub fn verify(&self, token: &str) -> Result<Arc<Verified>, Denied> {
        let token = token.trim();
        if let Some(hit) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
        {
            return Ok(hit.clone());
        }
        let biscuit = strip(token)
            .map_err(|e| Denied::Invalid(e.to_string()))
            .and_then(|b64| {
                Biscuit::from_base64(b64, self.key).map_err(|e| Denied::Invalid(e.to_string()))
            })?;
        let revocation_ids: Vec<String> = biscuit
            .revocation_identifiers()
            .iter()
            .map(hex::encode)
            .collect();
        if revocation_ids.is_empty() {
            return Err(Denied::Invalid("a token without blocks".into()));
        }
        let verified = Arc::new(Verified {
            biscuit,
            revocation_ids,
            decisions: Mutex::new(Decisions::default()),
        });
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(token.into(), verified.clone());
        Ok(verified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attenuate, mint, Scope};
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn access(app: Option<&str>, op: Op) -> Access<'_> {
        Access {
            app,
            op,
            process: false,
            runtime: None,
        }
    }

    fn now() -> SystemTime {
        SystemTime::now()
    }

    fn apps(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn an_org_token_does_everything() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let t = v.verify(&mint(&key, &Scope::default()).unwrap()).unwrap();
        for op in Op::ALL {
            t.authorize(&access(Some("web"), op), now()).unwrap();
            t.authorize(&access(None, op), now()).unwrap();
        }
        t.authorize(
            &Access {
                app: Some("web"),
                op: Op::Create,
                process: true,
                runtime: None,
            },
            now(),
        )
        .unwrap();
    }

    #[test]
    fn an_app_token_sees_only_its_apps_and_reads_the_platform() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let scope = Scope {
            apps: apps(&["web", "api"]),
            process: false,
            ..Scope::default()
        };
        let t = v.verify(&mint(&key, &scope).unwrap()).unwrap();
        t.authorize(&access(Some("web"), Op::Destroy), now())
            .unwrap();
        t.authorize(&access(Some("api"), Op::Exec), now()).unwrap();
        assert_eq!(
            t.authorize(&access(Some("db"), Op::Read), now()),
            Err(Denied::OtherApp)
        );
        t.authorize(&access(None, Op::Read), now()).unwrap();
        assert!(matches!(
            t.authorize(&access(None, Op::Create), now()),
            Err(Denied::Forbidden(_))
        ));
        // No process driver unless granted.
        let process = Access {
            app: Some("web"),
            op: Op::Create,
            process: true,
            runtime: None,
        };
        assert!(matches!(
            t.authorize(&process, now()),
            Err(Denied::Forbidden(m)) if m.contains("process driver")
        ));
        let granted = Scope {
            process: true,
            ..scope
        };
        let t = v.verify(&mint(&key, &granted).unwrap()).unwrap();
        t.authorize(&process, now()).unwrap();
    }

    #[test]
    fn a_runtime_limited_token_creates_and_updates_only_those_runtimes() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let scope = Scope {
            process: false,
            runtimes: apps(&["gvisor", "microvm"]),
            ..Scope::default()
        };
        let t = v.verify(&mint(&key, &scope).unwrap()).unwrap();
        let with = |op, runtime, process| Access {
            app: Some("web"),
            op,
            process,
            runtime,
        };
        for op in [Op::Create, Op::Update] {
            t.authorize(&with(op, Some("gvisor"), false), now())
                .unwrap();
            t.authorize(&with(op, Some("microvm"), false), now())
                .unwrap();
            assert!(matches!(
                t.authorize(&with(op, Some("runc"), false), now()),
                Err(Denied::Forbidden(m)) if m.contains("runc runtime")
            ));
            assert!(matches!(
                t.authorize(&with(op, Some("process"), true), now()),
                Err(Denied::Forbidden(_))
            ));
        }
        // Calls without a config are not about runtimes.
        t.authorize(&access(Some("web"), Op::Stop), now()).unwrap();
        // Narrowing an org token limits it the same way, and cannot widen a limited one.
        let org = mint(&key, &Scope::default()).unwrap();
        let narrowed = attenuate(
            &org,
            &Scope {
                runtimes: apps(&["gvisor"]),
                ..Scope::default()
            },
        )
        .unwrap();
        let n = v.verify(&narrowed).unwrap();
        n.authorize(&with(Op::Create, Some("gvisor"), false), now())
            .unwrap();
        assert!(n
            .authorize(&with(Op::Create, Some("runc"), false), now())
            .is_err());
        let limited = mint(&key, &scope).unwrap();
        let wider = attenuate(
            &limited,
            &Scope {
                runtimes: apps(&["runc"]),
                ..Scope::default()
            },
        )
        .unwrap();
        let w = v.verify(&wider).unwrap();
        assert!(w
            .authorize(&with(Op::Create, Some("runc"), false), now())
            .is_err());
        // Names are checked when a token is made.
        let bad = Scope {
            runtimes: apps(&["kata"]),
            ..Scope::default()
        };
        assert!(mint(&key, &bad)
            .unwrap_err()
            .to_string()
            .contains("unknown runtime"));
    }

    #[test]
    fn read_only_and_operation_scopes() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let ro = Scope {
            read_only: true,
            ..Scope::default()
        };
        let t = v.verify(&mint(&key, &ro).unwrap()).unwrap();
        t.authorize(&access(Some("web"), Op::Read), now()).unwrap();
        for op in Op::ALL.into_iter().filter(|op| *op != Op::Read) {
            assert_eq!(
                t.authorize(&access(Some("web"), op), now()),
                Err(Denied::Forbidden(format!("this token does not allow {op}")))
            );
        }
        let some = Scope {
            ops: BTreeSet::from([Op::Create, Op::Start, Op::Stop]),
            ..Scope::default()
        };
        let t = v.verify(&mint(&key, &some).unwrap()).unwrap();
        for op in [Op::Read, Op::Create, Op::Start, Op::Stop] {
            t.authorize(&access(Some("web"), op), now()).unwrap();
        }
        for op in [Op::Exec, Op::Destroy, Op::Update] {
            assert!(t.authorize(&access(Some("web"), op), now()).is_err());
        }
    }

    #[test]
    fn an_expired_token_is_refused_as_expired() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let scope = Scope {
            expires: Some(now() + Duration::from_secs(60)),
            ..Scope::default()
        };
        let t = v.verify(&mint(&key, &scope).unwrap()).unwrap();
        t.authorize(&access(Some("web"), Op::Read), now()).unwrap();
        let later = now() + Duration::from_secs(120);
        assert_eq!(
            t.authorize(&access(Some("web"), Op::Read), later),
            Err(Denied::Expired)
        );
    }

    #[test]
    fn narrowing_never_widens() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let app_token = mint(
            &key,
            &Scope {
                apps: apps(&["web"]),
                read_only: true,
                process: false,
                ..Scope::default()
            },
        )
        .unwrap();
        // A block asking for more (another app, every operation, the process driver) adds
        // checks; the first block's checks still hold.
        let wider = attenuate(
            &app_token,
            &Scope {
                apps: apps(&["web", "db"]),
                ..Scope::default()
            },
        )
        .unwrap();
        let t = v.verify(&wider).unwrap();
        assert_eq!(
            t.authorize(&access(Some("db"), Op::Read), now()),
            Err(Denied::OtherApp)
        );
        assert!(t
            .authorize(&access(Some("web"), Op::Create), now())
            .is_err());
        let process = Access {
            app: Some("web"),
            op: Op::Read,
            process: true,
            runtime: None,
        };
        assert!(t.authorize(&process, now()).is_err());

        // An org token narrowed to an app, read-only, expiring.
        let org = mint(&key, &Scope::default()).unwrap();
        let narrowed = attenuate(
            &org,
            &Scope {
                apps: apps(&["web"]),
                read_only: true,
                expires: Some(now() + Duration::from_secs(600)),
                process: false,
                ..Scope::default()
            },
        )
        .unwrap();
        let t = v.verify(&narrowed).unwrap();
        t.authorize(&access(Some("web"), Op::Read), now()).unwrap();
        assert!(t.authorize(&access(Some("web"), Op::Stop), now()).is_err());
        assert_eq!(
            t.authorize(&access(Some("api"), Op::Read), now()),
            Err(Denied::OtherApp)
        );
        assert_eq!(
            t.authorize(
                &access(Some("web"), Op::Read),
                now() + Duration::from_secs(700)
            ),
            Err(Denied::Expired)
        );
    }

    #[test]
    fn a_token_from_another_key_or_edited_is_invalid() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let other = mint(&TokenKey::generate(), &Scope::default()).unwrap();
        assert!(matches!(v.verify(&other), Err(Denied::Invalid(_))));
        assert!(matches!(v.verify("bz1_garbage"), Err(Denied::Invalid(_))));
        assert!(matches!(v.verify("legacy"), Err(Denied::Invalid(_))));

        // Dropping the narrowing block, or flipping any byte, breaks the signatures.
        let org = mint(&key, &Scope::default()).unwrap();
        let narrowed = attenuate(
            &org,
            &Scope {
                read_only: true,
                ..Scope::default()
            },
        )
        .unwrap();
        let raw = biscuit_auth::UnverifiedBiscuit::from_base64(strip(&narrowed).unwrap())
            .unwrap()
            .to_vec()
            .unwrap();
        let mut refused = 0;
        for i in (0..raw.len()).step_by(7) {
            let mut edited = raw.clone();
            edited[i] ^= 0x01;
            let b64 = biscuit_auth::UnverifiedBiscuit::from(&edited[..])
                .and_then(|b| b.to_base64())
                .unwrap_or_default();
            let token = format!("{}{b64}", crate::PREFIX);
            match v.verify(&token) {
                Err(_) => refused += 1,
                Ok(t) => {
                    // An edit that still parses and verifies must not have widened it.
                    assert!(t.authorize(&access(Some("web"), Op::Stop), now()).is_err());
                }
            }
        }
        assert!(refused > 0);
        assert!(v.verify(&narrowed).is_ok());
    }

    #[test]
    fn a_narrowed_token_carries_the_id_of_its_parent() {
        let key = TokenKey::generate();
        let v = Verifier::for_key(&key);
        let org = mint(&key, &Scope::default()).unwrap();
        let narrowed = attenuate(
            &org,
            &Scope {
                read_only: true,
                ..Scope::default()
            },
        )
        .unwrap();
        let (a, b) = (v.verify(&org).unwrap(), v.verify(&narrowed).unwrap());
        assert_ne!(a.id(), b.id());
        assert_eq!(b.revocation_ids(), [a.id().to_string(), b.id().to_string()]);
        assert_eq!(a.id().len(), 128);
    }
}
