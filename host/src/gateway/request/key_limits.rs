//! Phase *read*, its last step: the client key's own limits — the models it
//! may ask for, its requests in flight, per minute, and its budgets
//! (`crate::ledger::limits`) — checked before anything is sent anywhere, on
//! every route that asks a model (Messages, count_tokens, Chat Completions;
//! the fallback too, since it is reached only through them).
//!
//! A refusal is the route's own error shape (a chat client's is OpenAI's),
//! names the limit (`x-poolgate-key-limit`) and when it frees: a 429 with
//! `retry-after` for a limit that frees within the minute; a 429 that says
//! not to retry (`x-should-retry: false`) for a spent budget, which frees at
//! the period's end; a 403 for a model the key may not use.

use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

use super::errors::{ErrorType, error, final_error};
use super::read::Incoming;
use crate::gateway::Gateway;
use crate::gateway::generation::Generation;
use crate::ledger::limits::{Amount, KeyLease, Refusal};

/// Admits the request of `incoming`'s key for `model`, or gives the answer
/// saying why not (for the caller to refuse with, as `key_limit`). `None`:
/// the key has no limits (or there are no keys).
pub fn admit(
    gw: &Gateway,
    generation: &Generation,
    incoming: &Incoming,
    model: &str,
) -> Result<Option<KeyLease>, Box<Response>> {
    let Some(key) = incoming.client.as_deref() else { return Ok(None) };
    let Some(policy) = crate::gateway::keys::policy(gw, generation, key) else { return Ok(None) };
    let now = gw.clock.now_ms();
    // A USD budget cannot count what has no price: such a model would
    // spend it without end.
    let usd = policy.budgets.iter().any(|b| matches!(b.amount, Amount::NanoUsd(_)));
    if usd && generation.prices.of(model).is_none() {
        let refusal = Refusal {
            status: 403,
            limit: "model_not_priced".into(),
            message: format!("this key has a USD budget and `{model}` has no price in [prices], so it cannot count it"),
            frees_at_ms: None,
        };
        return Err(Box::new(incoming.dialect.whole(response(&refusal, now))));
    }
    match gw.meters.admit(key, &policy, model, now) {
        Ok(lease) => Ok(Some(lease)),
        Err(refusal) => {
            let mut r = incoming.dialect.whole(response(&refusal, now));
            budget_headers(gw, generation, Some(key), r.headers_mut());
            Err(Box::new(r))
        }
    }
}

/// The answer to a refused request, in Anthropic's shape.
fn response(refusal: &Refusal, now_ms: u64) -> Response {
    let message = format!("poolgate: {}", refusal.message);
    let mut r = match (refusal.status, refusal.limit.starts_with("budget_")) {
        (403, _) => final_error(StatusCode::FORBIDDEN, ErrorType::Permission, &message),
        (_, true) => final_error(StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimit, &message),
        _ => error(StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimit, &message),
    };
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&refusal.limit) {
        h.insert("x-poolgate-key-limit", v);
    }
    if let Some(at) = refusal.frees_at_ms {
        h.insert(header::RETRY_AFTER, HeaderValue::from(at.saturating_sub(now_ms).div_ceil(1000).max(1)));
    }
    r
}

/// Writes the key's budgets on an answer, one pair of headers per budget:
/// `x-poolgate-budget-<period>-<tokens|usd>-remaining` (what is left as of
/// the answer's start, never below 0) and `…-reset` (RFC 3339). Nothing for
/// a key without budgets.
pub fn budget_headers(gw: &Gateway, generation: &Generation, key: Option<&str>, headers: &mut http::HeaderMap) {
    let Some((key, policy)) = key.and_then(|k| Some((k, crate::gateway::keys::policy(gw, generation, k)?))) else {
        return;
    };
    if policy.budgets.is_empty() {
        return;
    }
    let now = gw.clock.now_ms();
    let meter = gw.meters.meter(key);
    for b in &policy.budgets {
        let spent = meter.spent(b.period, now);
        let (unit, left) = match b.amount {
            Amount::Tokens(max) => ("tokens", max.saturating_sub(spent.tokens()).to_string()),
            Amount::NanoUsd(max) => ("usd", format!("{:.4}", max.saturating_sub(spent.nano_usd) as f64 / 1e9)),
        };
        let name = format!("x-poolgate-budget-{}-{unit}", b.period.name());
        let reset = crate::ledger::calendar::rfc3339(b.period.around(now).1);
        for (suffix, value) in [("remaining", left), ("reset", reset)] {
            if let (Ok(n), Ok(v)) =
                (http::HeaderName::try_from(format!("{name}-{suffix}")), HeaderValue::from_str(&value))
            {
                headers.insert(n, v);
            }
        }
    }
}
