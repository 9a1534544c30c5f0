//! The agent's clock: the unix milliseconds that leases, reservations, restart backoffs
//! and records are stamped and judged with. In production it is the system clock; a test
//! running the agent in-process on tokio's paused clock gives it [`Clock::tokio`], which
//! moves only when tokio's clock does, so a lease's TTL or a backoff passes in no real time.

use std::time::Duration;

/// Where "now" comes from.
#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    /// The system's wall clock ([`bazaar_types::now_ms`]).
    #[default]
    System,
    /// Tokio's clock, read as unix time: the wall time at `at` plus what tokio's clock has
    /// moved since (a paused clock moves only as the test's runtime advances it).
    Tokio {
        unix_ms_at: u64,
        at: tokio::time::Instant,
    },
}

impl Clock {
    /// A clock that follows tokio's (call inside the runtime whose clock it follows).
    pub fn tokio() -> Clock {
        Clock::Tokio {
            unix_ms_at: bazaar_types::now_ms(),
            at: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System => bazaar_types::now_ms(),
            Clock::Tokio { unix_ms_at, at } => {
                unix_ms_at
                    + tokio::time::Instant::now()
                        .saturating_duration_since(*at)
                        .as_millis() as u64
            }
        }
    }

    /// How long until unix time `at_ms` on this clock (zero once it has passed).
    pub fn until(&self, at_ms: u64) -> Duration {
        Duration::from_millis(at_ms.saturating_sub(self.now_ms()))
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_moves_with_the_paused_runtime_only() {
        let clock = Clock::tokio();
        let t0 = clock.now_ms();
        assert_eq!(clock.now_ms(), t0, "a paused clock stands still");
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.now_ms(), t0 + 90_000);
        assert_eq!(clock.until(t0 + 100_000), Duration::from_secs(10));
        assert_eq!(clock.until(t0), Duration::ZERO);
    }
}
