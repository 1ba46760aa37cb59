//! Every counter a rule may alert on is there from the start, at zero.
//!
//! A counter series Prometheus has never seen cannot `increase()`: the first
//! failover of an account would vanish into the series' creation, and a rule
//! on `rate(poolgate_failovers_total[5m]) > 0` would miss it. So each label
//! set that can be enumerated is made when a generation is loaded (at start,
//! and again when a reload adds an account, a seat, a stage or a backend):
//! the vocabularies below, crossed with the generation's [`Roster`]. What
//! cannot be enumerated — a request's final status, an upstream's status, a
//! client's model — appears when first counted.
//!
//! The vocabularies are the label values poolgate counts with; a debug build
//! checks each value counted is in its vocabulary, so a new value added
//! without its zero fails the tests instead of going unseen.

use crate::account::CooldownReason;
use crate::policy::{Cause, Phase};

use super::{
    Account, AccountCause, AccountReason, AccountResult, Backend, Cause as CauseLabel, Metrics, Op, Reason,
    ReloadResult, SpanOutcome, StageCause, StagePhaseCause, Text,
};

/// Why a request moved off an account, as `poolgate_failovers_total` counts
/// it: the statuses that fail over (any other 5xx appears when first seen),
/// no connection, and an answer that broke before its first byte.
pub const FAILOVER_CAUSES: [&str; 10] =
    ["401", "403", "429", "500", "502", "503", "504", "529", "connect_error", "stream_error"];

/// The causes of `poolgate_unserved_total`: how a request no account could
/// serve was answered.
pub const UNSERVED_CAUSES: [&str; 5] = ["parked", "auth_refused", "upstream_failed", "upstream_cooling", "no_account"];

/// The reasons of `poolgate_refused_total`: why a request was refused before
/// any account was asked.
pub const REFUSED_REASONS: [&str; 15] = [
    "client_key",
    "unsupported_media_type",
    "body_too_large",
    "body_timeout",
    "invalid_chat_request",
    "invalid_body",
    "no_accounts",
    "key_limit",
    "too_many_headers",
    "headers_too_large",
    "uri_too_long",
    "head_timeout",
    "not_found",
    "method_not_allowed",
    "too_many_connections",
];

/// The results of `poolgate_oauth_refreshes_total`.
pub const OAUTH_RESULTS: [&str; 4] = ["renewed", "adopted", "failed", "needs_login"];

/// The operations of `poolgate_state_backend_errors_total`.
pub const STATE_OPS: [&str; 5] = ["connect", "read", "write", "lease", "oauth"];

/// The reasons of `poolgate_state_records_ignored_total`.
pub const STATE_IGNORED: [&str; 2] = ["other_identity", "garbage"];

/// What became of spans, as `poolgate_trace_spans_total` counts them.
pub const SPAN_OUTCOMES: [&str; 3] = ["exported", "dropped_queue_full", "dropped_export_failed"];

/// What a loaded generation has that counters are labelled by.
#[derive(Debug, Default)]
pub struct Roster<'a> {
    /// The accounts of the pool, by id.
    pub accounts: Vec<&'a str>,
    /// The OAuth seats among them.
    pub seats: Vec<&'a str>,
    /// The chain's stages, by name.
    pub stages: Vec<&'a str>,
    /// The fallback backends, as `<name>/<model>`.
    pub backends: Vec<String>,
}

impl Metrics {
    /// Makes every enumerable label set of `roster`, at zero (those already
    /// made keep their counts).
    pub fn zeros(&self, roster: &Roster<'_>) {
        self.zeros_without_labels();
        for &account in &roster.accounts {
            for cause in FAILOVER_CAUSES {
                let _ = self.failovers.get_or_create(&AccountCause { account: account.into(), cause: cause.into() });
            }
            for reason in CooldownReason::ALL {
                let labels = AccountReason { account: account.into(), reason: reason.as_str().into() };
                let _ = self.cooldowns.get_or_create(&labels);
            }
            let _ = self.stream_cuts.get_or_create(&Account { account: account.into() });
        }
        for &seat in &roster.seats {
            for result in OAUTH_RESULTS {
                let _ =
                    self.oauth_refreshes.get_or_create(&AccountResult { account: seat.into(), result: result.into() });
            }
        }
        for &stage in &roster.stages {
            self.stage_histogram(stage);
            for cause in Cause::ALL {
                let cause = Text::from(cause.as_str());
                for phase in Phase::ALL {
                    let stage = Text::from(stage);
                    match phase {
                        Phase::Rank => {
                            let _ = self.policy_errors.get_or_create(&StageCause { stage, cause: cause.clone() });
                        }
                        other => {
                            let phase = other.as_str();
                            let labels = StagePhaseCause { stage, phase, cause: cause.clone() };
                            let _ = self.background_errors.get_or_create(&labels);
                        }
                    }
                }
            }
        }
        for backend in &roster.backends {
            let _ = self.fallback.get_or_create(&Backend { backend: backend.as_str().into() });
        }
    }

    /// The label sets that do not depend on the configuration.
    fn zeros_without_labels(&self) {
        for cause in UNSERVED_CAUSES {
            let _ = self.unserved.get_or_create(&CauseLabel { cause });
        }
        for reason in REFUSED_REASONS {
            let _ = self.refused.get_or_create(&Reason { reason });
        }
        for result in ["ok", "error"] {
            let _ = self.reloads.get_or_create(&ReloadResult { result });
        }
        for op in STATE_OPS {
            let _ = self.state_errors.get_or_create(&Op { op });
        }
        for reason in STATE_IGNORED {
            let _ = self.state_ignored.get_or_create(&Reason { reason });
        }
        for outcome in SPAN_OUTCOMES {
            let _ = self.trace_spans.get_or_create(&SpanOutcome { outcome });
        }
    }
}

/// Whether `value` is one of `vocabulary`: checked by debug builds where a
/// value is counted (see the module's docs).
pub(super) fn known(vocabulary: &[&str], value: &str) -> bool {
    vocabulary.contains(&value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaded_roster_shows_every_enumerable_series_at_zero() {
        let m = Metrics::default();
        let roster = Roster {
            accounts: vec!["a"],
            seats: vec!["s"],
            stages: vec!["builtin:affinity"],
            backends: vec!["local/qwen".into()],
        };
        m.zeros(&roster);
        m.failover("a", "429");
        m.zeros(&roster);
        let text = m.render(&[]);
        for series in [
            "poolgate_failovers_total{account=\"a\",cause=\"connect_error\"} 0",
            "poolgate_failovers_total{account=\"a\",cause=\"429\"} 1",
            "poolgate_cooldowns_total{account=\"a\",reason=\"weekly_exhausted\"} 0",
            "poolgate_stream_cuts_total{account=\"a\"} 0",
            "poolgate_oauth_refreshes_total{account=\"s\",result=\"needs_login\"} 0",
            "poolgate_policy_errors_total{stage=\"builtin:affinity\",cause=\"invalid-output\"} 0",
            "poolgate_policy_background_errors_total{stage=\"builtin:affinity\",phase=\"configure\",cause=\"oom\"} 0",
            "poolgate_fallback_total{backend=\"local/qwen\"} 0",
            "poolgate_unserved_total{cause=\"parked\"} 0",
            "poolgate_refused_total{reason=\"client_key\"} 0",
            "poolgate_reloads_total{result=\"error\"} 0",
            "poolgate_state_backend_errors_total{op=\"lease\"} 0",
            "poolgate_state_records_ignored_total{reason=\"garbage\"} 0",
            "poolgate_parked_total 0",
            "poolgate_stage_duration_seconds_count{stage=\"builtin:affinity\"} 0",
        ] {
            assert!(text.contains(&format!("{series}\n")), "{series} missing:\n{text}");
        }
        let rank_zeros = text.lines().filter(|l| l.starts_with("poolgate_policy_errors_total{")).count();
        assert_eq!(rank_zeros, Cause::ALL.len(), "{text}");
        let background = text.lines().filter(|l| l.starts_with("poolgate_policy_background_errors_total{")).count();
        assert_eq!(background, 2 * Cause::ALL.len(), "observe and configure: {text}");
    }
}
