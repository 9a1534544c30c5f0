//! Token verification cost per request, for an org token and an app token narrowed offline:
//! a request seen before in the same second (the decision is kept), a new request (the
//! token's checks run; signatures already verified), and the first sight of a token
//! (signatures checked).
//!
//! Run: `cargo bench -p bazaar-auth --bench verify` (prints a Markdown table).

use bazaar_auth::{attenuate, mint, Access, Op, Scope, TokenKey, Verifier};
use std::time::{Duration, Instant, SystemTime};

fn per_call(n: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..n / 10 {
        f();
    }
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    started.elapsed() / n
}

fn main() {
    let key = TokenKey::generate();
    let verifier = Verifier::for_key(&key);
    let org = mint(&key, &Scope::default()).unwrap();
    let narrowed = attenuate(
        &org,
        &Scope {
            apps: ["web".to_string()].into(),
            ops: [Op::Create, Op::Start, Op::Stop].into(),
            expires: Some(SystemTime::now() + Duration::from_secs(3600)),
            process: false,
            ..Scope::default()
        },
    )
    .unwrap();
    let access = Access {
        app: Some("web"),
        op: Op::Start,
        process: false,
        runtime: None,
    };
    let apps: Vec<String> = (0..1000).map(|i| format!("app-{i}")).collect();
    println!("| token | repeated request | new request (checks run) | first sight (signatures) |");
    println!("|---|---|---|---|");
    for (name, token) in [("org", &org), ("app, narrowed (2 blocks)", &narrowed)] {
        let repeated = per_call(20_000, || {
            let t = verifier.verify(token).unwrap();
            t.authorize(&access, SystemTime::now()).unwrap();
        });
        let mut i = 0;
        let new = per_call(5_000, || {
            let t = verifier.verify(token).unwrap();
            i = (i + 1) % apps.len();
            let other = Access {
                app: Some(&apps[i]),
                ..access
            };
            let _ = t.authorize(&other, SystemTime::now());
        });
        let first = per_call(2_000, || {
            let fresh = Verifier::for_key(&key);
            fresh.verify(token).unwrap();
        });
        println!("| {name} | {repeated:?} | {new:?} | {first:?} |");
    }
}
