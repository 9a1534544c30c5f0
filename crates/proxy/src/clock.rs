//! Coarse clocks: the kernel's `*_COARSE` clocks, read several times per request by every
//! stage (idle times, skip windows, request ids, timeouts).

use rustix::time::ClockId;

/// Wall-clock milliseconds from the kernel's coarse clock: a few milliseconds of
/// resolution, and no hardware clock read (which costs more in a VM). For idle times, skip
/// windows and request ids, read several times per request.
pub(crate) fn now_ms() -> u64 {
    coarse_ms(ClockId::RealtimeCoarse)
}

/// Milliseconds of the kernel's coarse monotonic clock (as cheap as [`now_ms`], and
/// never stepped): for the proxy's timeouts.
pub(crate) fn monotonic_ms() -> u64 {
    coarse_ms(ClockId::MonotonicCoarse)
}

fn coarse_ms(clock: ClockId) -> u64 {
    let ts = rustix::time::clock_gettime(clock);
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}
