//! The outer bounds of one call into a plugin: one wall-clock budget that sums
//! every wait, a hard cap no yield extends, and a net for panics.
//!
//! The CPU budget is fuel, counted by the guest's own instructions (see
//! [`super::engine`]), so it neither fires for a thread the scheduler set aside
//! nor stretches when the machine is saturated. What fuel cannot see is time
//! the call spends in host calls (a loop of `log` or WASI calls burns almost no
//! fuel) and time it spends waiting (a WASI sleep, a slow host call). Those are
//! bounded here, on the call's **own time**, summed over the whole call:
//!
//! - **running**: the CPU time its thread spends while its future is polled —
//!   running the guest or its host calls (the thread's own CPU clock, so a
//!   thread the kernel preempted mid-poll is not charged for the wait; where
//!   the platform has no such clock, or the poll was shorter than
//!   [`CPU_CHECK`], the wall time of the poll);
//! - **waiting**: the time from a poll that left it pending on something (a
//!   timer, I/O) until that something woke it.
//!
//! Their sum may not pass [`Limit::own`]: a call made of 200 ms sleeps is cut
//! when the sleeps add up to its budget, however short each one is. (Until
//! #22, each wait was timed on its own and re-armed at every pending poll, so
//! such a call was never cut.)
//!
//! What is **not** the plugin's time is the time a call that *yielded* spends
//! queued for a thread: on a saturated machine that says nothing about the
//! plugin. The runtime tells the two kinds of pending apart: a yield wakes its
//! own waker during the poll (wasmtime's fuel yield does `wake_by_ref`, then
//! returns pending) or goes through [`yield_now`] (the epoch yield, which hands
//! its waker to tokio to be woken once the worker has polled its I/O); any
//! other pending is a wait. A waker wrapper records when the call is woken, so
//! that after a wait only the time until the wake counts, not the time the
//! woken call then sat in the run queue.
//!
//! Queue time is still bounded: a **hard cap** ([`Limit::cap`], counted from
//! the first poll, everything included) that no pattern of yields extends, so
//! a starved call — a thread preempted for long, a host call that keeps
//! re-waking itself or blocks its thread off the CPU — ends too.
//!
//! One timer covers both, armed only while the call really waits: at the
//! earlier of (the start of the wait + what is left of the budget) and the cap.
//! A call that finishes in one poll — the common case, microseconds — costs two
//! wall-clock reads, one thread-CPU-clock read (a system call, well under a
//! microsecond), no allocation (its first poll's waker is a `Probe` on the
//! stack) and no timer.
//!
//! The arithmetic ([`Limit::for_deadline`]): the plugin's own time gets the
//! configured deadline plus [`slack`] — max(20 ms, a quarter of the deadline)
//! — and the hard cap is [`CAP_FACTOR`] times that plus [`CAP_SLACK`]. The
//! fixed 20 ms covers the 1 ms granularity of the epoch and the timer and the
//! host's own work around a call (lowering, stdio); the quarter covers a
//! machine slower than the one fuel is calibrated on, for long budgets
//! (`configure`). The cap's 4× lets up to four calls share one thread fairly
//! (the builder thread interleaves the builds of every plugin) before queueing
//! alone cuts a call, and its 100 ms the kernel holding a preempted thread for
//! tens of ms on a saturated machine (23 ms in one poll was measured, two
//! cores, load 10): a fast plugin is not cut for the machine's load.
//!
//! A panic anywhere under the call — in a host function, in wasmtime, in WASI —
//! is caught here and becomes a fault with cause `host`: the request is served
//! without the stage, and the instance the call ran on is thrown away.

use std::cell::Cell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

/// The least slack a budget gets over its deadline (see the module docs).
pub const MIN_SLACK: Duration = Duration::from_millis(20);
/// The hard cap of a call, as a multiple of its own-time budget ...
pub const CAP_FACTOR: u32 = 4;
/// ... plus this much.
pub const CAP_SLACK: Duration = Duration::from_millis(100);
/// A poll shorter than this is taken as all on a CPU, without a second read
/// of the thread's CPU clock (see [`Bounded`]).
pub const CPU_CHECK: Duration = Duration::from_micros(200);
/// A build's hard cap is twice its configure deadline plus this much.
pub const CONFIGURE_CAP_SLACK: Duration = Duration::from_secs(2);

/// The slack a deadline of `deadline` gets: max([`MIN_SLACK`], a quarter of it).
pub fn slack(deadline: Duration) -> Duration {
    MIN_SLACK.max(deadline / 4)
}

/// The wall-clock limits of one call (or one build: instantiation and
/// `configure` together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The most of its own time — running plus waiting — the call may use.
    pub own: Duration,
    /// The most time from its first poll to its end, time queued for a thread
    /// included.
    pub cap: Duration,
}

impl Limit {
    /// The limits of a call whose configured deadline is `deadline`: own time
    /// `deadline + slack(deadline)`, hard cap [`CAP_FACTOR`] times that plus
    /// [`CAP_SLACK`].
    pub fn for_deadline(deadline: Duration) -> Limit {
        let own = deadline + slack(deadline);
        Limit { own, cap: own * CAP_FACTOR + CAP_SLACK }
    }

    /// The limits of building an instance (instantiation and `configure`)
    /// with a configure deadline of `deadline`: the same own time, and a hard
    /// cap of twice the deadline plus [`CONFIGURE_CAP_SLACK`] — the bound a
    /// start or reload gives a stage's `configure` too, so one hanging build
    /// is cut at one time whoever built it. (Four times the own time would be
    /// 25 s at the default; builds do not share a thread four ways: see
    /// [`super::engine::REFILL_BUILDS`].)
    pub fn for_configure(deadline: Duration) -> Limit {
        let own = deadline + slack(deadline);
        Limit { own, cap: (deadline * 2 + CONFIGURE_CAP_SLACK).max(own) }
    }
}

/// Where a call's time went, as measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// From its first poll until now (or its end).
    pub total: Duration,
    /// Being polled (wall clock): running the guest or its host calls, or
    /// preempted meanwhile.
    pub running: Duration,
    /// Of `running`, what its thread spent on a CPU; the rest it was preempted
    /// by other work on the machine (or blocked in a host call). Measured where
    /// the platform has a per-thread CPU clock; else equal to `running`.
    pub on_cpu: Duration,
    /// Pending on something other than a yield (a sleep, I/O), until woken.
    pub waited: Duration,
}

impl Spent {
    /// The plugin's own time: on a CPU plus waiting.
    pub fn own(&self) -> Duration {
        self.on_cpu + self.waited
    }

    /// Time queued for a thread after yielding or being woken.
    pub fn queued(&self) -> Duration {
        self.total.saturating_sub(self.running + self.waited)
    }

    /// Time its thread was preempted while the call was being polled.
    pub fn preempted(&self) -> Duration {
        self.running.saturating_sub(self.on_cpu)
    }
}

/// Why a bounded call did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// Its own time (running plus waiting) reached [`Limit::own`].
    OverBudget(Spent),
    /// [`Limit::cap`] passed since its first poll, most of it queued.
    OverCap(Spent),
    /// Something under it panicked; the panic's message.
    Panicked(String),
}

/// Why a call is pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// It yielded: the time until its next poll is the scheduler's.
    Yielded,
    /// It waits on something (a timer, I/O): the time until it is woken is its own.
    Waiting,
}

/// The ledger of one call's time: plain data, time passed in. Shared by the
/// futures of one budget (a build's instantiation and `configure`).
#[derive(Debug, Clone)]
pub struct Tally {
    limit: Limit,
    first: Option<Instant>,
    spent: Spent,
    pause: Option<(Pause, Instant)>,
}

impl Tally {
    /// A ledger with nothing spent yet.
    pub fn new(limit: Limit) -> Tally {
        Tally { limit, first: None, spent: Spent::default(), pause: None }
    }

    /// The limits it holds the call to.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// A poll starts at `now`; `woken` is when the call was woken since it
    /// paused, if it was. A wait counts until the wake, never past `now`.
    /// Whether the call had been polled before (a first poll has spent
    /// nothing, and needs no look at its limits).
    pub fn resume(&mut self, now: Instant, woken: Option<Instant>) -> bool {
        let Some(first) = self.first else {
            self.first = Some(now);
            return false;
        };
        if let Some((Pause::Waiting, since)) = self.pause.take() {
            let end = woken.map_or(now, |w| w.clamp(since, now));
            self.spent.waited += end.saturating_duration_since(since);
        }
        self.pause = None;
        self.spent.total = now.saturating_duration_since(first);
        true
    }

    /// The call ended at `now` (its last poll returned there).
    pub fn end(&mut self, now: Instant) {
        if let Some(first) = self.first {
            self.spent.total = now.saturating_duration_since(first);
        }
    }

    /// The time spent as of the call's last poll: after the call, what it
    /// spent, without reading the clock again.
    pub fn settled(&self) -> Spent {
        self.spent
    }

    /// A poll ran for `wall`, its thread on a CPU for `cpu` of it (`None`: not
    /// measured, taken as all of it).
    pub fn ran(&mut self, wall: Duration, cpu: Option<Duration>) {
        self.spent.running += wall;
        self.spent.on_cpu += cpu.map_or(wall, |c| c.min(wall));
    }

    /// The call went pending at `now`, for `why`.
    pub fn pause(&mut self, now: Instant, why: Pause) {
        let first = *self.first.get_or_insert(now);
        self.spent.total = now.saturating_duration_since(first);
        self.pause = Some((why, now));
    }

    /// The time spent as seen at `now`: a wait in progress counts up to `now`.
    pub fn spent(&self, now: Instant) -> Spent {
        let mut spent = self.spent;
        if let Some(first) = self.first {
            spent.total = now.saturating_duration_since(first);
        }
        if let Some((Pause::Waiting, since)) = self.pause {
            spent.waited += now.saturating_duration_since(since);
        }
        spent
    }

    /// The cut due at `now`, if the call is past either limit.
    pub fn over(&self, now: Instant) -> Option<Cut> {
        let spent = self.spent(now);
        if spent.own() >= self.limit.own {
            Some(Cut::OverBudget(spent))
        } else if spent.total >= self.limit.cap {
            Some(Cut::OverCap(spent))
        } else {
            None
        }
    }

    /// When the call must be woken to be cut if nothing wakes it sooner: while
    /// it waits, when its budget runs out or the cap passes, whichever is
    /// first. A yielded call comes back by itself, and needs no timer.
    pub fn wake_at(&self) -> Option<Instant> {
        let (Some(first), Some((Pause::Waiting, since))) = (self.first, self.pause) else { return None };
        let left = self.limit.own.saturating_sub(self.spent.own());
        Some((since + left).min(first + self.limit.cap))
    }
}

thread_local! {
    /// Set by [`yield_now`] when it leaves the call pending: read (and reset)
    /// by the [`Bounded`] polling it, on the same thread.
    static YIELDED: Cell<bool> = const { Cell::new(false) };
}

/// Yields to the executor through tokio's own yield (which lets the worker
/// poll its I/O before the call resumes), marked as a yield so that the
/// [`Bounded`] call around it does not count the time until it resumes as the
/// plugin's. tokio defers the wake until after the poll, so the waker alone
/// cannot tell this yield from a wait.
pub async fn yield_now() {
    YIELDED.set(true);
    tokio::task::yield_now().await;
}

/// The waker a bounded call's future gets: records when it is woken, then
/// wakes the task.
struct Watch {
    state: parking_lot::Mutex<Watched>,
}

struct Watched {
    waker: Waker,
    woken: Option<Instant>,
}

impl Watch {
    fn new(waker: Waker) -> Arc<Watch> {
        Arc::new(Watch { state: parking_lot::Mutex::new(Watched { waker, woken: None }) })
    }

    /// A poll starts: the task's current waker, and when the call was woken
    /// since the last poll (cleared).
    fn begin(&self, waker: &Waker) -> Option<Instant> {
        let mut s = self.state.lock();
        if !s.waker.will_wake(waker) {
            s.waker = waker.clone();
        }
        s.woken.take()
    }

    fn woken(&self) -> bool {
        self.state.lock().woken.is_some()
    }
}

impl Wake for Watch {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waker = {
            let mut s = self.state.lock();
            s.woken.get_or_insert_with(Instant::now);
            s.waker.clone()
        };
        waker.wake();
    }
}

/// The waker of a call's first poll, which is nearly always its only one: it
/// tells whether the call woke itself during the poll (a yield) without
/// allocating. Only if the call keeps a waker — clones it, to be woken later —
/// is a [`Watch`] made, and the clone is the `Watch`'s.
///
/// It lives on the stack of [`Bounded::poll`] and is handed out only as the
/// `&Waker` of that poll's `Context`, which cannot outlive the poll; every
/// waker that can is a clone, which holds the `Watch`, not the probe.
struct Probe<'a> {
    task: &'a Waker,
    woke: AtomicBool,
    watch: OnceLock<Arc<Watch>>,
}

// A waker may be woken from any thread while the poll that lent it runs.
const _: () = {
    const fn sync<T: Sync>() {}
    sync::<Probe<'static>>();
};

impl<'a> Probe<'a> {
    const VTABLE: RawWakerVTable =
        RawWakerVTable::new(Self::clone_raw, Self::wake_raw, Self::wake_by_ref_raw, Self::drop_raw);

    fn new(task: &'a Waker) -> Self {
        Probe { task, woke: AtomicBool::new(false), watch: OnceLock::new() }
    }

    /// A waker pointing at the probe: valid only while the probe lives.
    fn waker(&self) -> std::mem::ManuallyDrop<Waker> {
        let raw = RawWaker::new(std::ptr::from_ref(self).cast(), &Self::VTABLE);
        // SAFETY: the vtable's functions uphold `RawWaker`'s contract for a
        // pointer to a live `Probe` (which `Bounded::poll` guarantees by
        // dropping the probe only after the poll that uses the waker), and
        // the probe is `Sync`: it may be woken from any thread meanwhile.
        std::mem::ManuallyDrop::new(unsafe { Waker::from_raw(raw) })
    }

    /// # Safety
    /// `p` points at a live `Probe`.
    unsafe fn get<'p>(p: *const ()) -> &'p Probe<'p> {
        // SAFETY: as the caller promises.
        unsafe { &*p.cast::<Probe<'p>>() }
    }

    unsafe fn clone_raw(p: *const ()) -> RawWaker {
        // SAFETY: wakers of the probe exist only while it lives.
        let probe = unsafe { Self::get(p) };
        let watch = probe.watch.get_or_init(|| Watch::new(probe.task.clone())).clone();
        let waker = std::mem::ManuallyDrop::new(Waker::from(watch));
        RawWaker::new(waker.data(), waker.vtable())
    }

    unsafe fn wake_by_ref_raw(p: *const ()) {
        // SAFETY: as in `clone_raw`.
        let probe = unsafe { Self::get(p) };
        probe.woke.store(true, Ordering::Release);
        probe.task.wake_by_ref();
    }

    unsafe fn wake_raw(p: *const ()) {
        // SAFETY: as in `clone_raw`; a by-value wake of the probe owns nothing.
        unsafe { Self::wake_by_ref_raw(p) }
    }

    unsafe fn drop_raw(_: *const ()) {}
}

/// The CPU time of the calling thread.
#[cfg(unix)]
fn thread_cpu() -> Option<Duration> {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec`, which `t` is.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    ok.then(|| Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

#[cfg(not(unix))]
fn thread_cpu() -> Option<Duration> {
    None
}

pin_project! {
    /// `inner`, cut short once its own time or its total passes the limits of
    /// `tally`, with panics caught.
    pub struct Bounded<'t, F> {
        #[pin]
        inner: F,
        tally: &'t mut Tally,
        watch: Option<(Arc<Watch>, Waker)>,
        armed: Option<Instant>,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<'t, F: Future> Bounded<'t, F> {
    /// Bounds `inner` by what is left of `tally`'s limits; what it spends is
    /// added to `tally`.
    pub fn new(inner: F, tally: &'t mut Tally) -> Self {
        Bounded { inner, tally, watch: None, armed: None, timer: None }
    }
}

impl<F: Future> Future for Bounded<'_, F> {
    type Output = Result<F::Output, Cut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let now = Instant::now();
        let woken = this.watch.as_ref().and_then(|(watch, _)| watch.begin(cx.waker()));
        if this.tally.resume(now, woken)
            && let Some(cut) = this.tally.over(now)
        {
            return Poll::Ready(Err(cut));
        }
        let cpu_before = thread_cpu();
        let outer_yield = YIELDED.replace(false);
        let (polled, woke_itself) = match &*this.watch {
            Some((_, waker)) => {
                (catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll(&mut Context::from_waker(waker)))), false)
            }
            None => {
                let probe = Probe::new(cx.waker());
                let waker = probe.waker();
                let polled =
                    catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll(&mut Context::from_waker(&waker))));
                if let Some(watch) = probe.watch.get() {
                    *this.watch = Some((watch.clone(), Waker::from(watch.clone())));
                }
                (polled, probe.woke.load(Ordering::Acquire))
            }
        };
        let yielded = YIELDED.replace(outer_yield);
        let after = Instant::now();
        let wall = after.saturating_duration_since(now);
        // A short poll is taken as all on a CPU (an error of at most
        // `CPU_CHECK`, against the plugin): the common microsecond call reads
        // the thread's CPU clock once.
        let cpu = if wall < CPU_CHECK { None } else { cpu_before.and_then(|b| Some(thread_cpu()?.saturating_sub(b))) };
        this.tally.ran(wall, cpu);
        match polled {
            Ok(Poll::Ready(v)) => {
                this.tally.end(after);
                return Poll::Ready(Ok(v));
            }
            Ok(Poll::Pending) => {}
            Err(payload) => return Poll::Ready(Err(Cut::Panicked(panic_message(payload.as_ref())))),
        }
        let woke_itself = woke_itself || yielded || this.watch.as_ref().is_some_and(|(watch, _)| watch.woken());
        let why = if woke_itself { Pause::Yielded } else { Pause::Waiting };
        this.tally.pause(after, why);
        if let Some(cut) = this.tally.over(after) {
            return Poll::Ready(Err(cut));
        }
        let Some(at) = this.tally.wake_at() else { return Poll::Pending };
        if *this.armed != Some(at) {
            *this.armed = Some(at);
            // Boxed: made only for a call that waits, it keeps the call's
            // future (which the plugin call threads box) small.
            match this.timer {
                Some(timer) => timer.as_mut().reset(at),
                None => *this.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        if let Some(timer) = this.timer
            && timer.as_mut().poll(cx).is_ready()
        {
            // Due within the timer's granularity: look again at once.
            cx.waker().wake_by_ref();
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
mod tests;
