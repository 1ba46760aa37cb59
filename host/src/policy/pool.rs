//! A plugin's warm instances: taken by calls, given back after them, and
//! built in the background — a request never instantiates or configures.
//!
//! Instantiating costs ~15 µs for a Rust guest and milliseconds for Python or
//! JavaScript, and a plugin's `configure` may take as long as it likes; none of
//! that may land on a request. So the pool keeps `keep` instances warm
//! (`[policy] instances`) and a builder task (on the engine's builder thread,
//! see [`super::plugin`]) creates new ones.
//!
//! **Demand, not a fixed size.** A call that finds no idle instance queues for
//! one and asks the builder for another, up to `max` alive at once
//! (`[policy] max_instances`). Measured under a burst (docs/benchmarks.md,
//! "Bursts"), 200 streams opening at once take 2–13 instances of a
//! microsecond built-in on two cores: calls that yield at an epoch tick (their
//! thread preempted) move to the call threads ([`super::calls`]) and hold
//! their instance for a few milliseconds. Instances built for a burst stay
//! while it lasts and are trimmed back to `keep` once no call has found the
//! pool short for [`TRIM_AFTER`].
//!
//! **Waiting is fair and fits the budget.** Waiters queue in order and a
//! returned (or newly built) instance is handed straight to the oldest one
//! still waiting, so a late arrival never takes it from under a request that
//! has waited longer. `rank` calls, which a client waits for, come first: an
//! instance goes to a queued `observe` only when no `rank` waits (hundreds of
//! streams ending together must not make the next requests' rankings wait
//! behind their bookkeeping). A `rank` waits at most its deadline. When the pool can
//! grow no more and the measured hold time says the wait cannot end within that
//! deadline (a plugin whose calls take 90 ms, with a 25 ms deadline), the call
//! is skipped as `busy` at once instead of waiting the deadline for nothing —
//! judged from measured call times, not from whether the last wait ran out.
//! `observe` calls, which no client waits for, queue longer
//! ([`OBSERVE_WAIT`]) and at most [`OBSERVE_QUEUE`] at a time; past that they
//! are dropped and counted (`/status`: `observe_queue`).
//!
//! A skip says why: a build that failed, builds running, or the pool at its
//! bound — with how long calls hold an instance, and the remedy that fits what
//! was measured (more `max_instances` when calls are short, a faster plugin
//! when they are long).
//!
//! **Teardown is off the request's thread.** An instance thrown away (its call
//! failed, its request went away, the pool shrinks or the plugin is dropped)
//! holds up to `memory_mb` of mappings; unmapping them is handed to the builder
//! thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};

use super::breaker::Phase;
use super::fault::Fault;
use super::instance::Instance;

mod status;

use status::Average;
pub use status::{CallTimes, PoolStatus};

/// How long an `observe` call may wait in the queue for an instance.
pub const OBSERVE_WAIT: Duration = Duration::from_secs(5);
/// `observe` calls queued for an instance at once, per plugin; more are
/// dropped (and counted). Each holds its request's record (~1 KiB) and a task.
pub const OBSERVE_QUEUE: usize = 4096;
/// Instances above `keep` are trimmed once the pool has not been short for this long.
pub const TRIM_AFTER: Duration = Duration::from_secs(30);

/// First wait after a failed build.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest wait between failed builds.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The instances of one plugin.
pub struct InstancePool {
    queue: Mutex<Queue>,
    keep: usize,
    max: usize,
    /// Instances alive or being built.
    live: AtomicUsize,
    /// Builds running.
    building: AtomicUsize,
    /// Calls waiting for an instance that none has been handed to yet (what
    /// the builder builds for), and `observe` calls waiting.
    waiting: AtomicUsize,
    observe_waiting: AtomicUsize,
    /// `observe` calls dropped: queue full, or no instance within [`OBSERVE_WAIT`].
    observe_dropped: AtomicU64,
    /// The most instances alive at once.
    peak: AtomicUsize,
    /// When a call last found no idle instance (ms since `epoch`).
    last_short_ms: AtomicU64,
    epoch: Instant,
    /// Wakes the builder (shared with it, so it can wait without keeping the
    /// pool alive).
    wake: Arc<Notify>,
    last_build_error: Mutex<Option<Fault>>,
    /// How long calls held an instance: `rank`, `observe`.
    times: [Average; 2],
    /// How long builds take.
    build_time: Average,
    /// The last 64 calls of each phase (`rank`, `observe`), newest in the low
    /// bit: 1 for one whose own time (on a CPU plus waiting) was longer than
    /// a `rank` may wait (see `InstancePool::hopeless`).
    long_holds: [AtomicU64; 2],
    /// Calls in each `long_holds` window (up to 64).
    long_samples: [AtomicU64; 2],
    /// The wait that `long_holds` is judged against (the stage's deadline), ns.
    rank_wait_ns: AtomicU64,
    /// Where thrown-away instances are torn down (the builder thread).
    teardown: Option<tokio::runtime::Handle>,
}

#[derive(Default)]
struct Queue {
    idle: Vec<Instance>,
    /// `rank` calls waiting, oldest first: served before any `observe`.
    ranks: VecDeque<oneshot::Sender<Instance>>,
    /// `observe` calls waiting, oldest first.
    observes: VecDeque<oneshot::Sender<Instance>>,
}

impl Queue {
    /// The queue of calls waiting as `wait` says.
    fn of(&mut self, wait: Wait) -> &mut VecDeque<oneshot::Sender<Instance>> {
        match wait {
            Wait::Rank(_) => &mut self.ranks,
            Wait::Observe => &mut self.observes,
        }
    }
}

/// What a call waits for an instance with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A `rank`: at most this long, and not at all when measured holds say it
    /// would be in vain.
    Rank(Duration),
    /// An `observe`: queued, within the queue's bound and wait.
    Observe,
}

impl InstancePool {
    /// A pool that keeps `keep` instances (at least one) and grows to `max`
    /// (at least `keep`) under demand; `teardown` is where thrown-away
    /// instances are dropped (inline when `None`).
    pub fn new(keep: usize, max: usize, teardown: Option<tokio::runtime::Handle>) -> Self {
        let keep = keep.max(1);
        InstancePool {
            queue: Mutex::default(),
            keep,
            max: max.max(keep),
            live: AtomicUsize::new(0),
            building: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            observe_waiting: AtomicUsize::new(0),
            observe_dropped: AtomicU64::new(0),
            peak: AtomicUsize::new(0),
            last_short_ms: AtomicU64::new(0),
            epoch: crate::clock::machine_instant(),
            wake: Arc::new(Notify::new()),
            last_build_error: Mutex::new(None),
            times: Default::default(),
            build_time: Average::default(),
            long_holds: Default::default(),
            long_samples: Default::default(),
            rank_wait_ns: AtomicU64::new(0),
            teardown,
        }
    }

    /// The builder's wake-up signal.
    pub fn wake_signal(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Adds an instance made outside the builder (the one `load` configures).
    pub fn adopt(&self, instance: Instance) {
        let live = self.live.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(live, Ordering::Relaxed);
        self.give_back(instance);
    }

    /// Takes an idle instance, or waits for one as `wait` says.
    pub async fn take(&self, wait: Wait) -> Result<Instance, Fault> {
        let (rx, _observing) = {
            let mut q = self.queue.lock();
            if let Some(i) = q.idle.pop() {
                return Ok(i);
            }
            if let Wait::Rank(limit) = wait
                && let Some(expected) = self.hopeless(q.ranks.len(), limit)
            {
                drop(q);
                return Err(self.none_free(limit, Some(expected)));
            }
            // Checked and counted under the lock, so that calls arriving
            // together cannot pass the bound between the two.
            if wait == Wait::Observe && self.observe_waiting.load(Ordering::Acquire) >= OBSERVE_QUEUE {
                drop(q);
                self.observe_dropped.fetch_add(1, Ordering::Relaxed);
                return Err(Fault::busy(format!(
                    "dropped: {OBSERVE_QUEUE} observe calls were already queued for an instance (the queue's bound); {}",
                    self.remedy(None)
                )));
            }
            let observing = (wait == Wait::Observe).then(|| Count::new(&self.observe_waiting));
            let waiters = q.of(wait);
            if waiters.len() >= 32 && waiters.len().is_power_of_two() {
                // Waiters that gave up leave closed senders behind.
                waiters.retain(|w| !w.is_closed());
            }
            let (tx, rx) = oneshot::channel();
            waiters.push_back(tx);
            // Counted under the lock, so that `give_back` never uncounts it first.
            self.waiting.fetch_add(1, Ordering::AcqRel);
            (Waiter { pool: self, rx: Some(rx) }, observing)
        };
        self.last_short_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.wake.notify_one();
        let limit = match wait {
            Wait::Rank(d) => d,
            Wait::Observe => OBSERVE_WAIT,
        };
        let mut waiter = rx;
        // Boxed: a timer is made only for a call that waits, and every call's
        // future (which the plugin call threads box) stays small.
        let waited = Box::pin(tokio::time::timeout(limit, waiter.rx.as_mut().expect("a waiter holds its receiver")));
        match waited.await {
            Ok(Ok(i)) => {
                waiter.rx = None;
                Ok(i)
            }
            Ok(Err(_)) | Err(_) => {
                // One may have been handed over just as the wait ran out.
                if let Some(i) = waiter.leave() {
                    return Ok(i);
                }
                if wait == Wait::Observe {
                    self.observe_dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(self.none_free(limit, None))
            }
        }
    }

    /// Whether waiting `limit` is in vain: the pool cannot grow, most of the
    /// last (up to) 64 calls of a phase — four at least — took longer than
    /// `limit` of the plugin's own time (that phase's calls are slow, not
    /// merely set aside by a busy executor: a microsecond call that yields can
    /// wait behind the executor's whole queue, holding its instance), and its
    /// mean hold says the wait would be longer. The expected wait, if so.
    fn hopeless(&self, ahead: usize, limit: Duration) -> Option<Duration> {
        self.rank_wait_ns.store(limit.as_nanos() as u64, Ordering::Relaxed);
        let live = self.live.load(Ordering::Acquire);
        if live < self.max || live == 0 {
            return None;
        }
        (0..2)
            .filter(|&p| self.slow_phase(p))
            .filter_map(|p| Some(self.times[p].get()?.mul_f64((ahead + 1) as f64 / live as f64)))
            .find(|expected| *expected > limit)
    }

    /// Whether most of the last (up to) 64 calls of phase `p` (0: `rank`,
    /// 1: `observe`) — four at least — took longer than a `rank` may wait, in
    /// the plugin's own time.
    fn slow_phase(&self, p: usize) -> bool {
        let n = self.long_samples[p].load(Ordering::Relaxed);
        n >= 4 && u64::from(self.long_holds[p].load(Ordering::Relaxed).count_ones()) * 2 > n
    }

    /// Whether the plugin's calls are slow in either phase (the remedy that
    /// fits is then a faster plugin, not more instances).
    fn slow(&self) -> bool {
        self.slow_phase(0) || self.slow_phase(1)
    }

    /// Why no instance was free, and what to do about it.
    fn none_free(&self, wait: Duration, expected: Option<Duration>) -> Fault {
        let mut message = match expected {
            Some(e) => format!(
                "no warm instance was free, and none would be within {} ms (expected wait {:.1} ms)",
                wait.as_millis(),
                e.as_secs_f64() * 1000.0
            ),
            None => format!("no warm instance was free within {} ms", wait.as_millis()),
        };
        if let Some(f) = &*self.last_build_error.lock() {
            message += &format!(" (the last instance build failed: {})", f.message);
            return Fault::busy(message);
        }
        let s = self.status();
        message += &format!(": {} of {} instances (at most {}) in use", s.live - s.building, s.live, self.max);
        if s.building > 0 {
            let build =
                self.build_time.ms().map(|ms| format!(", a build taking {ms:.1} ms on average")).unwrap_or_default();
            message += &format!(", {} being built{build}", s.building);
        }
        message += &format!("; {}", self.remedy(Some(wait)));
        Fault::busy(message)
    }

    /// The remedy that fits what was measured: with calls shorter than the
    /// wait, more instances; with calls longer, a faster plugin.
    fn remedy(&self, wait: Option<Duration>) -> String {
        let t = self.call_times();
        let times: Vec<String> = [("rank", t.rank), ("observe", t.observe)]
            .into_iter()
            .filter_map(|(phase, ms)| {
                let ms = ms?;
                Some(if ms < 0.1 { format!("under 0.1 ms ({phase})") } else { format!("{ms:.1} ms ({phase})") })
            })
            .collect();
        let held = if times.is_empty() {
            String::new()
        } else {
            format!("its calls hold an instance {} on average; ", times.join(" and "))
        };
        // Long by the measure the pool skips and stops growing by: most recent
        // calls of a phase held longer than the wait (a mean over both phases
        // would hide a slow `observe` behind microsecond `rank`s).
        let long = wait.is_some() && self.slow();
        if long {
            format!(
                "{held}calls longer than the wait cannot be absorbed by more instances for long: make the plugin's \
                 calls faster (or raise `[policy] max_instances`, now {})",
                self.max
            )
        } else {
            format!("{held}raise `[policy] max_instances` (now {}) or make the plugin's calls faster", self.max)
        }
    }

    /// Counts a call of `phase` that held an instance for `held`, of which
    /// `own` was the plugin's own time (on a CPU plus waiting). A call is
    /// judged long by its own time: a microsecond call that yielded and then
    /// sat behind a busy executor's queue held its instance long, but another
    /// instance serves the next call sooner, so it is no reason to give up
    /// waiting (see `InstancePool::hopeless`).
    pub fn record_call(&self, phase: Phase, held: Duration, own: Duration) {
        match phase {
            Phase::Rank => self.times[0].add(held),
            Phase::Observe => self.times[1].add(held),
            Phase::Configure => return,
        }
        let wait = self.rank_wait_ns.load(Ordering::Relaxed);
        let long = wait > 0 && own.as_nanos() as u64 > wait;
        let slot = if phase == Phase::Rank { 0 } else { 1 };
        if wait > 0 {
            let _ = self.long_holds[slot]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some((b << 1) | long as u64));
            if self.long_samples[slot].load(Ordering::Relaxed) < 64 {
                self.long_samples[slot].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// How long calls hold an instance, and builds take, on average.
    pub fn call_times(&self) -> CallTimes {
        CallTimes { rank: self.times[0].ms(), observe: self.times[1].ms(), build: self.build_time.ms() }
    }

    /// Returns an instance after a successful call: to the oldest waiting
    /// `rank`, else the oldest waiting `observe`, else the idle list.
    pub fn give_back(&self, instance: Instance) {
        let mut q = self.queue.lock();
        let mut instance = instance;
        let Queue { ranks, observes, .. } = &mut *q;
        while let Some(w) = ranks.pop_front().or_else(|| observes.pop_front()) {
            match w.send(instance) {
                Ok(()) => {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                Err(back) => instance = back,
            }
        }
        q.idle.push(instance);
    }

    /// Forgets an instance whose call failed; the builder makes a new one.
    pub fn discard(&self, instance: Instance) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        self.bury(instance);
        self.wake.notify_one();
    }

    /// Drops `instance` off the caller's thread.
    fn bury(&self, instance: Instance) {
        match &self.teardown {
            Some(h) => drop(h.spawn(async move { drop(instance) })),
            None => drop(instance),
        }
    }

    /// Reserves a slot for a new instance if the pool is short of `keep`, or
    /// calls wait that no running build will serve and it may grow (up to
    /// `max`). The
    /// caller must then report [`InstancePool::built`] or
    /// [`InstancePool::build_failed`].
    pub fn reserve(&self) -> bool {
        let waiting = self.waiting.load(Ordering::Acquire);
        let building = self.building.load(Ordering::Acquire);
        let grow = waiting > building;
        let reserved = self
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.keep || (grow && n < self.max)).then_some(n + 1)
            })
            .ok();
        let Some(before) = reserved else { return false };
        self.building.fetch_add(1, Ordering::AcqRel);
        self.peak.fetch_max(before + 1, Ordering::Relaxed);
        true
    }

    /// A reserved slot's build succeeded after `took`.
    pub fn built(&self, instance: Instance, took: Duration) {
        self.building.fetch_sub(1, Ordering::AcqRel);
        self.build_time.add(took);
        *self.last_build_error.lock() = None;
        self.give_back(instance);
    }

    /// A reserved slot's build failed.
    pub fn build_failed(&self, fault: &Fault) {
        self.building.fetch_sub(1, Ordering::AcqRel);
        self.live.fetch_sub(1, Ordering::AcqRel);
        *self.last_build_error.lock() = Some(fault.clone());
    }

    /// Drops idle instances above `keep` once the pool has not been short for
    /// [`TRIM_AFTER`]; how many went. Called by the builder.
    pub fn trim(&self) -> usize {
        let short = Duration::from_millis(self.last_short_ms.load(Ordering::Relaxed));
        if self.epoch.elapsed().saturating_sub(short) < TRIM_AFTER {
            return 0;
        }
        let extra: Vec<Instance> = {
            let mut q = self.queue.lock();
            let over = self.live.load(Ordering::Acquire).saturating_sub(self.keep).min(q.idle.len());
            let at = q.idle.len() - over;
            q.idle.split_off(at)
        };
        let n = extra.len();
        self.live.fetch_sub(n, Ordering::AcqRel);
        extra.into_iter().for_each(|i| self.bury(i));
        n
    }

    /// Whether instances above `keep` are alive (the builder then checks
    /// [`InstancePool::trim`] now and then).
    pub fn above_keep(&self) -> bool {
        self.live.load(Ordering::Acquire) > self.keep
    }

    /// Idle instances now.
    pub fn idle(&self) -> usize {
        self.queue.lock().idle.len()
    }

    /// Instances alive or being built.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// The instances it keeps warm.
    pub fn target(&self) -> usize {
        self.keep
    }

    /// Size and queue, for `/status`.
    ///
    /// The counters move separately (a reservation raises `live` before
    /// `building`, a failed build lowers them the other way round), so a
    /// snapshot can catch more being built than alive: it is clamped, never
    /// a count that subtracts below zero.
    pub fn status(&self) -> PoolStatus {
        let live = self.live.load(Ordering::Acquire);
        PoolStatus {
            keep: self.keep,
            max: self.max,
            live,
            idle: self.idle(),
            building: self.building.load(Ordering::Acquire).min(live),
            peak: self.peak.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Acquire),
            observe_queued: self.observe_waiting.load(Ordering::Acquire),
            observe_queue_bound: OBSERVE_QUEUE,
            observe_dropped: self.observe_dropped.load(Ordering::Relaxed),
        }
    }

    /// Bytes held by the idle instances.
    pub fn idle_memory_bytes(&self) -> usize {
        self.queue.lock().idle.iter().map(Instance::memory_bytes).sum()
    }
}

impl Drop for InstancePool {
    fn drop(&mut self) {
        // The last reference may go on a request's thread (the last request of
        // a swapped-out chain): the instances are unmapped elsewhere.
        let idle = std::mem::take(&mut self.queue.get_mut().idle);
        idle.into_iter().for_each(|i| self.bury(i));
    }
}

/// A call's place in the queue. However the call ends — served, out of
/// time, or dropped because its request went away — an instance handed to it
/// is never lost, and it is uncounted from `waiting` exactly once.
struct Waiter<'a> {
    pool: &'a InstancePool,
    /// `None` once served.
    rx: Option<oneshot::Receiver<Instance>>,
}

impl Waiter<'_> {
    /// Leaves the queue: the instance handed over as it left, if any (the
    /// sender then uncounted it); otherwise it uncounts itself.
    fn leave(&mut self) -> Option<Instance> {
        let mut rx = self.rx.take()?;
        rx.close();
        match rx.try_recv() {
            Ok(i) => Some(i),
            Err(_) => {
                self.pool.waiting.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        // Dropped mid-wait (its request went away): an instance already handed
        // over goes on to the next call instead of vanishing uncounted.
        if let Some(i) = self.leave() {
            self.pool.give_back(i);
        }
    }
}

/// Counts a waiting call for as long as it lives.
struct Count<'a>(&'a AtomicUsize);

impl<'a> Count<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Count(n)
    }
}

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The next wait after a failed build.
pub fn backoff(previous: Option<Duration>) -> Duration {
    previous.map_or(BACKOFF_MIN, |d| (d * 2).min(BACKOFF_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot taken while builds are reserved and fail never counts more
    /// being built than alive: the "no instance free" message subtracts one
    /// from the other (a debug build panicked on it under a burst of traps).
    #[test]
    fn a_snapshot_never_counts_more_building_than_alive() {
        let pool = Arc::new(InstancePool::new(1, 4, None));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if pool.reserve() {
                        pool.build_failed(&Fault::busy("test"));
                    }
                }
            })
        };
        for _ in 0..200_000 {
            let s = pool.status();
            assert!(s.building <= s.live, "{} building of {} alive", s.building, s.live);
            let _ = pool.none_free(Duration::from_millis(1), None);
        }
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
    }
}
