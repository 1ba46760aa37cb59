//! Where plugin calls run: on the request's own thread while they finish at
//! once, on threads of their own from the moment they have to wait.
//!
//! Nearly every call into a built-in plugin finishes in its first poll, in
//! microseconds; handing it to another thread would cost more than the call.
//! But a call that goes pending — it yielded at an epoch tick (its thread was
//! preempted, or it computes for longer), it sleeps, or it queues for an
//! instance — is polled again only when the executor gets to it. On the
//! request runtime that is behind every request task that is ready: under a
//! burst of new streams on two cores, 340 ms was measured for a call of a few
//! microseconds, holding its instance all along, so that the stage's other
//! rankings found every instance taken and skipped it as `busy`
//! (docs/benchmarks.md, "Bursts").
//!
//! So a call that goes pending moves, with everything it holds, to the
//! [`CallThreads`] runtime, whose queue holds plugin calls only — each a few
//! microseconds between yields — and comes back to the request as the answer.
//! Its budget is unchanged (see [`super::bounded`]): the time a move takes is
//! queue time, which the plugin is not charged for, and the hard cap still
//! bounds it.

use std::future::Future;
use std::panic::resume_unwind;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use anyhow::{Context as _, Result};

/// A runtime of its own for plugin calls that have to wait: as many threads
/// as the machine has cores, so that a plugin that computes still has every
/// core, as it had on the request workers. Stops when dropped.
pub struct CallThreads {
    handle: tokio::runtime::Handle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl CallThreads {
    /// Starts the runtime.
    pub fn start() -> Result<CallThreads> {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (started, handle) = std::sync::mpsc::sync_channel(1);
        // Built, run and dropped on a thread of its own, never inside an async
        // context (where tokio refuses to drop a runtime): the engine may be
        // made inside one, and the last chain may go on a request's worker.
        std::thread::Builder::new().name("poolgate-calls-main".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores)
                .thread_name("poolgate-calls")
                .enable_all()
                .build();
            match runtime {
                Ok(runtime) => {
                    let _ = started.send(Ok(runtime.handle().clone()));
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                }
                Err(e) => drop(started.send(Err(e))),
            }
        })?;
        let handle = handle.recv().context("the plugin call threads did not start")??;
        Ok(CallThreads { handle, _stop: stop })
    }

    /// Runs `call` here while it finishes in its first poll; if it has to
    /// wait, the rest of it runs on the call threads and the returned future
    /// waits for its answer. Dropping that future drops the call (on the call
    /// threads). A panic in it is passed on, as if it had run here.
    ///
    /// `make` makes the call where its box is made (so the optimizer may build
    /// it in place rather than copy a future of a few KiB there), and the
    /// caller's future holds only a pointer to it.
    ///
    /// The first poll runs inside the call threads' runtime context: a timer
    /// the call makes there (its budget's, a wait for an instance, a WASI
    /// sleep) is driven by the call threads, which keep it on time after the
    /// move, not by the request runtime, whose timer a burst keeps busy.
    pub fn run<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
        &self,
        make: impl FnOnce() -> F,
    ) -> Run<'_, T> {
        Run { threads: self, state: State::Here(Box::pin(make())) }
    }

    /// Runs `call` here if it finishes in its first poll, else lets it finish
    /// on the call threads; nothing waits for it.
    pub fn detach(&self, call: impl Future<Output = ()> + Send + 'static) {
        let mut call = Box::pin(call);
        let first = {
            let _context = self.handle.enter();
            call.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        };
        if first.is_ready() {
            return;
        }
        drop(self.handle.spawn(call));
    }
}

/// A call run by [`CallThreads::run`].
pub struct Run<'a, T> {
    threads: &'a CallThreads,
    state: State<T>,
}

enum State<T> {
    /// Not polled yet: its first poll is the caller's.
    Here(Pin<Box<dyn Future<Output = T> + Send>>),
    /// It had to wait: it runs on the call threads.
    There(AbortOnDrop<T>),
    /// It answered.
    Done,
}

impl<T: Send + 'static> Future for Run<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        if let State::Here(call) = &mut this.state {
            let first = {
                let _context = this.threads.handle.enter();
                call.as_mut().poll(cx)
            };
            if let Poll::Ready(answer) = first {
                this.state = State::Done;
                return Poll::Ready(answer);
            }
            let State::Here(call) = std::mem::replace(&mut this.state, State::Done) else { unreachable!() };
            this.state = State::There(AbortOnDrop(this.threads.handle.spawn(call)));
        }
        let State::There(task) = &mut this.state else { panic!("a plugin call polled after it answered") };
        match Pin::new(&mut task.0).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(answer) => {
                this.state = State::Done;
                match answer {
                    Ok(answer) => Poll::Ready(answer),
                    Err(e) if e.is_panic() => resume_unwind(e.into_panic()),
                    // Only `abort` (on drop, when nothing waits any more) or
                    // the runtime's end cancels the task; the runtime lives as
                    // long as the chain whose call this is, which the caller
                    // holds.
                    Err(e) => unreachable!("a plugin call was cancelled while its answer was awaited: {e}"),
                }
            }
        }
    }
}

/// A task aborted when its handle is dropped before it finished.
pub(super) struct AbortOnDrop<T>(pub(super) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
