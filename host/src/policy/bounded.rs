//! The outer bounds of one call into a plugin: a wall-clock limit and a net for
//! panics.
//!
//! The CPU budget is fuel, counted by the guest's own instructions (see
//! [`super::engine`]), so it neither fires for a thread the scheduler set aside
//! nor stretches when the machine is saturated. What fuel cannot see is time a
//! guest spends waiting — a WASI sleep or poll — and that is what the wall-clock
//! bound here is for. It counts from the call's start and is checked every time
//! the call yields — at every epoch tick (1 ms) whatever the guest is doing,
//! host calls included, or every fuel interval of its own work — and by a timer
//! armed the first time it yields, for a guest blocked in an asynchronous host
//! call (a sleep). A call that finishes in one poll — the common case,
//! microseconds — costs one clock read and no timer.
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

/// Why a bounded call did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// It ran past its wall-clock bound.
    Wall(Duration),
    /// Something under it panicked; the panic's message.
    Panicked(String),
}

pin_project! {
    /// `inner`, cut short `wall` after it was created, with panics caught.
    pub struct Bounded<F> {
        #[pin]
        inner: F,
        deadline: Instant,
        wall: Duration,
        #[pin]
        timer: Option<tokio::time::Sleep>,
    }
}

impl<F: Future> Bounded<F> {
    /// Bounds `inner` by `wall`.
    pub fn new(inner: F, wall: Duration) -> Self {
        Bounded { inner, deadline: Instant::now() + wall, wall, timer: None }
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Result<F::Output, Cut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => return Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => {}
            Err(payload) => return Poll::Ready(Err(Cut::Panicked(panic_message(payload.as_ref())))),
        }
        let deadline = *this.deadline;
        if Instant::now() >= deadline {
            return Poll::Ready(Err(Cut::Wall(*this.wall)));
        }
        if this.timer.is_none() {
            this.timer.set(Some(tokio::time::sleep_until(deadline.into())));
        }
        if let Some(timer) = this.timer.as_pin_mut()
            && timer.poll(cx).is_ready()
        {
            return Poll::Ready(Err(Cut::Wall(*this.wall)));
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
    async fn a_waiting_future_is_cut_at_the_wall() {
        let sleep = tokio::time::sleep(Duration::from_secs(3600));
        let started = tokio::time::Instant::now();
        let r = Bounded::new(sleep, Duration::from_millis(50)).await;
        assert_eq!(r, Err(Cut::Wall(Duration::from_millis(50))));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_panic_is_caught_with_its_message() {
        let r = Bounded::new(async { panic!("host bug {}", 42) }, Duration::from_secs(1)).await;
        let r: Result<(), Cut> = r;
        assert_eq!(r, Err(Cut::Panicked("host bug 42".into())));
    }
}
