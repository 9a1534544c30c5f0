//! Coarse clocks: the kernel's `*_COARSE` clocks, read several times per request by every
//! stage (idle times, skip windows, request ids, timeouts).

/// Wall-clock milliseconds from the kernel's coarse clock: a few milliseconds of
/// resolution, and no hardware clock read (which costs more in a VM). For idle times, skip
/// windows and request ids, read several times per request.
pub(crate) fn now_ms() -> u64 {
    coarse_ms(libc::CLOCK_REALTIME_COARSE).unwrap_or_else(bazaar_types::now_ms)
}

/// Milliseconds of the kernel's coarse monotonic clock (as cheap as [`now_ms`], and
/// never stepped): for the proxy's timeouts.
pub(crate) fn monotonic_ms() -> u64 {
    coarse_ms(libc::CLOCK_MONOTONIC_COARSE).unwrap_or_else(|| {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
    })
}

fn coarse_ms(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000)
}
