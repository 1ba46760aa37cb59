//! How long each chain stage takes, by stage: `poolgate_chain_duration_seconds`
//! says the chain got slow, this says which plugin made it so.
//!
//! Each stage's histogram is resolved once, by name (when its generation is
//! loaded, see `zeros.rs`), so a decision costs a read lock, a lookup by the
//! name it already holds (no allocation) and one observation per stage.

use std::collections::HashMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::Histogram;

use super::{Metrics, Text};
use crate::policy::decision::StageRecord;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Stage {
    pub(super) stage: Text,
}

/// Each stage's duration histogram, by the stage's name.
pub(super) type StageTable = parking_lot::RwLock<HashMap<String, Histogram>>;

impl Metrics {
    pub(super) fn register_stages(&mut self) {
        self.registry.register(
            "poolgate_stage_duration_seconds",
            "Time one chain stage took in a ranking, by stage (stages the breaker bypassed are not timed)",
            self.stage_duration.clone(),
        );
    }

    /// The stage histogram of `stage`, made once.
    pub(super) fn stage_histogram(&self, stage: &str) -> Histogram {
        if let Some(h) = self.stage_handles.read().get(stage) {
            return h.clone();
        }
        let h = self.stage_duration.get_or_create(&Stage { stage: stage.into() }).clone();
        self.stage_handles.write().insert(stage.to_string(), h.clone());
        h
    }

    /// The stages of one decision ran: each one's time. A bypassed stage was
    /// not called, and its zero would only drag the quantiles down.
    pub fn stage_durations(&self, stages: &[StageRecord]) {
        let table = self.stage_handles.read();
        for s in stages.iter().filter(|s| s.bypassed.is_none()) {
            let seconds = s.duration_us / 1e6;
            match table.get(&s.stage) {
                Some(h) => h.observe(seconds),
                // A chain built without a load (a test's): made here, once.
                None => self.stage_duration.get_or_create(&Stage { stage: s.stage.as_str().into() }).observe(seconds),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(stage: &str, us: f64, bypassed: bool) -> StageRecord {
        let breaker = crate::policy::breaker::Breaker::new(Default::default());
        StageRecord {
            stage: stage.into(),
            reason: String::new(),
            detail: None,
            order: crate::policy::Order::new(Vec::new(), Vec::<String>::new().into()),
            duration_us: us,
            error: None,
            bypassed: bypassed.then(|| breaker.status(0)),
            safety_valve: false,
        }
    }

    #[test]
    fn each_stage_is_timed_apart_and_a_bypassed_one_not_at_all() {
        let m = Metrics::default();
        m.stage_histogram("builtin:affinity");
        m.stage_durations(&[record("builtin:affinity", 20.0, false), record("slow", 300_000.0, false)]);
        m.stage_durations(&[record("builtin:affinity", 0.0, true)]);
        let text = m.render(&[]);
        assert!(text.contains("poolgate_stage_duration_seconds_count{stage=\"builtin:affinity\"} 1\n"), "{text}");
        assert!(
            text.contains("poolgate_stage_duration_seconds_bucket{le=\"0.000025\",stage=\"builtin:affinity\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("poolgate_stage_duration_seconds_bucket{le=\"0.25\",stage=\"slow\"} 0\n"), "{text}");
        assert!(text.contains("poolgate_stage_duration_seconds_bucket{le=\"1.0\",stage=\"slow\"} 1\n"), "{text}");
    }
}
