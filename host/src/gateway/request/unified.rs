//! Phase *answer*, for an account's answer: the
//! `anthropic-ratelimit-unified-*` headers the client gets describe the pool
//! it draws on, not the one seat that served (`[gateway] unified_headers`,
//! `learned::pooled` for the semantics).
//!
//! What is rewritten: the top-level `status`, `reset` and
//! `representative-claim`, and for each pooled window its `-utilization`,
//! `-reset` and `-status` (its `-surpassed-threshold`, a seat's own, is
//! taken away with them). Everything else in the family — overage, fallback,
//! upgrade paths, members not known today — is relayed as the serving
//! account sent it: nothing is dropped silently. `x-poolgate-unified` says
//! the headers are pooled and over how many accounts. A pool with no
//! subscription readings (API keys) leaves the answer as it came.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::account::Status;
use crate::config::UnifiedHeaders;
use crate::gateway::generation::Generation;
use crate::learned::pooled::{PooledQuota, Seat, SeatWindow, claim, pooled_seats};

const PREFIX: &str = "anthropic-ratelimit-unified-";

/// The quota of the pool `generation`'s clients draw on at `now_ms`: its
/// accounts but those an operator disabled at run time (as a config's
/// `enabled = false` does, that takes one out of the pool).
pub fn pool_quota(generation: &Generation, now_ms: u64) -> Option<PooledQuota> {
    // Most answers of an API-key pool: nothing to pool, no account read.
    // Pooling reads each account's top-level reading and its pooled windows,
    // under its lock, into two lists: no snapshot of it copied (#30).
    let (mut seats, mut windows) = (Vec::new(), Vec::new());
    for a in (generation.accounts.iter()).filter(|a| !a.state.is_runtime_disabled() && a.state.has_unified()) {
        a.state.with_view(&a.config, now_ms, |s, readings| {
            seats.push(Seat { disabled: s.disabled, status: s.status, resets_at_ms: s.resets_at_ms });
            let seat = seats.len() - 1;
            windows.extend(readings.filter_map(|w| SeatWindow::of(seat, w, window_name(&w.name))));
        });
    }
    pooled_seats(&seats, &windows, now_ms)
}

/// A window's name, copied only when it is not one every subscription reads.
fn window_name(name: &str) -> Cow<'static, str> {
    match name {
        "5h" => Cow::Borrowed("5h"),
        "7d" => Cow::Borrowed("7d"),
        other => Cow::Owned(other.to_string()),
    }
}

/// The pool's quota as `/v1/usage` answers it.
pub fn pool_json(pool: &PooledQuota) -> serde_json::Value {
    let windows: Vec<serde_json::Value> = (pool.windows.iter())
        .map(|w| {
            serde_json::json!({
                "window": w.name,
                "claim": claim(&w.name),
                "utilization": (w.utilization * 10_000.0).round() / 10_000.0,
                "resets_at": w.reset_ms.map(crate::ledger::calendar::rfc3339),
                "status": status(w.status),
            })
        })
        .collect();
    serde_json::json!({
        "accounts": pool.accounts,
        "status": status(pool.status),
        "binding": pool.binding().map(|w| claim(&w.name)),
        "windows": windows,
    })
}

/// Rewrites the unified headers of an account's answer to `generation`'s
/// pool at `now_ms` (when the config asks for the pool's).
pub fn pool_headers(generation: &Generation, headers: &mut HeaderMap, now_ms: u64) {
    if generation.config.gateway.unified_headers != UnifiedHeaders::Pool {
        return;
    }
    let Some(pool) = pool_quota(generation, now_ms) else { return };
    let reset = |ms: Option<u64>| ms.map(|r| r.div_ceil(1000).to_string());
    for w in &pool.windows {
        let [utilization, reset_name, status_name, surpassed] = window_names(&w.name);
        put(headers, utilization, Some(fraction(w.utilization)));
        put(headers, reset_name, reset(w.reset_ms));
        put(headers, status_name, status(w.status));
        put(headers, surpassed, None);
    }
    put(headers, Name::Static(&STATUS), status(pool.status));
    if let Some(b) = pool.binding() {
        put(headers, Name::Static(&CLAIM), Some(claim(&b.name)));
        put(headers, Name::Static(&RESET), reset(b.reset_ms));
    }
    headers.insert(
        HeaderName::from_static("x-poolgate-unified"),
        HeaderValue::from_str(&format!("pool; accounts={}", pool.accounts)).expect("ascii"),
    );
}

/// A header's name: written out once (the headers of every pool's windows),
/// or made for a window of another name.
enum Name {
    Static(&'static HeaderName),
    Made(String),
}

static STATUS: HeaderName = HeaderName::from_static("anthropic-ratelimit-unified-status");
static CLAIM: HeaderName = HeaderName::from_static("anthropic-ratelimit-unified-representative-claim");
static RESET: HeaderName = HeaderName::from_static("anthropic-ratelimit-unified-reset");
/// The `-utilization`, `-reset`, `-status` and `-surpassed-threshold` names
/// of the 5h and 7d windows, which every subscription's answer carries: not
/// joined and parsed again for every answer (#30).
static FIVE_HOUR: [HeaderName; 4] = [
    HeaderName::from_static("anthropic-ratelimit-unified-5h-utilization"),
    HeaderName::from_static("anthropic-ratelimit-unified-5h-reset"),
    HeaderName::from_static("anthropic-ratelimit-unified-5h-status"),
    HeaderName::from_static("anthropic-ratelimit-unified-5h-surpassed-threshold"),
];
static SEVEN_DAY: [HeaderName; 4] = [
    HeaderName::from_static("anthropic-ratelimit-unified-7d-utilization"),
    HeaderName::from_static("anthropic-ratelimit-unified-7d-reset"),
    HeaderName::from_static("anthropic-ratelimit-unified-7d-status"),
    HeaderName::from_static("anthropic-ratelimit-unified-7d-surpassed-threshold"),
];
const SUFFIXES: [&str; 4] = ["utilization", "reset", "status", "surpassed-threshold"];

/// `PREFIX<window>-<suffix>` for each of [`SUFFIXES`].
fn window_names(window: &str) -> [Name; 4] {
    let known = match window {
        "5h" => Some(&FIVE_HOUR),
        "7d" => Some(&SEVEN_DAY),
        _ => None,
    };
    std::array::from_fn(|i| match known {
        Some(names) => Name::Static(&names[i]),
        None => Name::Made(format!("{PREFIX}{window}-{}", SUFFIXES[i])),
    })
}

/// Sets header `name` to `value`, or takes it away (`None`).
fn put(headers: &mut HeaderMap, name: Name, value: Option<String>) {
    let name = match name {
        Name::Static(n) => n.clone(),
        Name::Made(n) => match HeaderName::try_from(n) {
            Ok(n) => n,
            Err(_) => return,
        },
    };
    match value.and_then(|v| HeaderValue::try_from(v).ok()) {
        Some(v) => drop(headers.insert(name, v)),
        None => drop(headers.remove(name)),
    }
}

/// A fraction as Anthropic writes one: up to four decimals, no trailing
/// zeros.
fn fraction(v: f64) -> String {
    let rounded = (v * 10_000.0).round() / 10_000.0;
    format!("{rounded}")
}

fn status(s: Status) -> Option<String> {
    match s {
        Status::Allowed => Some("allowed".into()),
        Status::AllowedWarning => Some("allowed_warning".into()),
        Status::Rejected => Some("rejected".into()),
        Status::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_header_names_are_the_prefix_the_window_and_the_suffix() {
        for window in ["5h", "7d", "7d_opus", "7d_oauth_apps"] {
            let names = window_names(window).map(|n| match n {
                Name::Static(n) => n.as_str().to_string(),
                Name::Made(n) => n,
            });
            let want = SUFFIXES.map(|s| format!("{PREFIX}{window}-{s}"));
            assert_eq!(names, want);
        }
        for (name, suffix) in [(&STATUS, "status"), (&CLAIM, "representative-claim"), (&RESET, "reset")] {
            assert_eq!(name.as_str(), format!("{PREFIX}{suffix}"));
        }
    }

    #[test]
    fn fractions_read_as_anthropic_writes_them() {
        assert_eq!(fraction(0.42), "0.42");
        assert_eq!(fraction(1.0 / 3.0), "0.3333");
        assert_eq!(fraction(1.02), "1.02");
        assert_eq!(fraction(0.0), "0");
    }
}
