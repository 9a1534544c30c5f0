//! A coarse timer for hyper's HTTP/1.1 header read timeout (the defence against clients
//! that send a request head slowly, or not at all).
//!
//! hyper arms that timeout for every request it reads. With tokio's timer each one is a
//! timer-wheel entry registered and cancelled under the driver's lock, which measured ~14 %
//! of the proxy's throughput. This one costs nothing until a head is actually waited for:
//! a sleep that finds its deadline not yet passed files its waker in its thread's list, and
//! the proxy thread's ticker ([`fire_expired`], every [`TICK`]) wakes those whose deadline
//! has passed. A timeout thus fires up to one tick late, which is fine for one of seconds.

use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often each proxy thread wakes the sleeps that are due.
pub(crate) const TICK: Duration = Duration::from_secs(1);

thread_local! {
    /// The sleeps of this thread that are being waited on: id → (deadline, waker).
    static WAITING: RefCell<FxHashMap<u64, (Instant, Waker)>> = RefCell::new(FxHashMap::default());
    /// Ids for this thread's sleeps, from a random start (a sleep dropped on another thread
    /// must not remove one of that thread's).
    static NEXT_ID: Cell<u64> = Cell::new(rand::random::<u64>() >> 1);
}

/// hyper's [`Timer`](hyper::rt::Timer) over this thread's coarse sleeps.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CoarseTimer;

impl hyper::rt::Timer for CoarseTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let id = NEXT_ID.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1));
            id
        });
        Box::pin(CoarseSleep {
            id,
            deadline,
            filed: false,
        })
    }
}

/// Ready once its deadline has passed (noticed at the next tick).
struct CoarseSleep {
    id: u64,
    deadline: Instant,
    /// Its waker is in the thread's list.
    filed: bool,
}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline {
            this.unfile();
            return Poll::Ready(());
        }
        let (id, deadline) = (this.id, this.deadline);
        WAITING.with(|w| {
            let mut w = w.borrow_mut();
            match w.get_mut(&id) {
                Some((_, waker)) if waker.will_wake(cx.waker()) => {}
                Some(entry) => entry.1 = cx.waker().clone(),
                None => {
                    w.insert(id, (deadline, cx.waker().clone()));
                }
            }
        });
        this.filed = true;
        Poll::Pending
    }
}

impl CoarseSleep {
    fn unfile(&mut self) {
        if std::mem::take(&mut self.filed) {
            let _ = WAITING.try_with(|w| w.borrow_mut().remove(&self.id));
        }
    }
}

impl Drop for CoarseSleep {
    fn drop(&mut self) {
        self.unfile();
    }
}

impl hyper::rt::Sleep for CoarseSleep {}

/// Wakes this thread's sleeps whose deadline has passed (they finish when polled).
pub(crate) fn fire_expired() {
    let now = Instant::now();
    let due: Vec<Waker> = WAITING.with(|w| {
        let mut w = w.borrow_mut();
        let mut due = Vec::new();
        w.retain(|_, (deadline, waker)| {
            if *deadline <= now {
                due.push(waker.clone());
                false
            } else {
                true
            }
        });
        due
    });
    for waker in due {
        waker.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    #[tokio::test(flavor = "current_thread")]
    async fn sleeps_end_at_the_first_tick_after_their_deadline_and_leave_nothing_behind() {
        let timer = CoarseTimer;
        let mut short = timer.sleep(Duration::from_millis(30));
        let long = timer.sleep(Duration::from_secs(3600));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(short.as_mut().poll(&mut cx).is_pending());
        let mut long = long;
        assert!(long.as_mut().poll(&mut cx).is_pending());
        assert_eq!(WAITING.with(|w| w.borrow().len()), 2);
        tokio::time::sleep(Duration::from_millis(40)).await;
        fire_expired();
        assert_eq!(
            WAITING.with(|w| w.borrow().len()),
            1,
            "the due one was woken"
        );
        assert!(short.as_mut().poll(&mut cx).is_ready());
        assert!(long.as_mut().poll(&mut cx).is_pending());
        drop(long);
        assert_eq!(
            WAITING.with(|w| w.borrow().len()),
            0,
            "a dropped sleep unfiles"
        );
    }
}
