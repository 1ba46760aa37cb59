//! A per-stage circuit breaker: after repeated failures the stage is bypassed (its
//! input passes through, and it is not asked to observe) for a cool-off that
//! doubles on every trip, then one request probes it again.
//!
//! Failures are counted per phase — `rank`, `observe`, and the building of new
//! instances (`configure`) — and any phase reaching the threshold opens the
//! breaker. Counting them apart matters: a stage whose `observe` always traps
//! while its `rank` works would otherwise reset its count on every request and
//! never open, paying a failed call per request forever.
//!
//! Time is the request's `now-ms`, like everything else the chain decides on.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures (of one phase) that open the breaker (0 disables it).
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

    fn slot(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
struct State {
    consecutive: [u32; 3],
    open_until: Option<u64>,
    trips: u32,
    probing: bool,
}

/// What the breaker says about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Call the stage.
    Call,
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
    /// Closed with no failure counted: the state every healthy stage is in on
    /// every request, answered without taking the lock.
    clean: AtomicBool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Breaker { config, state: Mutex::default(), clean: AtomicBool::new(true) }
    }

    /// Whether to call the stage's `rank` at `now`.
    pub fn admit(&self, now: u64) -> Admit {
        if self.clean.load(Ordering::Acquire) {
            return Admit::Call;
        }
        let mut s = self.state.lock();
        match s.open_until {
            None => Admit::Call,
            Some(until) if now >= until && !s.probing => {
                s.probing = true;
                Admit::Call
            }
            Some(until) => Admit::Bypass(until),
        }
    }

    /// Whether the stage may be asked to observe: only while the breaker is
    /// closed (an open stage is left alone until a probe shows it healthy).
    pub fn allows_observe(&self) -> bool {
        self.clean.load(Ordering::Acquire) || self.state.lock().open_until.is_none()
    }

    /// Records the result of a call of `phase` at `now`. A success resets that
    /// phase's count, and a successful `rank` (the probe of a half-open
    /// breaker) closes the breaker. Other phases keep their counts, so a stage
    /// whose `observe` is still broken reopens at its next failure, for twice as
    /// long; the trip count resets only once no phase is failing.
    pub fn record(&self, phase: Phase, ok: bool, now: u64) {
        if ok && self.clean.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.state.lock();
        if phase == Phase::Rank {
            s.probing = false;
        }
        if ok {
            s.consecutive[phase.slot()] = 0;
            if phase == Phase::Rank {
                s.open_until = None;
            }
            if s.open_until.is_none() && s.consecutive.iter().all(|&c| c == 0) {
                s.trips = 0;
                self.clean.store(true, Ordering::Release);
            }
            return;
        }
        self.clean.store(false, Ordering::Release);
        s.consecutive[phase.slot()] += 1;
        let reopen = s.open_until.is_some() && phase == Phase::Rank;
        let tripped = s.open_until.is_none() && s.consecutive[phase.slot()] >= self.config.failures;
        if self.config.failures > 0 && (reopen || tripped) {
            let factor = 1u64 << s.trips.min(16);
            let cool = self.config.cooldown_ms.saturating_mul(factor).min(self.config.max_cooldown_ms);
            s.open_until = Some(now.saturating_add(cool));
            s.trips += 1;
        }
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
            consecutive_failures: s.consecutive.iter().copied().max().unwrap_or(0),
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

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cooloff() {
        let b = breaker();
        for t in 0..3 {
            assert_eq!(b.admit(t), Admit::Call);
            b.record(Phase::Rank, false, t);
        }
        assert_eq!(b.admit(10), Admit::Bypass(1002));
        assert_eq!(b.status(10).state, "open");
        // One probe after the cool-off; concurrent requests still bypass.
        assert_eq!(b.admit(1002), Admit::Call);
        assert_eq!(b.admit(1003), Admit::Bypass(1002));
        b.record(Phase::Rank, false, 1003);
        // Second trip doubles the cool-off.
        assert_eq!(b.admit(1004), Admit::Bypass(3003));
        assert_eq!(b.admit(3003), Admit::Call);
        b.record(Phase::Rank, true, 3003);
        assert_eq!(b.status(3004).state, "closed");
        assert_eq!(b.admit(3004), Admit::Call);
    }

    #[test]
    fn success_resets_the_count() {
        let b = breaker();
        b.record(Phase::Rank, false, 0);
        b.record(Phase::Rank, false, 0);
        b.record(Phase::Rank, true, 0);
        b.record(Phase::Rank, false, 0);
        b.record(Phase::Rank, false, 0);
        assert_eq!(b.admit(1), Admit::Call);
    }

    #[test]
    fn a_failing_observe_opens_it_even_while_rank_succeeds() {
        let b = breaker();
        for t in 0..3 {
            assert_eq!(b.admit(t), Admit::Call);
            b.record(Phase::Rank, true, t);
            assert!(b.allows_observe());
            b.record(Phase::Observe, false, t);
        }
        assert_eq!(b.admit(10), Admit::Bypass(1002));
        assert!(!b.allows_observe(), "an open stage is not asked to observe");
        // The probe ranks fine and closes it; observe still fails and reopens
        // it at once, for twice as long.
        assert_eq!(b.admit(1002), Admit::Call);
        b.record(Phase::Rank, true, 1002);
        assert!(b.allows_observe());
        b.record(Phase::Observe, false, 1002);
        assert_eq!(b.admit(1003), Admit::Bypass(3002));
    }

    #[test]
    fn failing_builds_open_it_and_a_good_build_resets_only_them() {
        let b = breaker();
        b.record(Phase::Configure, false, 0);
        b.record(Phase::Configure, false, 0);
        b.record(Phase::Configure, true, 0);
        b.record(Phase::Configure, false, 0);
        b.record(Phase::Configure, false, 0);
        assert_eq!(b.admit(1), Admit::Call);
        b.record(Phase::Configure, false, 1);
        assert_eq!(b.admit(2), Admit::Bypass(1001));
    }

    #[test]
    fn cooloff_is_capped() {
        let b = breaker();
        for i in 0..10 {
            let t = i * 10_000;
            let _ = b.admit(t);
            b.record(Phase::Rank, false, t);
        }
        let s = b.status(90_000);
        assert!(s.open_until_ms.unwrap() - 90_000 <= 3000);
    }

    #[test]
    fn zero_failures_disables_it() {
        let b = Breaker::new(BreakerConfig { failures: 0, ..Default::default() });
        for t in 0..100 {
            b.record(Phase::Rank, false, t);
        }
        assert_eq!(b.admit(100), Admit::Call);
    }
}
