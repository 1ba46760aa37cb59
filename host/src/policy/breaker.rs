//! A per-stage circuit breaker: after repeated failures the stage is bypassed (its
//! input passes through, and it is not asked to observe) for a cool-off that
//! doubles on every trip, then one request probes it again.
//!
//! Failures are counted per phase — `rank`, `observe`, and the building of new
//! instances (`configure`) — over the last `2 × failures` calls of that phase,
//! and a phase with `failures` failures among them opens the breaker: five in a
//! row do, and so does a stage that fails every other call, which counting only
//! failures in a row would never catch. Counting phases apart matters too: a
//! stage whose `observe` always traps while its `rank` works would otherwise
//! have its count reset on every request.
//!
//! Under concurrency, calls admitted before the breaker opened finish after it
//! did. Only the probe's result may close or reopen it: each admission carries a
//! [`Ticket`], and a result whose ticket belongs to an earlier state is ignored —
//! a late failure does not stretch the cool-off, a late success does not close
//! it.
//!
//! A probe's ticket releases itself whatever happens to the call. A probe that
//! never reaches the plugin — every instance was busy (a `busy` skip, not the
//! plugin's fault), or its request went away mid-call (the future was dropped)
//! — hands the probe back when the ticket is dropped: nothing is counted, and
//! the next request probes instead. Without that the breaker would stay
//! half-open with a probe that never reports, bypassing a healthy stage until
//! the next reload.
//!
//! The window of `2 × failures` calls is sized from `failures` (up to
//! [`MAX_FAILURES`], the range the config accepts), so any `failures` the
//! operator sets can be reached: a window capped below it would disable the
//! breaker without a word.
//!
//! Time is the request's `now-ms`, like everything else the chain decides on.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

/// The most `failures` a breaker counts to (`[policy.breaker] failures`
/// accepts 0 to this): a window of `2 ×` this many calls, 2.5 KiB per phase.
pub const MAX_FAILURES: u32 = 10_000;

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failures (of one phase, among its last `2 ×` this many calls) that open
    /// the breaker (0 disables it; more than [`MAX_FAILURES`] counts as that).
    pub failures: u32,
    /// First cool-off.
    pub cooldown_ms: u64,
    /// Longest cool-off, however often the stage keeps failing.
    pub max_cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig { failures: 5, cooldown_ms: 30_000, max_cooldown_ms: 300_000 }
    }
}

/// What a stage was doing when it succeeded or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Ordering a request's candidates.
    Rank,
    /// Hearing how a request ended.
    Observe,
    /// Instantiating and configuring a new instance.
    Configure,
}

impl Phase {
    /// The name used in records, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Rank => "rank",
            Phase::Observe => "observe",
            Phase::Configure => "configure",
        }
    }

    /// Every phase, for metrics that want a zero for each.
    pub const ALL: [Phase; 3] = [Phase::Rank, Phase::Observe, Phase::Configure];

    fn slot(self) -> usize {
        self as usize
    }
}

/// The last calls of one phase: a ring of one bit per call, 1 for a failure,
/// with the failures among them and the current run of failures counted as
/// calls come in (so `failures` and `in_a_row` cost nothing to read).
#[derive(Debug, Default, Clone)]
struct Window {
    /// The ring; allocated at the first call recorded, `size` bits.
    bits: Vec<u64>,
    /// Where the next call goes.
    next: usize,
    /// Calls held (at most the window's size).
    len: u32,
    failures: u32,
    in_a_row: u32,
}

impl Window {
    fn push(&mut self, failed: bool, size: u32) {
        let size = size.max(1) as usize;
        if self.bits.len() * 64 < size {
            self.bits = vec![0; size.div_ceil(64)];
            (self.next, self.len, self.failures) = (0, 0, 0);
        }
        let (word, bit) = (self.next / 64, self.next % 64);
        if self.len as usize >= size {
            // Full: the oldest call, at `next`, leaves the window.
            self.failures -= ((self.bits[word] >> bit) & 1) as u32;
        } else {
            self.len += 1;
        }
        if failed {
            self.bits[word] |= 1 << bit;
            self.failures += 1;
            self.in_a_row = self.in_a_row.saturating_add(1);
        } else {
            self.bits[word] &= !(1 << bit);
            self.in_a_row = 0;
        }
        self.next = (self.next + 1) % size;
    }

    fn failures(&self) -> u32 {
        self.failures
    }

    fn in_a_row(&self) -> u32 {
        self.in_a_row
    }
}

#[derive(Debug, Default)]
struct State {
    windows: [Window; 3],
    open_until: Option<u64>,
    trips: u32,
    probing: bool,
    /// Counts every open and close, so a ticket knows which state it belongs to.
    era: u64,
}

/// What admitted a `rank` call: whether it is the probe of a half-open
/// breaker, and the state it was admitted in. Hand it back with the call's
/// result ([`Breaker::record`]); a probe's ticket dropped without a result (the
/// call found no free instance, or its request went away) hands the probe back
/// without counting anything, so the next request probes.
pub struct Ticket<'b> {
    breaker: &'b Breaker,
    era: u64,
    probe: bool,
}

impl Ticket<'_> {
    /// Whether this call is the probe of a half-open breaker.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The ticket's state, settling it (its drop then releases nothing).
    fn settle(self) -> (u64, bool) {
        let t = ManuallyDrop::new(self);
        (t.era, t.probe)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.release_probe(self.era);
        }
    }
}

impl std::fmt::Debug for Ticket<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("era", &self.era).field("probe", &self.probe).finish()
    }
}

impl PartialEq for Ticket<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.breaker, other.breaker) && (self.era, self.probe) == (other.era, other.probe)
    }
}

/// What the breaker says about one call.
#[derive(Debug, PartialEq)]
pub enum Admit<'b> {
    /// Call the stage; hand the ticket back with the result.
    Call(Ticket<'b>),
    /// Bypass it until this time.
    Bypass(u64),
}

/// The breaker's state, for `/status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BreakerStatus {
    /// `closed`, `open` or `half-open`.
    pub state: &'static str,
    /// Failures in a row so far (of the phase with the most).
    pub consecutive_failures: u32,
    /// While open: when the next probe may run.
    pub open_until_ms: Option<u64>,
    /// Times it has opened since it was last healthy.
    pub trips: u32,
}

/// One stage's breaker.
#[derive(Debug, Default)]
pub struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
    /// Closed with no failure in any window: the state every healthy stage is
    /// in on every request, answered without taking the lock.
    clean: AtomicBool,
    /// `State::era`, readable without the lock (for the clean fast path).
    era: AtomicU64,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(mut config: BreakerConfig) -> Self {
        config.failures = config.failures.min(MAX_FAILURES);
        Breaker { config, state: Mutex::default(), clean: AtomicBool::new(true), era: AtomicU64::new(0) }
    }

    /// The breaker's settings.
    pub fn config(&self) -> BreakerConfig {
        self.config
    }

    /// Calls of one phase the breaker looks back over: `2 × failures`.
    fn window_size(&self) -> u32 {
        self.config.failures.saturating_mul(2).max(1)
    }

    /// Whether to call the stage's `rank` at `now`.
    pub fn admit(&self, now: u64) -> Admit<'_> {
        if self.clean.load(Ordering::Acquire) {
            return Admit::Call(Ticket { breaker: self, era: self.era.load(Ordering::Acquire), probe: false });
        }
        let mut s = self.state.lock();
        match s.open_until {
            None => Admit::Call(Ticket { breaker: self, era: s.era, probe: false }),
            Some(until) if now >= until && !s.probing => {
                s.probing = true;
                Admit::Call(Ticket { breaker: self, era: s.era, probe: true })
            }
            Some(until) => Admit::Bypass(until),
        }
    }

    /// A probe ended without a result: the next request may probe. Nothing is
    /// counted and the cool-off stands (it has passed, or there would have been
    /// no probe).
    fn release_probe(&self, era: u64) {
        let mut s = self.state.lock();
        if s.era == era && s.probing {
            s.probing = false;
        }
    }

    /// Whether the stage may be asked to observe: only while the breaker is
    /// closed (an open stage is left alone until a probe shows it healthy).
    pub fn allows_observe(&self) -> bool {
        self.clean.load(Ordering::Acquire) || self.state.lock().open_until.is_none()
    }

    /// Records the result of a call of `phase` at `now`; a `rank` result hands
    /// back the ticket it was admitted with.
    pub fn record(&self, phase: Phase, ok: bool, now: u64, ticket: Option<Ticket<'_>>) {
        let ticket = ticket.map(Ticket::settle);
        if ok && self.clean.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.state.lock();
        let size = self.window_size();
        if let Some((era, probe)) = ticket {
            let current = era == s.era;
            if probe && current {
                s.probing = false;
                s.era += 1;
                if ok {
                    s.open_until = None;
                    s.windows[Phase::Rank.slot()] = Window::default();
                } else {
                    self.open(&mut s, now);
                }
                self.settle(&mut s);
                return;
            }
            if !current || s.open_until.is_some() {
                // Admitted before the breaker last changed: too late to count.
                return;
            }
        } else if s.open_until.is_some() {
            // Background results while open are not counted against the next
            // closed spell; the probe decides.
            return;
        }
        s.windows[phase.slot()].push(!ok, size);
        if !ok && self.config.failures > 0 && s.windows[phase.slot()].failures() >= self.config.failures {
            s.era += 1;
            self.open(&mut s, now);
        }
        self.settle(&mut s);
    }

    fn open(&self, s: &mut State, now: u64) {
        let factor = 1u64 << s.trips.min(16);
        let cool = self.config.cooldown_ms.saturating_mul(factor).min(self.config.max_cooldown_ms);
        s.open_until = Some(now.saturating_add(cool));
        s.trips += 1;
        s.windows = Default::default();
    }

    /// Updates the lock-free fast path: clean only when closed with nothing
    /// failing. A stage whose last full window of `rank` calls all succeeded,
    /// with no other phase failing, is healthy again and forgets its trips.
    fn settle(&self, s: &mut State) {
        let healthy = s.open_until.is_none() && s.windows.iter().all(|w| w.failures() == 0);
        if healthy && s.windows[Phase::Rank.slot()].len >= self.window_size() {
            s.trips = 0;
        }
        self.era.store(s.era, Ordering::Release);
        self.clean.store(healthy && s.trips == 0, Ordering::Release);
    }

    /// The current state.
    pub fn status(&self, now: u64) -> BreakerStatus {
        let s = self.state.lock();
        let state = match s.open_until {
            None => "closed",
            Some(u) if now >= u => "half-open",
            Some(_) => "open",
        };
        BreakerStatus {
            state,
            consecutive_failures: s.windows.iter().map(Window::in_a_row).max().unwrap_or(0),
            open_until_ms: s.open_until,
            trips: s.trips,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig { failures: 3, cooldown_ms: 1000, max_cooldown_ms: 3000 })
    }

    fn call(b: &Breaker, now: u64) -> Ticket<'_> {
        match b.admit(now) {
            Admit::Call(t) => t,
            Admit::Bypass(u) => panic!("bypassed until {u} at {now}"),
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cooloff() {
        let b = breaker();
        for t in 0..3 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, false, t, Some(ticket));
        }
        assert_eq!(b.admit(10), Admit::Bypass(1002));
        assert_eq!(b.status(10).state, "open");
        // One probe after the cool-off; concurrent requests still bypass.
        let probe = call(&b, 1002);
        assert_eq!(b.admit(1003), Admit::Bypass(1002));
        b.record(Phase::Rank, false, 1003, Some(probe));
        // Second trip doubles the cool-off.
        assert_eq!(b.admit(1004), Admit::Bypass(3003));
        let probe = call(&b, 3003);
        b.record(Phase::Rank, true, 3003, Some(probe));
        assert_eq!(b.status(3004).state, "closed");
        call(&b, 3004);
    }

    #[test]
    fn a_stage_failing_every_other_call_opens_it() {
        let b = breaker();
        for t in 0..5 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, t % 2 == 1, t, Some(ticket));
        }
        assert!(matches!(b.admit(10), Admit::Bypass(_)), "3 failures in the last 5 calls");
    }

    #[test]
    fn occasional_failures_do_not() {
        let b = breaker();
        for t in 0..60 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, t % 5 != 0, t, Some(ticket));
        }
        call(&b, 100);
    }

    #[test]
    fn late_results_of_calls_admitted_before_it_opened_change_nothing() {
        let b = breaker();
        let mut late: Vec<Ticket> = (0..5).map(|t| call(&b, t)).collect();
        let (success, failure) = (late.pop().unwrap(), late.pop().unwrap());
        for (t, ticket) in late.into_iter().enumerate() {
            b.record(Phase::Rank, false, t as u64, Some(ticket));
        }
        assert_eq!(b.admit(5), Admit::Bypass(1002));
        // A failure admitted before the trip does not stretch the cool-off,
        // and neither does a success close it.
        b.record(Phase::Rank, false, 6, Some(failure));
        assert_eq!(b.admit(7), Admit::Bypass(1002));
        b.record(Phase::Rank, true, 8, Some(success));
        assert_eq!(b.admit(9), Admit::Bypass(1002));
        assert_eq!(b.status(9).trips, 1);
    }

    /// Opens `b` (3 failures at 0..3): its first probe is due at 1002.
    fn open(b: &Breaker) {
        for t in 0..3 {
            let ticket = call(b, t);
            b.record(Phase::Rank, false, t, Some(ticket));
        }
        assert_eq!(b.admit(10), Admit::Bypass(1002));
    }

    #[test]
    fn a_probe_whose_call_is_dropped_lets_the_next_request_probe() {
        let b = breaker();
        open(&b);
        // The request carrying the probe goes away mid-call: its future, and the
        // ticket in it, are dropped without a result.
        let probe = call(&b, 1002);
        assert!(probe.is_probe());
        assert_eq!(b.admit(1003), Admit::Bypass(1002), "one probe at a time");
        drop(probe);
        // Nothing was counted: still half-open, same trips, and the next
        // request is the probe.
        assert_eq!((b.status(1004).state, b.status(1004).trips), ("half-open", 1));
        let probe = call(&b, 1004);
        assert!(probe.is_probe());
        assert_eq!(b.admit(1005), Admit::Bypass(1002));
        b.record(Phase::Rank, true, 1005, Some(probe));
        assert_eq!(b.status(1006).state, "closed");
        assert!(!call(&b, 1006).is_probe());
    }

    #[test]
    fn a_probe_that_found_no_free_instance_is_not_a_failure() {
        let events = super::super::events::StageEvents::new("s", BreakerConfig { failures: 3, ..breaker().config });
        let b = &events.breaker;
        open(b);
        let busy = super::super::fault::Fault::busy("no warm instance was free within 25 ms");
        for now in [1002, 1003, 1004] {
            let probe = call(b, now);
            assert!(probe.is_probe(), "at {now}");
            events.failed(Phase::Rank, &busy, now, Some(probe));
        }
        // Three busy probes: the cool-off did not grow, the breaker did not
        // reopen, and a probe that reaches the plugin still closes it.
        assert_eq!((b.status(1005).open_until_ms, b.status(1005).trips), (Some(1002), 1));
        let probe = call(b, 1005);
        events.succeeded(Phase::Rank, 1005, Some(probe));
        assert_eq!(b.status(1006).state, "closed");
    }

    #[test]
    fn any_failure_count_the_config_accepts_opens_it() {
        for failures in [1, 16, 17, 32, 33, 40, 500, MAX_FAILURES] {
            let b = Breaker::new(BreakerConfig { failures, cooldown_ms: 1000, max_cooldown_ms: 1000 });
            for t in 0..u64::from(failures) - 1 {
                let ticket = call(&b, t);
                b.record(Phase::Rank, false, t, Some(ticket));
            }
            assert!(matches!(b.admit(100_000), Admit::Call(_)), "{failures}: opened one failure early");
            let ticket = call(&b, 100_000);
            b.record(Phase::Rank, false, 100_000, Some(ticket));
            assert_eq!(b.admit(100_001), Admit::Bypass(101_000), "{failures} failures did not open it");
        }
        // Failing every other call: `failures` failures among `2 × failures`.
        let b = Breaker::new(BreakerConfig { failures: 40, cooldown_ms: 1000, max_cooldown_ms: 1000 });
        for t in 0..79 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, t % 2 == 0, t, Some(ticket));
        }
        assert!(matches!(b.admit(79), Admit::Call(_)), "39 failures");
        let ticket = call(&b, 79);
        b.record(Phase::Rank, false, 79, Some(ticket));
        assert_eq!(b.admit(80), Admit::Bypass(1079));
        // Past the range, it counts as the most it can.
        let b = Breaker::new(BreakerConfig { failures: u32::MAX, ..Default::default() });
        assert_eq!(b.config.failures, MAX_FAILURES);
    }

    #[test]
    fn the_window_forgets_old_failures() {
        let b = breaker();
        // Two failures, then four successes: the failures left the window of 6.
        for (t, ok) in [false, false, true, true, true, true].into_iter().enumerate() {
            let ticket = call(&b, t as u64);
            b.record(Phase::Rank, ok, t as u64, Some(ticket));
        }
        let ticket = call(&b, 6);
        b.record(Phase::Rank, false, 6, Some(ticket));
        assert!(matches!(b.admit(7), Admit::Call(_)));
        assert_eq!(b.status(7).consecutive_failures, 1);
    }

    #[test]
    fn a_failing_observe_opens_it_even_while_rank_succeeds() {
        let b = breaker();
        for t in 0..3 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, true, t, Some(ticket));
            assert!(b.allows_observe());
            b.record(Phase::Observe, false, t, None);
        }
        assert_eq!(b.admit(10), Admit::Bypass(1002));
        assert!(!b.allows_observe(), "an open stage is not asked to observe");
        // The probe ranks fine and closes it; observe still fails and, once
        // it has failed three times again, reopens it for twice as long.
        let probe = call(&b, 1002);
        b.record(Phase::Rank, true, 1002, Some(probe));
        assert!(b.allows_observe());
        for t in 1002..1005 {
            b.record(Phase::Observe, false, t, None);
        }
        assert_eq!(b.admit(1005), Admit::Bypass(3004));
    }

    #[test]
    fn failing_builds_open_it() {
        let b = breaker();
        b.record(Phase::Configure, false, 0, None);
        b.record(Phase::Configure, false, 0, None);
        b.record(Phase::Configure, true, 0, None);
        call(&b, 1);
        b.record(Phase::Configure, false, 1, None);
        assert_eq!(b.admit(2), Admit::Bypass(1001));
    }

    #[test]
    fn cooloff_is_capped() {
        let b = breaker();
        for i in 0..10u64 {
            let t = i * 10_000;
            if let Admit::Call(ticket) = b.admit(t) {
                b.record(Phase::Rank, false, t, Some(ticket));
            }
        }
        let s = b.status(90_000);
        assert!(s.open_until_ms.unwrap() - 90_000 <= 3000);
    }

    #[test]
    fn zero_failures_disables_it() {
        let b = Breaker::new(BreakerConfig { failures: 0, ..Default::default() });
        for t in 0..100 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, false, t, Some(ticket));
        }
        call(&b, 100);
    }

    #[test]
    fn a_healthy_stage_stays_on_the_fast_path() {
        let b = breaker();
        for t in 0..10 {
            let ticket = call(&b, t);
            b.record(Phase::Rank, true, t, Some(ticket));
        }
        assert!(b.clean.load(Ordering::Acquire));
        let ticket = call(&b, 11);
        b.record(Phase::Rank, false, 11, Some(ticket));
        assert!(!b.clean.load(Ordering::Acquire));
    }
}
