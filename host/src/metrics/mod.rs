//! Prometheus metrics, through `prometheus-client` (the Prometheus project's
//! Rust client): the OpenMetrics text format, escaping and `# EOF` are its
//! job, not ours.
//!
//! Counters and histograms live in one registry for the process; the gauges —
//! in flight, cooling, breakers, queue depth, generation — are read from the
//! live state at each scrape, into a registry of their own, so they can never
//! go stale. Label sets are small and bounded (accounts, stages, causes,
//! statuses). No label ever carries a secret: accounts appear by id.
//!
//! Beside this file: `usage` (by client key and model), `tokens` (by account
//! and model), `stages` (each stage's time), `zeros` (every enumerable
//! counter at zero from the start, so a rule sees its first increase) and
//! `quota` (the gauges an operator alerts on: quota, cooldowns, the pool).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge as GaugeMetric;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod quota;
mod stages;
mod tokens;
mod usage;
mod zeros;
pub use quota::{
    FIXED_WINDOWS, PoolCounts, QUOTA_BUCKETS_MAX, QuotaAccount, cooldowns_active, pool_gauges, quota_gauges,
};
pub use usage::MODEL_LABELS_MAX;
use usage::{KeyModel, KeyModelKind, UsageTable};
pub use zeros::{FAILOVER_CAUSES, OAUTH_RESULTS, REFUSED_REASONS, Roster, STATE_OPS, UNSERVED_CAUSES};

/// The labels of one gauge value: (name, value) pairs.
pub type Labels = Vec<(&'static str, Text)>;

/// A label value from text poolgate does not choose (an account id, a stage
/// name), escaped as the exposition format requires: `prometheus-client` 0.24
/// writes label values as they are, so a quote or a newline in one would break
/// the whole scrape.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Text(String);

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Text(s.to_string())
    }
}

impl EncodeLabelValue for Text {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        let mut rest = self.0.as_str();
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..i])?;
            encoder.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        encoder.write_str(rest)
    }
}

/// A gauge family for [`Metrics::render`]: name, help, values by labels.
pub type Gauge<'a> = (&'a str, &'a str, Vec<(Labels, f64)>);

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets, seconds: from 10 µs (a chain) to 10 min (a long stream).
const BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0, 5.0, 30.0, 120.0, 600.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountStatus {
    account: Text,
    status: u16,
}

/// An upstream attempt's status: the HTTP status, or `connect_error` when no
/// response came back.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct AttemptStatus(Option<u16>);

impl EncodeLabelValue for AttemptStatus {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self.0 {
            Some(s) => EncodeLabelValue::encode(&s, encoder),
            None => EncodeLabelValue::encode(&"connect_error", encoder),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountAttempt {
    account: Text,
    status: AttemptStatus,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountCause {
    account: Text,
    cause: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountReason {
    account: Text,
    reason: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageCause {
    stage: Text,
    cause: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StagePhaseCause {
    stage: Text,
    phase: &'static str,
    cause: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Cause {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Op {
    op: &'static str,
}

/// What became of a span (`[telemetry]`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpanOutcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadResult {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Account {
    account: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Backend {
    backend: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountResult {
    account: Text,
    result: Text,
}

/// The gateway's metrics.
pub struct Metrics {
    client_tokens: Family<KeyModelKind, Counter>,
    client_cost: Family<KeyModel, Counter<f64, std::sync::atomic::AtomicU64>>,
    client_requests: Family<KeyModel, Counter>,
    /// The usage counters of each (key, model) seen, resolved once: a
    /// request's end finds them with one lookup and no allocation.
    usage_handles: parking_lot::Mutex<UsageTable>,
    account_tokens: Family<tokens::AccountModelKind, Counter>,
    token_handles: parking_lot::Mutex<tokens::TokenTable>,
    stage_duration: Family<stages::Stage, Histogram, fn() -> Histogram>,
    stage_handles: stages::StageTable,
    registry: Registry,
    requests: Family<AccountStatus, Counter>,
    attempts: Family<AccountAttempt, Counter>,
    failovers: Family<AccountCause, Counter>,
    cooldowns: Family<AccountReason, Counter>,
    policy_errors: Family<StageCause, Counter>,
    background_errors: Family<StagePhaseCause, Counter>,
    parked: Counter,
    stream_cuts: Family<Account, Counter>,
    oauth_refreshes: Family<AccountResult, Counter>,
    overage: Family<AccountResult, Counter>,
    fallback: Family<Backend, Counter>,
    unserved: Family<Cause, Counter>,
    refused: Family<Reason, Counter>,
    idle_closed: Counter,
    send_timeouts: Counter,
    shutdown_cuts: Counter,
    reloads: Family<ReloadResult, Counter>,
    chain_duration: Histogram,
    upstream_latency: Family<Account, Histogram, fn() -> Histogram>,
    state_errors: Family<Op, Counter>,
    state_ignored: Family<Reason, Counter>,
    state_lag: Histogram,
    trace_spans: Family<SpanOutcome, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Metrics {
            client_tokens: Family::default(),
            client_cost: Family::default(),
            client_requests: Family::default(),
            usage_handles: Default::default(),
            account_tokens: Family::default(),
            token_handles: Default::default(),
            stage_duration: Family::new_with_constructor(latency_histogram),
            stage_handles: Default::default(),
            registry: Registry::default(),
            requests: Family::default(),
            attempts: Family::default(),
            failovers: Family::default(),
            cooldowns: Family::default(),
            policy_errors: Family::default(),
            background_errors: Family::default(),
            parked: Counter::default(),
            stream_cuts: Family::default(),
            oauth_refreshes: Family::default(),
            overage: Family::default(),
            fallback: Family::default(),
            unserved: Family::default(),
            refused: Family::default(),
            idle_closed: Counter::default(),
            send_timeouts: Counter::default(),
            shutdown_cuts: Counter::default(),
            reloads: Family::default(),
            chain_duration: latency_histogram(),
            upstream_latency: Family::new_with_constructor(latency_histogram),
            state_errors: Family::default(),
            state_ignored: Family::default(),
            state_lag: latency_histogram(),
            trace_spans: Family::default(),
        };
        m.register_requests();
        m.register_serving();
        m.register_state();
        m.register_usage();
        m.register_tokens();
        m.register_stages();
        m
    }
}

// Registration, in the order `/metrics` lists the families. Counters are
// registered without their `_total`, which the OpenMetrics encoding appends;
// help texts without their final period, which it appends too.
impl Metrics {
    /// Requests and what happened to them: attempts, failovers, cooldowns, the
    /// chain's failures, refreshes, unserved and refused requests.
    fn register_requests(&mut self) {
        let r = &mut self.registry;
        r.register("poolgate_requests", "Client requests by serving account and final status", self.requests.clone());
        r.register(
            "poolgate_upstream_attempts",
            "Upstream attempts by account and status (\"connect_error\" when no response)",
            self.attempts.clone(),
        );
        r.register(
            "poolgate_failovers",
            "Requests moved to the next account, by the account left and why",
            self.failovers.clone(),
        );
        r.register("poolgate_cooldowns", "Cooldowns started, by account and cause", self.cooldowns.clone());
        r.register(
            "poolgate_policy_errors",
            "Chain stages that failed while ranking (routing_policy_error), by stage and cause",
            self.policy_errors.clone(),
        );
        r.register(
            "poolgate_policy_background_errors",
            "Chain stages that failed outside a ranking: in observe, or building a new instance (configure)",
            self.background_errors.clone(),
        );
        r.register(
            "poolgate_parked",
            "Requests answered locally with 429 because accounts were waiting out a quota and none could serve",
            self.parked.clone(),
        );
        r.register(
            "poolgate_stream_cuts",
            "Answers cut after their first byte reached the client, by account",
            self.stream_cuts.clone(),
        );
        r.register(
            "poolgate_oauth_refreshes",
            "OAuth seat refreshes by account and result (renewed, adopted, failed, needs_login)",
            self.oauth_refreshes.clone(),
        );
        r.register(
            "poolgate_overage_answers",
            "Subscription answers billed as extra usage, by account and the guard's action (allow, warn, avoid)",
            self.overage.clone(),
        );
        r.register(
            "poolgate_unserved",
            "Requests no account could serve, by the cause answered (parked, auth_refused, upstream_failed, upstream_cooling, no_account)",
            self.unserved.clone(),
        );
        r.register(
            "poolgate_refused",
            "Requests refused before any account was asked, by reason",
            self.refused.clone(),
        );
    }

    /// Connections, shutdown, fallback, reloads and latencies.
    fn register_serving(&mut self) {
        let r = &mut self.registry;
        r.register(
            "poolgate_idle_connections_closed",
            "Client connections closed for sending nothing: idle past server.idle_timeout_ms between requests, or \
             silent past server.header_timeout_ms after connecting",
            self.idle_closed.clone(),
        );
        r.register(
            "poolgate_send_timeouts",
            "Client connections closed for taking no byte of their answer for server.send_timeout_ms, their \
             requests' upstream cancelled",
            self.send_timeouts.clone(),
        );
        r.register(
            "poolgate_shutdown_cuts",
            "Answers still open when the shutdown grace period ended, cut (a stream with an SSE error event)",
            self.shutdown_cuts.clone(),
        );
        r.register(
            "poolgate_fallback",
            "Requests the pool could not serve that a fallback backend answered, by backend/model",
            self.fallback.clone(),
        );
        r.register("poolgate_reloads", "Configuration reloads by result", self.reloads.clone());
        r.register("poolgate_chain_duration_seconds", "Time to run the policy chain once", self.chain_duration.clone());
        r.register(
            "poolgate_upstream_latency_seconds",
            "Time from sending upstream to its response headers, by account",
            self.upstream_latency.clone(),
        );
    }

    /// The shared state backend.
    fn register_state(&mut self) {
        let r = &mut self.registry;
        r.register(
            "poolgate_state_backend_errors",
            "Shared state backend operations that failed, timed out or answered garbage, by operation",
            self.state_errors.clone(),
        );
        r.register(
            "poolgate_state_records_ignored",
            "Shared records not merged, by reason (other_identity, garbage)",
            self.state_ignored.clone(),
        );
        r.register(
            "poolgate_state_sync_lag_seconds",
            "How far behind its writer a shared record was when this replica applied it",
            self.state_lag.clone(),
        );
        r.register(
            "poolgate_trace_spans",
            "Spans of request traces ([telemetry]) by outcome: exported, or dropped because the queue was full or \
             the OTLP endpoint did not take them",
            self.trace_spans.clone(),
        );
    }
}

impl Metrics {
    /// A client request ended.
    pub fn request(&self, account: &str, status: u16) {
        self.requests.get_or_create(&AccountStatus { account: account.into(), status }).inc();
    }

    /// An upstream attempt ended.
    pub fn attempt(&self, account: &str, status: Option<u16>) {
        let labels = AccountAttempt { account: account.into(), status: AttemptStatus(status) };
        self.attempts.get_or_create(&labels).inc();
    }

    /// A request failed over away from `account`.
    pub fn failover(&self, account: &str, cause: &str) {
        self.failovers.get_or_create(&AccountCause { account: account.into(), cause: cause.into() }).inc();
    }

    /// A cooldown started.
    pub fn cooldown(&self, account: &str, reason: &str) {
        let labels = AccountReason { account: account.into(), reason: reason.into() };
        self.cooldowns.get_or_create(&labels).inc();
    }

    /// A chain stage failed in `phase`.
    pub fn policy_error(&self, stage: &str, phase: crate::policy::Phase, cause: &str) {
        let (stage, cause) = (Text::from(stage), Text::from(cause));
        match phase {
            crate::policy::Phase::Rank => self.policy_errors.get_or_create(&StageCause { stage, cause }).inc(),
            other => {
                self.background_errors.get_or_create(&StagePhaseCause { stage, phase: other.as_str(), cause }).inc()
            }
        };
    }

    /// A request was parked.
    pub fn parked(&self) {
        self.parked.inc();
    }

    /// A refresh of `account`'s OAuth seat ended with `result`.
    pub fn oauth_refresh(&self, account: &str, result: &str) {
        debug_assert!(zeros::known(&OAUTH_RESULTS, result), "{result} is not in OAUTH_RESULTS");
        self.oauth_refreshes.get_or_create(&AccountResult { account: account.into(), result: result.into() }).inc();
    }

    /// A fallback backend (`<name>/<model>`) answered for the pool.
    pub fn fallback(&self, backend: &str) {
        self.fallback.get_or_create(&Backend { backend: backend.into() }).inc();
    }

    /// Requests `backend` (`<name>/<model>`) answered for the pool.
    pub fn fallback_served(&self, backend: &str) -> u64 {
        self.fallback.get_or_create(&Backend { backend: backend.into() }).get()
    }

    /// An answer of `account` was billed as extra usage; the guard did `result`.
    pub fn overage(&self, account: &str, result: &str) {
        self.overage.get_or_create(&AccountResult { account: account.into(), result: result.into() }).inc();
    }

    /// An answer of `account` was cut after its first byte.
    pub fn stream_cut(&self, account: &str) {
        self.stream_cuts.get_or_create(&Account { account: account.into() }).inc();
    }

    /// No account could serve a request; `cause` is its ending.
    pub fn unserved(&self, cause: &'static str) {
        debug_assert!(zeros::known(&UNSERVED_CAUSES, cause), "{cause} is not in UNSERVED_CAUSES");
        self.unserved.get_or_create(&Cause { cause }).inc();
    }

    /// A request was refused before reaching an account.
    pub fn refused(&self, reason: &'static str) {
        debug_assert!(zeros::known(&REFUSED_REASONS, reason), "{reason} is not in REFUSED_REASONS");
        self.refused.get_or_create(&Reason { reason }).inc();
    }

    /// A client connection was closed for sending nothing.
    pub fn idle_closed(&self) {
        self.idle_closed.inc();
    }

    /// A client connection was closed for taking no byte for
    /// `server.send_timeout_ms`.
    pub fn send_timeout(&self) {
        self.send_timeouts.inc();
    }

    /// An answer was cut at the end of the shutdown grace period.
    pub fn shutdown_cut(&self) {
        self.shutdown_cuts.inc();
    }

    /// A shared state backend operation failed.
    pub fn state_error(&self, op: &'static str) {
        debug_assert!(zeros::known(&STATE_OPS, op), "{op} is not in STATE_OPS");
        self.state_errors.get_or_create(&Op { op }).inc();
    }

    /// A shared record was not merged.
    pub fn state_ignored(&self, reason: &'static str) {
        debug_assert!(zeros::known(&zeros::STATE_IGNORED, reason), "{reason} is not in STATE_IGNORED");
        self.state_ignored.get_or_create(&Reason { reason }).inc();
    }

    /// A shared record was applied `seconds` after it was written.
    pub fn state_lag(&self, seconds: f64) {
        self.state_lag.observe(seconds);
    }

    /// `n` spans were exported, or dropped (`outcome`, one of
    /// `exported`, `dropped_queue_full`, `dropped_export_failed`).
    pub fn trace_spans(&self, outcome: &'static str, n: u64) {
        debug_assert!(zeros::known(&zeros::SPAN_OUTCOMES, outcome), "{outcome} is not in SPAN_OUTCOMES");
        self.trace_spans.get_or_create(&SpanOutcome { outcome }).inc_by(n);
    }

    /// A reload finished.
    pub fn reload(&self, ok: bool) {
        self.reloads.get_or_create(&ReloadResult { result: if ok { "ok" } else { "error" } }).inc();
    }

    /// The chain ran.
    pub fn chain_duration(&self, seconds: f64) {
        self.chain_duration.observe(seconds);
    }

    /// An upstream answered (headers).
    pub fn upstream_latency(&self, account: &str, seconds: f64) {
        self.upstream_latency.get_or_create(&Account { account: account.into() }).observe(seconds);
    }

    /// Renders every family, plus the gauges passed in, as one OpenMetrics
    /// exposition ([`CONTENT_TYPE`]).
    pub fn render(&self, gauges: &[Gauge<'_>]) -> String {
        let mut live = Registry::default();
        for (name, help, values) in gauges {
            let family = Family::<Labels, GaugeMetric<f64, std::sync::atomic::AtomicU64>>::default();
            for (labels, v) in values {
                family.get_or_create(labels).set(*v);
            }
            live.register(*name, help.trim_end_matches('.'), family);
        }
        let mut out = String::with_capacity(8 * 1024);
        // Writing to a String cannot fail.
        let _ = text::encode_registry(&mut out, &self.registry);
        let _ = text::encode_registry(&mut out, &live);
        let _ = text::encode_eof(&mut out);
        out
    }
}

/// Builds a label list.
pub fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, Text::from(*v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges_as_openmetrics() {
        let m = Metrics::default();
        m.request("a", 200);
        m.request("a", 200);
        m.attempt("a", None);
        m.policy_error("builtin:x", crate::policy::Phase::Rank, "trap");
        m.chain_duration(0.00002);
        let text = m.render(&[("poolgate_in_flight", "In flight.", vec![(labels(&[("account", "a")]), 3.0)])]);
        assert!(text.contains("poolgate_requests_total{account=\"a\",status=\"200\"} 2"), "{text}");
        assert!(text.contains("poolgate_upstream_attempts_total{account=\"a\",status=\"connect_error\"} 1"), "{text}");
        assert!(text.contains("poolgate_policy_errors_total{stage=\"builtin:x\",cause=\"trap\"} 1"), "{text}");
        assert!(text.contains("poolgate_chain_duration_seconds_bucket{le=\"0.000025\"} 1"), "{text}");
        assert!(text.contains("poolgate_chain_duration_seconds_count 1"), "{text}");
        assert!(text.contains("poolgate_in_flight{account=\"a\"} 3.0"), "{text}");
        assert!(text.contains("# HELP poolgate_in_flight In flight.\n"), "{text}");
        assert!(text.contains("# TYPE poolgate_requests counter"), "{text}");
        assert!(text.ends_with("# EOF\n"), "one exposition, one end: {text}");
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.request("a\"b\\c\nd", 200);
        let text = m.render(&[]);
        assert!(text.contains("account=\"a\\\"b\\\\c\\nd\""), "{text}");
    }
}
