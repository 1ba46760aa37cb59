//! The outer bounds of one call into a plugin: two wall-clock limits and a net
//! for panics.
//!
//! The CPU budget is fuel, counted by the guest's own instructions (see
//! [`super::engine`]), so it neither fires for a thread the scheduler set aside
//! nor stretches when the machine is saturated. What fuel cannot see is time
//! the call spends in host calls (a loop of `log` or WASI calls burns almost no
//! fuel) and time it spends waiting (a WASI sleep). Two limits cover those, and
//! neither counts the time a call that yielded spends queued for the executor,
//! which on a saturated machine says nothing about the plugin:
//!
//! - **busy**: the time the call's future spends being polled — on a thread,
//!   running the guest or its host calls — summed over polls. A guest yields at
//!   every epoch tick (1 ms), so this is checked every millisecond whatever it
//!   does, and a loop of host calls is cut here.
//! - **waiting**: how long one wait may last, measured by a timer armed each
//!   time the call is pending; a guest blocked in an asynchronous host call (a
//!   sleep) is cut here. It is generous ([`MIN_WAIT`] at least), because the
//!   same timer also runs while a call that yielded waits in the executor's
//!   queue.
//!
//! A call that finishes in one poll — the common case, microseconds — costs two
//! clock reads and no timer.
//!
//! A panic anywhere under the call — in a host function, in wasmtime, in WASI —
//! is caught here and becomes a fault with cause `host`: the request is served
//! without the stage, and the instance the call ran on is thrown away.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

/// The least a single wait may last before the call is cut (see the module
/// docs: a yielded call's time in the executor's queue counts as waiting).
pub const MIN_WAIT: Duration = Duration::from_millis(250);

/// Why a bounded call did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// It was busy (polled, running the guest or its host calls) this long.
    Busy(Duration),
    /// It waited this long at once (blocked in an asynchronous host call).
    Waited(Duration),
    /// Something under it panicked; the panic's message.
    Panicked(String),
}

pin_project! {
    /// `inner`, cut short once it has been busy for `busy_limit` or has
    /// waited `wait_limit` at once, with panics caught.
    pub struct Bounded<F> {
        #[pin]
        inner: F,
        busy: Duration,
        busy_limit: Duration,
        wait_limit: Duration,
        #[pin]
        timer: Option<tokio::time::Sleep>,
    }
}

impl<F: Future> Bounded<F> {
    /// Bounds `inner`: at most `wall` busy, and at most `wall` (but no less than
    /// [`MIN_WAIT`]) in any one wait.
    pub fn new(inner: F, wall: Duration) -> Self {
        Bounded { inner, busy: Duration::ZERO, busy_limit: wall, wait_limit: wall.max(MIN_WAIT), timer: None }
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Result<F::Output, Cut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(timer) = this.timer.as_mut().as_pin_mut()
            && timer.is_elapsed()
        {
            return Poll::Ready(Err(Cut::Waited(*this.wait_limit)));
        }
        let started = Instant::now();
        let polled = catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll(cx)));
        let now = Instant::now();
        *this.busy += now - started;
        match polled {
            Ok(Poll::Ready(v)) => return Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => {}
            Err(payload) => return Poll::Ready(Err(Cut::Panicked(panic_message(payload.as_ref())))),
        }
        if *this.busy >= *this.busy_limit {
            return Poll::Ready(Err(Cut::Busy(*this.busy_limit)));
        }
        let deadline = tokio::time::Instant::from_std(now + *this.wait_limit);
        match this.timer.as_mut().as_pin_mut() {
            Some(timer) => timer.reset(deadline),
            None => this.timer.set(Some(tokio::time::sleep_until(deadline))),
        }
        if let Some(timer) = this.timer.as_pin_mut()
            && timer.poll(cx).is_ready()
        {
            return Poll::Ready(Err(Cut::Waited(*this.wait_limit)));
        }
        Poll::Pending
    }
}

/// The text of a panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_future_passes_through() {
        assert_eq!(Bounded::new(async { 7 }, Duration::from_millis(1)).await, Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_future_is_cut_at_the_wait_limit() {
        let sleep = tokio::time::sleep(Duration::from_secs(3600));
        let started = tokio::time::Instant::now();
        let r = Bounded::new(sleep, Duration::from_millis(50)).await;
        assert_eq!(r, Err(Cut::Waited(MIN_WAIT)));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_busy_future_is_cut_at_the_busy_limit_however_often_it_yields() {
        let spin = async {
            loop {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(2) {}
                tokio::task::yield_now().await;
            }
        };
        let started = Instant::now();
        let r: Result<(), Cut> = Bounded::new(spin, Duration::from_millis(30)).await;
        assert_eq!(r, Err(Cut::Busy(Duration::from_millis(30))));
        assert!(started.elapsed() < Duration::from_millis(200));
    }

    #[tokio::test]
    async fn time_queued_after_a_yield_is_not_busy() {
        // Yields a hundred times; each time another task holds the thread 1 ms.
        let hog = tokio::spawn(async {
            for _ in 0..200 {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(1) {}
                tokio::task::yield_now().await;
            }
        });
        let yielding = async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        };
        assert_eq!(Bounded::new(yielding, Duration::from_millis(20)).await, Ok(()));
        hog.await.unwrap();
    }

    #[tokio::test]
    async fn a_panic_is_caught_with_its_message() {
        let r = Bounded::new(async { panic!("host bug {}", 42) }, Duration::from_secs(1)).await;
        let r: Result<(), Cut> = r;
        assert_eq!(r, Err(Cut::Panicked("host bug 42".into())));
    }
}
