//! A per-stage circuit breaker: after repeated failures the stage is bypassed (its
//! input passes through) for a cool-off that doubles on every trip, then one
//! request probes it again.
//!
//! Time is the request's `now-ms`, like everything else the chain decides on.

use parking_lot::Mutex;
use serde::Serialize;

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker (0 disables it).
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

#[derive(Debug, Default)]
struct State {
    consecutive: u32,
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
    /// Failures in a row so far.
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
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Breaker { config, state: Mutex::default() }
    }

    /// Whether to call the stage at `now`.
    pub fn admit(&self, now: u64) -> Admit {
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

    /// Records the result of a call admitted at `now`.
    pub fn record(&self, ok: bool, now: u64) {
        let mut s = self.state.lock();
        s.probing = false;
        if ok {
            *s = State::default();
            return;
        }
        s.consecutive += 1;
        let reopen = s.open_until.is_some();
        if self.config.failures > 0 && (reopen || s.consecutive >= self.config.failures) {
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
        BreakerStatus { state, consecutive_failures: s.consecutive, open_until_ms: s.open_until, trips: s.trips }
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
            b.record(false, t);
        }
        assert_eq!(b.admit(10), Admit::Bypass(1002));
        assert_eq!(b.status(10).state, "open");
        // One probe after the cool-off; concurrent requests still bypass.
        assert_eq!(b.admit(1002), Admit::Call);
        assert_eq!(b.admit(1003), Admit::Bypass(1002));
        b.record(false, 1003);
        // Second trip doubles the cool-off.
        assert_eq!(b.admit(1004), Admit::Bypass(3003));
        assert_eq!(b.admit(3003), Admit::Call);
        b.record(true, 3003);
        assert_eq!(b.status(3004).state, "closed");
        assert_eq!(b.admit(3004), Admit::Call);
    }

    #[test]
    fn success_resets_the_count() {
        let b = breaker();
        b.record(false, 0);
        b.record(false, 0);
        b.record(true, 0);
        b.record(false, 0);
        b.record(false, 0);
        assert_eq!(b.admit(1), Admit::Call);
    }

    #[test]
    fn cooloff_is_capped() {
        let b = breaker();
        for i in 0..10 {
            let t = i * 10_000;
            let _ = b.admit(t);
            b.record(false, t);
        }
        let s = b.status(90_000);
        assert!(s.open_until_ms.unwrap() - 90_000 <= 3000);
    }

    #[test]
    fn zero_failures_disables_it() {
        let b = Breaker::new(BreakerConfig { failures: 0, ..Default::default() });
        for t in 0..100 {
            b.record(false, t);
        }
        assert_eq!(b.admit(100), Admit::Call);
    }
}
