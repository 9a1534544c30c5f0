//! What the catalog's tests share (they cannot use the test kit, which is built on the
//! agent and so on this crate).

use std::time::{Duration, Instant};

/// Polls `check` every 20 ms until it holds and answers how long that took; panics after
/// `within`.
pub async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
