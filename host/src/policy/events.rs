//! One stage's health: where every failure of the stage is counted, whatever
//! phase it happened in.
//!
//! A `rank` failure is seen by the request it belongs to. An `observe` failure
//! happens after its request was answered, and a failed instance build happens
//! on the builder thread with no request at all; both would otherwise be
//! invisible. Every failure therefore goes through [`StageEvents::failed`]: it
//! feeds the stage's breaker, reaches the gateway's metrics through the sink,
//! and — for the background phases — waits here until the next decision record
//! picks it up, so the operator reading `/admin/decisions` or `/status` sees it.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use super::breaker::{Breaker, BreakerConfig, Phase, Ticket};
use super::decision::PolicyError;
use super::fault::{Cause, Fault};

/// Receives every stage failure as it happens: (stage, phase, fault).
pub type FaultSink = Arc<dyn Fn(&str, Phase, &Fault) + Send + Sync>;

/// Background failures kept for the next decision record; older ones are
/// counted, not kept.
const MAX_PENDING: usize = 16;

/// How many of a stage's last `rank` calls [`StageEvents::busy_share`] looks at.
pub const RECENT_RANKS: u32 = 64;
/// A stage skipped as `busy` for more than this share of its last
/// [`RECENT_RANKS`] calls is *mostly skipped*: `/status` warns, the metrics
/// show the share, and the answers it was skipped on say so in
/// `x-poolgate-reason`. Half: a stage that is skipped more often than it runs
/// is off in effect, whatever its breaker says.
pub const MOSTLY_SKIPPED: f64 = 0.5;
/// Fewer recent calls than this say nothing yet.
const MIN_RECENT: u32 = 16;

/// How many of a stage's recent `rank` calls were skipped as `busy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BusyShare {
    /// Skipped as busy…
    pub busy: u32,
    /// …of this many recent calls.
    pub of: u32,
}

impl BusyShare {
    /// Whether the stage was skipped for most of its recent calls.
    pub fn mostly(&self) -> bool {
        self.of >= MIN_RECENT && f64::from(self.busy) > MOSTLY_SKIPPED * f64::from(self.of)
    }
}

/// Calls and failures of one phase, for `/status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseHealth {
    /// Calls that ran to an answer or a failure since the stage was loaded
    /// (not those bypassed by the breaker or skipped as busy).
    pub calls: u64,
    /// Failures since the stage was loaded (the plugin's own: trap, timeout,
    /// oom, error, invalid output, host).
    pub failures: u64,
    /// The last failure, if any, with its time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<LastFailure>,
    /// The failures by cause (`trap`, `timeout`, `oom`, …).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub by_cause: std::collections::BTreeMap<&'static str, u64>,
    /// Calls skipped because every instance was busy (cause `busy`): the pool
    /// is too small for how long the plugin's calls take, not a failure of it.
    pub busy: u64,
    /// The last of them, whose message says how long calls take and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_busy: Option<LastFailure>,
}

/// A failure as shown in `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct LastFailure {
    /// When it happened (ms since the Unix epoch).
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub fault: Fault,
}

/// The health record of one stage.
pub struct StageEvents {
    stage: String,
    /// The stage's breaker.
    pub breaker: Breaker,
    sink: OnceLock<FaultSink>,
    pending: Mutex<Vec<PolicyError>>,
    has_pending: AtomicBool,
    counts: [AtomicU64; 3],
    calls: [AtomicU64; 3],
    last: Mutex<[Option<LastFailure>; 3]>,
    /// Failures by cause, per phase (only failures take the lock).
    causes: Mutex<[std::collections::BTreeMap<&'static str, u64>; 3]>,
    busy: [AtomicU64; 3],
    last_busy: Mutex<[Option<LastFailure>; 3]>,
    /// The last [`RECENT_RANKS`] `rank` calls, newest in the low bit: 1 for a
    /// busy skip. And how many there were (up to the window).
    recent: AtomicU64,
    recent_len: AtomicU64,
    /// The most fuel one call burned, and the most memory one instance held
    /// after a call (see [`StageEvents::note_cost`]).
    fuel_high: AtomicU64,
    memory_high: AtomicU64,
}

/// The most one call of a stage cost, since the stage was loaded: what to
/// set its deadline and memory cap by, before a call hits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HighWater {
    /// The most fuel one call burned (`rank`, `observe`; a call cut at its
    /// budget burned it all).
    pub fuel: u64,
    /// The most memory (linear memories and tables) one instance held after
    /// a call, bytes.
    pub memory_bytes: u64,
}

impl StageEvents {
    /// A fresh record for `stage`.
    pub fn new(stage: &str, breaker: BreakerConfig) -> Arc<Self> {
        Arc::new(StageEvents {
            stage: stage.to_string(),
            breaker: Breaker::new(breaker),
            sink: OnceLock::new(),
            pending: Mutex::new(Vec::new()),
            has_pending: AtomicBool::new(false),
            counts: Default::default(),
            calls: Default::default(),
            last: Mutex::new(Default::default()),
            causes: Mutex::new(Default::default()),
            busy: Default::default(),
            last_busy: Mutex::new(Default::default()),
            recent: AtomicU64::new(0),
            recent_len: AtomicU64::new(0),
            fuel_high: AtomicU64::new(0),
            memory_high: AtomicU64::new(0),
        })
    }

    /// The stage's name.
    pub fn stage(&self) -> &str {
        &self.stage
    }

    /// Where failures are reported from now on (once; later calls are ignored).
    pub fn set_sink(&self, sink: FaultSink) {
        let _ = self.sink.set(sink);
    }

    /// A call of `phase` succeeded (a `rank` call hands back its ticket).
    pub fn succeeded(&self, phase: Phase, now_ms: u64, ticket: Option<Ticket<'_>>) {
        self.calls[phase as usize].fetch_add(1, Ordering::Relaxed);
        if phase == Phase::Rank {
            self.note_rank(false);
        }
        self.breaker.record(phase, true, now_ms, ticket);
    }

    /// A call of `phase` failed with `fault`: counted, fed to the breaker and the
    /// sink, and — unless it is a `rank` failure, which its own request records —
    /// kept for the next decision record.
    ///
    /// A stage skipped because no instance was free in time (cause `busy`) is
    /// recorded and counted apart, but not held against the plugin: the pool
    /// was busy, the plugin did nothing wrong. Its ticket is dropped unused, so
    /// a probe that met a busy pool hands the probe on to the next request.
    pub fn failed(&self, phase: Phase, fault: &Fault, now_ms: u64, ticket: Option<Ticket<'_>>) {
        let slot = phase as usize;
        match fault.cause {
            Cause::Bypassed => {}
            Cause::Busy => {
                drop(ticket);
                if phase == Phase::Rank {
                    self.note_rank(true);
                }
                self.busy[slot].fetch_add(1, Ordering::Relaxed);
                self.last_busy.lock()[slot] = Some(LastFailure { at_ms: now_ms, fault: fault.clone() });
            }
            _ => {
                if phase == Phase::Rank {
                    self.note_rank(false);
                }
                self.calls[slot].fetch_add(1, Ordering::Relaxed);
                self.breaker.record(phase, false, now_ms, ticket);
                self.counts[slot].fetch_add(1, Ordering::Relaxed);
                *self.causes.lock()[slot].entry(fault.cause.as_str()).or_default() += 1;
                self.last.lock()[slot] = Some(LastFailure { at_ms: now_ms, fault: fault.clone() });
            }
        }
        if let Some(sink) = self.sink.get() {
            sink(&self.stage, phase, fault);
        }
        if phase != Phase::Rank {
            tracing::warn!(
                stage = %self.stage,
                phase = phase.as_str(),
                cause = fault.cause.as_str(),
                message = %fault.message,
                "routing_policy_error outside a ranking"
            );
            let mut pending = self.pending.lock();
            if pending.len() >= MAX_PENDING {
                pending.remove(0);
            }
            pending.push(PolicyError::new(&self.stage, phase, fault));
            self.has_pending.store(true, Ordering::Release);
        }
    }

    /// Adds a `rank` call to the recent window.
    fn note_rank(&self, busy: bool) {
        let mask = if RECENT_RANKS >= 64 { u64::MAX } else { (1u64 << RECENT_RANKS) - 1 };
        // Lost races only blur the window by a call.
        let _ =
            self.recent.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some(((b << 1) | busy as u64) & mask));
        if self.recent_len.load(Ordering::Relaxed) < u64::from(RECENT_RANKS) {
            self.recent_len.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many of the last `rank` calls were skipped as busy.
    pub fn busy_share(&self) -> BusyShare {
        let of = self.recent_len.load(Ordering::Relaxed).min(u64::from(RECENT_RANKS)) as u32;
        BusyShare { busy: self.recent.load(Ordering::Acquire).count_ones().min(of), of }
    }

    /// A call burned `fuel` and left its instance holding `memory_bytes`:
    /// two atomic maxima, so every call can afford it. An instance's memory
    /// never shrinks, so what it holds after a call is the most it reached.
    pub fn note_cost(&self, fuel: u64, memory_bytes: usize) {
        self.fuel_high.fetch_max(fuel, Ordering::Relaxed);
        self.memory_high.fetch_max(memory_bytes as u64, Ordering::Relaxed);
    }

    /// The most one call cost so far.
    pub fn high_water(&self) -> HighWater {
        HighWater {
            fuel: self.fuel_high.load(Ordering::Relaxed),
            memory_bytes: self.memory_high.load(Ordering::Relaxed),
        }
    }

    /// Takes the background failures not yet in a decision record.
    pub fn take_pending(&self, into: &mut Vec<PolicyError>) {
        if !self.has_pending.load(Ordering::Acquire) {
            return;
        }
        let mut pending = self.pending.lock();
        self.has_pending.store(false, Ordering::Release);
        into.append(&mut pending);
    }

    /// Failures by phase, for `/status`.
    pub fn health(&self, phase: Phase) -> PhaseHealth {
        let slot = phase as usize;
        PhaseHealth {
            calls: self.calls[slot].load(Ordering::Relaxed),
            failures: self.counts[slot].load(Ordering::Relaxed),
            last: self.last.lock()[slot].clone(),
            by_cause: self.causes.lock()[slot].clone(),
            busy: self.busy[slot].load(Ordering::Relaxed),
            last_busy: self.last_busy.lock()[slot].clone(),
        }
    }
}

/// Milliseconds since the Unix epoch (background failures have no request clock).
pub fn wall_ms() -> u64 {
    crate::clock::now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_high_water_marks_keep_the_most_any_call_cost() {
        let e = StageEvents::new("s", BreakerConfig::default());
        assert_eq!(e.high_water(), HighWater::default());
        e.note_cost(500, 1 << 20);
        e.note_cost(90, 4 << 20);
        e.note_cost(70, 2 << 20);
        assert_eq!(e.high_water(), HighWater { fuel: 500, memory_bytes: 4 << 20 });
    }
}
