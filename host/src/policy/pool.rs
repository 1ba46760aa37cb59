//! A plugin's warm instances: taken by calls, given back after them, and
//! replaced in the background — a request never instantiates or configures.
//!
//! Instantiating costs ~15 µs for a Rust guest and milliseconds for Python or
//! JavaScript, and a plugin's `configure` may take as long as it likes; none of
//! that may land on a request. So the pool keeps `target` instances alive and a
//! builder task (on the engine's builder thread) creates a new one whenever one
//! is thrown away (after any failed call). A call that finds every instance busy
//! waits for one to come back — at most its deadline; past that the stage is
//! skipped as a timeout, with the last build failure in the message if there
//! was one. Builds that fail back off (50 ms doubling to 30 s), so a plugin
//! whose `configure` keeps failing costs a bounded amount of work.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::fault::Fault;
use super::instance::Instance;

/// First wait after a failed build.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest wait between failed builds.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The instances of one plugin.
pub struct InstancePool {
    idle: Mutex<Vec<Instance>>,
    target: usize,
    /// Instances alive or being built.
    live: AtomicUsize,
    /// Calls waiting for an instance.
    waiting: AtomicUsize,
    returned: Notify,
    /// Wakes the builder (shared with it, so it can wait without keeping the
    /// pool alive).
    wake: Arc<Notify>,
    last_build_error: Mutex<Option<Fault>>,
}

impl InstancePool {
    /// A pool that keeps `target` instances (at least one).
    pub fn new(target: usize) -> Self {
        InstancePool {
            idle: Mutex::new(Vec::new()),
            target: target.max(1),
            live: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            returned: Notify::new(),
            wake: Arc::new(Notify::new()),
            last_build_error: Mutex::new(None),
        }
    }

    /// The builder's wake-up signal.
    pub fn wake_signal(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Adds an instance made outside the builder (the one `load` configures).
    pub fn adopt(&self, instance: Instance) {
        self.live.fetch_add(1, Ordering::AcqRel);
        self.give_back(instance);
    }

    /// Takes an idle instance, waiting at most `wait` for one.
    pub async fn take(&self, wait: Duration) -> Result<Instance, Fault> {
        if let Some(i) = self.idle.lock().pop() {
            return Ok(i);
        }
        self.wake.notify_one();
        let deadline = Instant::now() + wait;
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Decrement(&self.waiting);
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Some(i) = self.idle.lock().pop() {
                return Ok(i);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, returned).await.is_err() {
                return Err(self.none_free(wait));
            }
        }
    }

    fn none_free(&self, wait: Duration) -> Fault {
        let mut message = format!("no warm instance was free within {} ms", wait.as_millis());
        if let Some(f) = &*self.last_build_error.lock() {
            message += &format!(" (the last instance build failed: {})", f.message);
        }
        Fault::busy(message)
    }

    /// Returns an instance after a successful call.
    pub fn give_back(&self, instance: Instance) {
        {
            let mut idle = self.idle.lock();
            if idle.len() < self.target {
                idle.push(instance);
            } else {
                drop(idle);
                self.live.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.returned.notify_one();
        }
    }

    /// Forgets an instance whose call failed; the builder makes a new one.
    pub fn discard(&self, instance: Instance) {
        drop(instance);
        self.live.fetch_sub(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// Reserves a slot for a new instance if the pool is short of its target.
    pub fn reserve(&self) -> bool {
        self.live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.target).then_some(n + 1)).is_ok()
    }

    /// A reserved slot's build succeeded.
    pub fn built(&self, instance: Instance) {
        *self.last_build_error.lock() = None;
        self.give_back(instance);
    }

    /// A reserved slot's build failed.
    pub fn build_failed(&self, fault: &Fault) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        *self.last_build_error.lock() = Some(fault.clone());
    }

    /// Idle instances now.
    pub fn idle(&self) -> usize {
        self.idle.lock().len()
    }

    /// Instances alive or being built.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// The instances it keeps.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Bytes held by the idle instances.
    pub fn idle_memory_bytes(&self) -> usize {
        self.idle.lock().iter().map(Instance::memory_bytes).sum()
    }
}

struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The next wait after a failed build.
pub fn backoff(previous: Option<Duration>) -> Duration {
    previous.map_or(BACKOFF_MIN, |d| (d * 2).min(BACKOFF_MAX))
}
