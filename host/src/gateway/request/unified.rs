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

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::account::Status;
use crate::config::UnifiedHeaders;
use crate::gateway::generation::Generation;
use crate::learned::pooled::{PooledQuota, claim, pooled};

const PREFIX: &str = "anthropic-ratelimit-unified-";

/// The quota of the pool `generation`'s clients draw on at `now_ms`: its
/// accounts but those an operator disabled at run time (as a config's
/// `enabled = false` does, that takes one out of the pool).
pub fn pool_quota(generation: &Generation, now_ms: u64) -> Option<PooledQuota> {
    // Most answers of an API-key pool: nothing to pool, no snapshot taken.
    let snapshots: Vec<_> = (generation.accounts.iter())
        .filter(|a| !a.state.is_runtime_disabled() && a.state.has_unified())
        .map(|a| a.state.snapshot(&a.config, now_ms))
        .collect();
    pooled(&snapshots, now_ms)
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
        put(headers, &format!("{}-utilization", w.name), Some(fraction(w.utilization)));
        put(headers, &format!("{}-reset", w.name), reset(w.reset_ms));
        put(headers, &format!("{}-status", w.name), status(w.status));
        put(headers, &format!("{}-surpassed-threshold", w.name), None);
    }
    put(headers, "status", status(pool.status));
    if let Some(b) = pool.binding() {
        put(headers, "representative-claim", Some(claim(&b.name)));
        put(headers, "reset", reset(b.reset_ms));
    }
    headers.insert(
        "x-poolgate-unified",
        HeaderValue::from_str(&format!("pool; accounts={}", pool.accounts)).expect("ascii"),
    );
}

/// Sets `PREFIX<suffix>` to `value`, or takes it away (`None`).
fn put(headers: &mut HeaderMap, suffix: &str, value: Option<String>) {
    let Ok(name) = HeaderName::try_from(format!("{PREFIX}{suffix}")) else { return };
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
    fn fractions_read_as_anthropic_writes_them() {
        assert_eq!(fraction(0.42), "0.42");
        assert_eq!(fraction(1.0 / 3.0), "0.3333");
        assert_eq!(fraction(1.02), "1.02");
        assert_eq!(fraction(0.0), "0");
    }
}
