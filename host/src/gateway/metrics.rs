//! Prometheus metrics, rendered in the text exposition format.
//!
//! A handful of labelled counters and histograms kept in plain maps: the label
//! sets are small and bounded (accounts, stages, causes, statuses), so a mutex
//! per family costs less than a metrics framework and keeps the output exactly
//! as documented. No label ever carries a secret: accounts appear by id.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use parking_lot::Mutex;

type Labels = Vec<(&'static str, String)>;

/// A gauge family for [`Metrics::render`]: name, help, values by labels.
pub type Gauge<'a> = (&'a str, &'a str, Vec<(Labels, f64)>);

struct Counter {
    name: &'static str,
    help: &'static str,
    values: Mutex<BTreeMap<Labels, u64>>,
}

impl Counter {
    const fn new(name: &'static str, help: &'static str) -> Self {
        Counter { name, help, values: Mutex::new(BTreeMap::new()) }
    }

    fn add(&self, labels: Labels, n: u64) {
        *self.values.lock().entry(labels).or_default() += n;
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}\n# TYPE {} counter", self.name, self.help, self.name);
        for (labels, v) in self.values.lock().iter() {
            let _ = writeln!(out, "{}{} {v}", self.name, fmt_labels(labels));
        }
    }
}

/// Latency buckets, seconds: from 10 µs (a chain) to 10 min (a long stream).
const BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0, 5.0, 30.0, 120.0, 600.0,
];

#[derive(Default, Clone)]
struct HistogramData {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

struct Histogram {
    name: &'static str,
    help: &'static str,
    values: Mutex<BTreeMap<Labels, HistogramData>>,
}

impl Histogram {
    const fn new(name: &'static str, help: &'static str) -> Self {
        Histogram { name, help, values: Mutex::new(BTreeMap::new()) }
    }

    fn observe(&self, labels: Labels, seconds: f64) {
        let mut map = self.values.lock();
        let h = map.entry(labels).or_default();
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            h.counts[i] += 1;
        }
        h.sum += seconds;
        h.count += 1;
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}\n# TYPE {} histogram", self.name, self.help, self.name);
        for (labels, h) in self.values.lock().iter() {
            let mut cumulative = 0;
            for (i, b) in BUCKETS.iter().enumerate() {
                cumulative += h.counts[i];
                let mut l = labels.clone();
                l.push(("le", format!("{b}")));
                let _ = writeln!(out, "{}_bucket{} {cumulative}", self.name, fmt_labels(&l));
            }
            let mut l = labels.clone();
            l.push(("le", "+Inf".into()));
            let _ = writeln!(out, "{}_bucket{} {}", self.name, fmt_labels(&l), h.count);
            let _ = writeln!(out, "{}_sum{} {}", self.name, fmt_labels(labels), h.sum);
            let _ = writeln!(out, "{}_count{} {}", self.name, fmt_labels(labels), h.count);
        }
    }
}

fn fmt_labels(labels: &Labels) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// The gateway's metrics.
pub struct Metrics {
    requests: Counter,
    attempts: Counter,
    failovers: Counter,
    cooldowns: Counter,
    policy_errors: Counter,
    background_errors: Counter,
    parked: Counter,
    reloads: Counter,
    chain_duration: Histogram,
    upstream_latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Counter::new("poolgate_requests_total", "Client requests by serving account and final status."),
            attempts: Counter::new(
                "poolgate_upstream_attempts_total",
                "Upstream attempts by account and status (\"connect_error\" when no response).",
            ),
            failovers: Counter::new(
                "poolgate_failovers_total",
                "Requests moved to the next account, by the account left and why.",
            ),
            cooldowns: Counter::new("poolgate_cooldowns_total", "Cooldowns started, by account and cause."),
            policy_errors: Counter::new(
                "poolgate_policy_errors_total",
                "Chain stages that failed while ranking (routing_policy_error), by stage and cause.",
            ),
            background_errors: Counter::new(
                "poolgate_policy_background_errors_total",
                "Chain stages that failed outside a ranking: in observe, or building a new instance (configure).",
            ),
            parked: Counter::new(
                "poolgate_parked_total",
                "Requests answered locally with 429 because every account was cooling.",
            ),
            reloads: Counter::new("poolgate_reloads_total", "Configuration reloads by result."),
            chain_duration: Histogram::new("poolgate_chain_duration_seconds", "Time to run the policy chain once."),
            upstream_latency: Histogram::new(
                "poolgate_upstream_latency_seconds",
                "Time from sending upstream to its response headers, by account.",
            ),
        }
    }
}

impl Metrics {
    /// A client request ended.
    pub fn request(&self, account: &str, status: u16) {
        self.requests.add(vec![("account", account.to_string()), ("status", status.to_string())], 1);
    }

    /// An upstream attempt ended.
    pub fn attempt(&self, account: &str, status: Option<u16>) {
        let status = status.map_or_else(|| "connect_error".to_string(), |s| s.to_string());
        self.attempts.add(vec![("account", account.to_string()), ("status", status)], 1);
    }

    /// A request failed over away from `account`.
    pub fn failover(&self, account: &str, cause: &str) {
        self.failovers.add(vec![("account", account.to_string()), ("cause", cause.to_string())], 1);
    }

    /// A cooldown started.
    pub fn cooldown(&self, account: &str, reason: &str) {
        self.cooldowns.add(vec![("account", account.to_string()), ("reason", reason.to_string())], 1);
    }

    /// A chain stage failed in `phase`.
    pub fn policy_error(&self, stage: &str, phase: crate::policy::Phase, cause: &str) {
        let (stage, cause) = (stage.to_string(), cause.to_string());
        match phase {
            crate::policy::Phase::Rank => self.policy_errors.add(vec![("stage", stage), ("cause", cause)], 1),
            other => self
                .background_errors
                .add(vec![("stage", stage), ("phase", other.as_str().to_string()), ("cause", cause)], 1),
        }
    }

    /// A request was parked.
    pub fn parked(&self) {
        self.parked.add(Vec::new(), 1);
    }

    /// A reload finished.
    pub fn reload(&self, ok: bool) {
        self.reloads.add(vec![("result", if ok { "ok" } else { "error" }.to_string())], 1);
    }

    /// The chain ran.
    pub fn chain_duration(&self, seconds: f64) {
        self.chain_duration.observe(Vec::new(), seconds);
    }

    /// An upstream answered (headers).
    pub fn upstream_latency(&self, account: &str, seconds: f64) {
        self.upstream_latency.observe(vec![("account", account.to_string())], seconds);
    }

    /// Renders every family, plus the gauges passed in.
    pub fn render(&self, gauges: &[Gauge<'_>]) -> String {
        let mut out = String::with_capacity(8 * 1024);
        for c in [
            &self.requests,
            &self.attempts,
            &self.failovers,
            &self.cooldowns,
            &self.policy_errors,
            &self.background_errors,
            &self.parked,
            &self.reloads,
        ] {
            c.render(&mut out);
        }
        self.chain_duration.render(&mut out);
        self.upstream_latency.render(&mut out);
        for (name, help, values) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (labels, v) in values {
                let _ = writeln!(out, "{name}{} {v}", fmt_labels(labels));
            }
        }
        out
    }
}

/// Builds a label list.
pub fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges_in_exposition_format() {
        let m = Metrics::default();
        m.request("a", 200);
        m.request("a", 200);
        m.policy_error("builtin:x", crate::policy::Phase::Rank, "trap");
        m.chain_duration(0.00002);
        let text = m.render(&[("poolgate_in_flight", "In flight.", vec![(labels(&[("account", "a")]), 3.0)])]);
        assert!(text.contains("poolgate_requests_total{account=\"a\",status=\"200\"} 2"), "{text}");
        assert!(
            text.contains("poolgate_policy_errors_total{cause=\"trap\",stage=\"builtin:x\"} 1")
                || text.contains("poolgate_policy_errors_total{stage=\"builtin:x\",cause=\"trap\"} 1"),
            "{text}"
        );
        assert!(text.contains("poolgate_chain_duration_seconds_bucket{le=\"0.000025\"} 1"), "{text}");
        assert!(text.contains("poolgate_chain_duration_seconds_count 1"));
        assert!(text.contains("poolgate_in_flight{account=\"a\"} 3"));
        assert!(text.contains("# TYPE poolgate_requests_total counter"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(fmt_labels(&vec![("k", "a\"b\\c\nd".to_string())]), "{k=\"a\\\"b\\\\c\\nd\"}");
    }
}
