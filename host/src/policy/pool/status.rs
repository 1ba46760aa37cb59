//! What a pool measures and shows: call times and its size and queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// A running average of durations, in nanoseconds (0 until the first sample):
/// the plain mean of the first four samples, then exponentially weighted, ¼
/// per sample, so that it follows a plugin whose calls became slow within a
/// few calls.
#[derive(Default)]
pub(super) struct Average {
    ns: AtomicU64,
    samples: AtomicU64,
}

impl Average {
    pub(super) fn add(&self, d: Duration) {
        let x = (d.as_nanos() as u64).max(1) as i64;
        let n = self.samples.fetch_add(1, Ordering::Relaxed).saturating_add(1).min(4) as i64;
        let old = self.ns.load(Ordering::Relaxed) as i64;
        let new = old + (x - old) / n;
        // Racing updates may lose a sample; an average does not mind.
        self.ns.store(new.max(1) as u64, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Option<Duration> {
        let ns = self.ns.load(Ordering::Relaxed);
        (ns > 0).then(|| Duration::from_nanos(ns))
    }

    pub(super) fn ms(&self) -> Option<f64> {
        self.get().map(|d| (d.as_nanos() as f64 / 10_000.0).round() / 100.0)
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
    /// Building one instance (instantiate and `configure`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build: Option<f64>,
}

/// The pool's size and queue, for `/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PoolStatus {
    /// Instances kept warm (`[policy] instances`).
    pub keep: usize,
    /// The most alive at once under demand (`[policy] max_instances`).
    pub max: usize,
    /// Alive now (idle, in a call, or being built).
    pub live: usize,
    /// Idle now.
    pub idle: usize,
    /// Builds running now.
    pub building: usize,
    /// The most alive at once since the stage was loaded.
    pub peak: usize,
    /// Calls waiting for an instance now.
    pub waiting: usize,
    /// `observe` calls waiting now, and the bound.
    pub observe_queued: usize,
    /// The bound on queued `observe` calls.
    pub observe_queue_bound: usize,
    /// `observe` calls dropped since the stage was loaded (queue full, or no
    /// instance within the queue's wait).
    pub observe_dropped: u64,
}
