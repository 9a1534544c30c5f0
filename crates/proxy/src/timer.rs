//! A coarse timer for hyper's HTTP/1.1 header read timeout (the defence against clients
//! that send a request head slowly, or not at all).
//!
//! hyper arms that timeout for every request it reads. With tokio's timer each one is a
//! timer-wheel entry registered and cancelled under the driver's lock, which measured ~14 %
//! of the proxy's throughput. Here a sleep that is waited on files its deadline under its
//! task (the connection's task: one entry per connection, holding the earliest deadline
//! any of its sleeps filed, nothing removed per request), and the proxy thread's ticker
//! ([`fire_expired`], every [`TICK`]) wakes the tasks whose deadline has passed; the woken
//! task polls its sleeps, which end if their own deadline has passed and otherwise file
//! theirs again. A timeout thus fires up to one tick late, which is fine for one of
//! seconds; a task whose earlier sleep was dropped is woken once for nothing. An entry
//! whose connection is gone is dropped at its deadline.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often each proxy thread wakes the sleeps that are due.
pub(crate) const TICK: Duration = Duration::from_secs(1);

thread_local! {
    /// Tasks of this thread waiting on a sleep, by their waker's data pointer:
    /// (the latest deadline filed, in [`crate::clock::monotonic_ms`], waker).
    static WAITING: RefCell<FxHashMap<usize, (u64, Waker)>> = RefCell::new(FxHashMap::default());
}

/// hyper's [`Timer`](hyper::rt::Timer) over this thread's coarse sleeps.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CoarseTimer;

impl hyper::rt::Timer for CoarseTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(CoarseSleep::after(duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep(deadline.saturating_duration_since(Instant::now()))
    }
}

/// Ready once its deadline has passed (noticed at the next tick). Kept on the kernel's
/// coarse clock, read without a hardware clock read.
pub(crate) struct CoarseSleep {
    deadline_ms: u64,
}

impl CoarseSleep {
    /// A sleep of `duration`, for a task on a proxy thread (whose ticker wakes it).
    pub(crate) fn after(duration: Duration) -> CoarseSleep {
        CoarseSleep {
            deadline_ms: crate::clock::monotonic_ms() + duration.as_millis() as u64,
        }
    }
}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if crate::clock::monotonic_ms() >= self.deadline_ms {
            return Poll::Ready(());
        }
        let deadline = self.deadline_ms;
        let key = cx.waker().data() as usize;
        WAITING.with(|w| {
            let mut w = w.borrow_mut();
            match w.get_mut(&key) {
                Some(entry) => {
                    // The earliest: a shorter sleep after a longer one (a request head
                    // begun on an idle keep-alive connection) must not wait for the longer.
                    entry.0 = entry.0.min(deadline);
                    if !entry.1.will_wake(cx.waker()) {
                        entry.1 = cx.waker().clone();
                    }
                }
                None => {
                    w.insert(key, (deadline, cx.waker().clone()));
                }
            }
        });
        Poll::Pending
    }
}

impl hyper::rt::Sleep for CoarseSleep {}

/// Wakes this thread's sleeps whose deadline has passed (they finish when polled).
pub(crate) fn fire_expired() {
    let now = crate::clock::monotonic_ms();
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
    async fn a_sleep_ends_at_the_first_tick_after_its_deadline() {
        let timer = CoarseTimer;
        let task = std::sync::Arc::new(Flag::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        // One connection's task: a first request's sleep, then the next request's.
        let mut first = timer.sleep(Duration::from_millis(30));
        assert!(first.as_mut().poll(&mut cx).is_pending());
        drop(first);
        let mut next = timer.sleep(Duration::from_millis(200));
        assert!(next.as_mut().poll(&mut cx).is_pending());
        assert_eq!(WAITING.with(|w| w.borrow().len()), 1, "one entry per task");
        tokio::time::sleep(Duration::from_millis(40)).await;
        fire_expired();
        // Woken once for the dropped sleep: the next one is not due and files itself again.
        assert!(task.take());
        assert!(next.as_mut().poll(&mut cx).is_pending());
        tokio::time::sleep(Duration::from_millis(190)).await;
        fire_expired();
        assert!(task.take(), "woken at the first tick after the deadline");
        assert!(next.as_mut().poll(&mut cx).is_ready());
        assert_eq!(WAITING.with(|w| w.borrow().len()), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_short_sleep_after_a_long_one_is_not_held_back() {
        // An idle keep-alive connection (a long sleep) that begins a request head (the
        // header timeout): the task must be woken at the short deadline, not the long one.
        let timer = CoarseTimer;
        let task = std::sync::Arc::new(Flag::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut idle = timer.sleep(Duration::from_secs(60));
        assert!(idle.as_mut().poll(&mut cx).is_pending());
        drop(idle);
        let mut head = timer.sleep(Duration::from_millis(30));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        tokio::time::sleep(Duration::from_millis(40)).await;
        fire_expired();
        assert!(task.take(), "woken at the header deadline");
        assert!(head.as_mut().poll(&mut cx).is_ready());
    }

    #[derive(Default)]
    struct Flag(std::sync::atomic::AtomicBool);

    impl Flag {
        /// Whether the task was woken since the last call.
        fn take(&self) -> bool {
            self.0.swap(false, std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl std::task::Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
