//! A plugin's warm instances: taken by calls, given back after them, and
//! replaced in the background — a request never instantiates or configures.
//!
//! Instantiating costs ~15 µs for a Rust guest and milliseconds for Python or
//! JavaScript, and a plugin's `configure` may take as long as it likes; none of
//! that may land on a request. So the pool keeps `target` instances alive and a
//! builder task (on the engine's builder thread) creates a new one whenever one
//! is thrown away (after any failed call). A call that finds every instance busy
//! waits for one to come back — at most its deadline; past that the stage is
//! skipped with cause `busy` (not a failure of the plugin: its breaker does not
//! count it). The message says why: the last build failure if there was one,
//! otherwise how many instances there are and how long the plugin's calls hold
//! one (an average kept per phase), and the remedy — more `instances`, or a
//! faster plugin. Builds that fail back off (50 ms doubling to 30 s), so a
//! plugin whose `configure` keeps failing costs a bounded amount of work.
//!
//! A pool whose calls last longer than a request may wait (a plugin that takes
//! 90 ms with a 25 ms deadline) would otherwise make nearly every request wait
//! the whole deadline for nothing. So once a call has waited its whole deadline
//! in vain the pool is *saturated*, and calls wait at most [`SATURATED_WAIT`]
//! until one finds an instance idle the moment it asks. `/status` shows the
//! flag, the call times and the number of `busy` skips.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Notify;

use super::breaker::Phase;
use super::fault::Fault;
use super::instance::Instance;

/// How long a call waits for an instance while the pool is saturated.
pub const SATURATED_WAIT: Duration = Duration::from_millis(1);

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
    /// The last call that waited found no instance within its wait.
    saturated: AtomicBool,
    /// How long calls of each phase held an instance.
    times: [Average; 2],
}

/// A running average of durations, in nanoseconds (0 until the first sample):
/// the plain mean of the first four samples, then exponentially weighted, ¼
/// per sample, so that it follows a plugin whose calls became slow within a
/// few calls.
#[derive(Default)]
struct Average {
    ns: AtomicU64,
    samples: AtomicU64,
}

impl Average {
    fn add(&self, d: Duration) {
        let x = (d.as_nanos() as u64).max(1) as i64;
        let n = self.samples.fetch_add(1, Ordering::Relaxed).saturating_add(1).min(4) as i64;
        let old = self.ns.load(Ordering::Relaxed) as i64;
        let new = old + (x - old) / n;
        // Racing updates may lose a sample; an average does not mind.
        self.ns.store(new.max(1) as u64, Ordering::Relaxed);
    }

    fn ms(&self) -> Option<f64> {
        let ns = self.ns.load(Ordering::Relaxed);
        (ns > 0).then(|| (ns as f64 / 10_000.0).round() / 100.0)
    }
}

/// How long a plugin's calls hold an instance, on average, by phase (ms;
/// absent until the first call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CallTimes {
    /// `rank` calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<f64>,
    /// `observe` calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observe: Option<f64>,
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
            saturated: AtomicBool::new(false),
            times: Default::default(),
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

    /// Takes an idle instance, waiting at most `wait` for one — or, while the
    /// pool is saturated, at most [`SATURATED_WAIT`].
    pub async fn take(&self, wait: Duration) -> Result<Instance, Fault> {
        if let Some(i) = self.idle.lock().pop() {
            if self.saturated.load(Ordering::Relaxed) {
                self.saturated.store(false, Ordering::Relaxed);
            }
            return Ok(i);
        }
        self.wake.notify_one();
        let wait = if self.saturated.load(Ordering::Relaxed) { wait.min(SATURATED_WAIT) } else { wait };
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
                self.saturated.store(true, Ordering::Relaxed);
                return Err(self.none_free(wait));
            }
        }
    }

    /// Why no instance was free, and what to do about it.
    fn none_free(&self, wait: Duration) -> Fault {
        let mut message = format!("no warm instance was free within {} ms", wait.as_millis());
        if let Some(f) = &*self.last_build_error.lock() {
            message += &format!(" (the last instance build failed: {})", f.message);
            return Fault::busy(message);
        }
        let n = self.target;
        message += &format!(": all {n} of its instances were in use or being rebuilt");
        let t = self.call_times();
        let times: Vec<String> = [("rank", t.rank), ("observe", t.observe)]
            .into_iter()
            .filter_map(|(phase, ms)| {
                let ms = ms?;
                Some(if ms < 0.1 { format!("under 0.1 ms ({phase})") } else { format!("{ms:.1} ms ({phase})") })
            })
            .collect();
        if !times.is_empty() {
            message += &format!(", its calls holding one {} on average", times.join(" and "));
        }
        message += &format!(
            "; raise `[policy] instances` (now {n}) or make the plugin's calls faster{}",
            if wait <= SATURATED_WAIT { " (while the pool stays this busy, calls wait at most 1 ms)" } else { "" }
        );
        Fault::busy(message)
    }

    /// Counts a call of `phase` that held an instance for `held`.
    pub fn record_call(&self, phase: Phase, held: Duration) {
        match phase {
            Phase::Rank => self.times[0].add(held),
            Phase::Observe => self.times[1].add(held),
            Phase::Configure => {}
        }
    }

    /// How long calls hold an instance, on average.
    pub fn call_times(&self) -> CallTimes {
        CallTimes { rank: self.times[0].ms(), observe: self.times[1].ms() }
    }

    /// Whether the last call that waited for an instance found none in time.
    pub fn saturated(&self) -> bool {
        self.saturated.load(Ordering::Relaxed)
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
