//! What the usage ledger answers over HTTP: a client its own key's usage
//! (`GET /v1/usage`, with its client key), an operator any report
//! (`GET /admin/usage`, with the admin token), as JSON or CSV.
//!
//! A key's own usage is read from its meter (the ledger's totals, read after
//! each write, and what this replica answered since): a status line polling
//! it costs no query. It comes with the pool's quota, as the unified
//! headers of an answer describe it (`request::unified`). A report asks the ledger, which first writes what is queued. Both
//! count every request answered before they were asked.

use axum::extract::{Query as QueryString, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::handlers::{AppState, admin_refused, json};
use crate::gateway::Gateway;
use crate::gateway::generation::Generation;
use crate::gateway::request::errors::{ErrorType, error, final_error};
use crate::ledger::calendar::{Period, parse_time, rfc3339};
use crate::ledger::report::{self, Dim, Query, Row};

/// The answer of a gateway that keeps no ledger.
fn no_ledger() -> Response {
    let msg = "poolgate: this gateway keeps no usage ledger ([ledger] file = \"\")";
    final_error(StatusCode::NOT_FOUND, ErrorType::NotFound, msg)
}

/// The ledger's answer, or a 503 saying why it has none now.
async fn ask(ledger: &crate::ledger::Ledger, query: Query) -> Result<Vec<Row>, Box<Response>> {
    ledger.report(query).await.map_err(|e| {
        let msg = format!("poolgate: the usage ledger cannot answer now: {e:#}");
        Box::new(error(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Api, &msg))
    })
}

/// A period's totals as a client reads them.
fn period_json(period: Period, (from, to): (u64, u64), spent: &crate::ledger::limits::Spent) -> serde_json::Value {
    let u = &spent.usage;
    serde_json::json!({
        "period": period.name(),
        "from": rfc3339(from),
        "resets_at": rfc3339(to),
        "requests": spent.requests,
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "tokens": u.total(),
        "cost_usd": report::usd(spent.nano_usd),
    })
}

/// `GET /v1/usage`: the calling key's usage this UTC day, week (from
/// Monday) and month. Without client keys, the whole gateway's (key `-`).
pub async fn client_usage(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let g = s.gateway.generation();
    let key = match crate::gateway::keys::identify(&s.gateway, &g, &headers) {
        Ok(key) => key.unwrap_or_else(|| "-".to_string()),
        Err(r) => return *r,
    };
    if s.gateway.ledger.is_none() {
        return no_ledger();
    }
    let mut answer = key_usage(&s.gateway, &g, &key);
    let pool = crate::gateway::request::unified::pool_quota(&g, s.gateway.clock.now_ms());
    answer["pool"] = pool.as_ref().map(crate::gateway::request::unified::pool_json).into();
    json(&answer)
}

/// `key`'s usage this day, week and month and its budgets, from its meter —
/// what admission checks (no query per status line or page update).
pub fn key_usage(gw: &Gateway, g: &Generation, key: &str) -> serde_json::Value {
    let team = crate::gateway::keys::team(gw, g, key);
    let budgets = budgets(gw, crate::gateway::keys::policy(gw, g, key).as_ref(), key);
    let now = gw.clock.now_ms();
    let meter = gw.meters.meter(key);
    let periods: Vec<serde_json::Value> = [Period::Day, Period::Week, Period::Month]
        .into_iter()
        .map(|p| period_json(p, p.around(now), &meter.spent(p, now)))
        .collect();
    serde_json::json!({ "key": key, "team": team, "now": rfc3339(now), "usage": periods, "budgets": budgets })
}

/// The key's budgets as its meter holds them (what admission checks): the
/// limit, what is spent and left, when it resets.
fn budgets(gw: &Gateway, policy: Option<&crate::ledger::limits::KeyPolicy>, key: &str) -> Vec<serde_json::Value> {
    use crate::ledger::limits::Amount;
    let Some(policy) = policy else { return Vec::new() };
    let now = gw.clock.now_ms();
    let meter = gw.meters.meter(key);
    let usd = |nano: u64| report::usd(nano);
    policy
        .budgets
        .iter()
        .map(|b| {
            let spent = meter.spent(b.period, now);
            let resets_at = rfc3339(b.period.around(now).1);
            match b.amount {
                Amount::Tokens(max) => serde_json::json!({
                    "period": b.period.name(), "unit": "tokens", "limit": max, "spent": spent.tokens(),
                    "remaining": max.saturating_sub(spent.tokens()), "resets_at": resets_at,
                }),
                Amount::NanoUsd(max) => serde_json::json!({
                    "period": b.period.name(), "unit": "usd", "limit": usd(max), "spent": usd(spent.nano_usd),
                    "remaining": usd(max.saturating_sub(spent.nano_usd)), "resets_at": resets_at,
                }),
            }
        })
        .collect()
}

/// The query string of `GET /admin/usage`.
#[derive(Deserialize)]
pub struct ReportParams {
    from: Option<String>,
    to: Option<String>,
    by: Option<String>,
    key: Option<String>,
    format: Option<String>,
}

/// `GET /admin/usage?from=&to=&by=key,model&key=&format=json|csv`: totals
/// over a range (default: this UTC month so far), grouped by any of key,
/// team, model, account and day.
pub async fn admin_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    QueryString(p): QueryString<ReportParams>,
) -> Response {
    if let Some(r) = admin_refused(&s, &headers) {
        return r;
    }
    let Some(ledger) = s.gateway.ledger.as_deref() else { return no_ledger() };
    let now = s.gateway.clock.now_ms();
    let query = match query(&p, now) {
        Ok(q) => q,
        Err(msg) => return final_error(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, &msg),
    };
    let rows = match ask(ledger, query.clone()).await {
        Ok(rows) => rows,
        Err(r) => return *r,
    };
    match p.format.as_deref() {
        Some("csv") => {
            ([(http::header::CONTENT_TYPE, "text/csv; charset=utf-8")], report::csv(&query.by, &rows)).into_response()
        }
        _ => json(&serde_json::json!({
            "from": rfc3339(query.from_ms),
            "to": rfc3339(query.to_ms),
            "by": query.by,
            "key": query.key,
            "rows": report::json(&rows),
        })),
    }
}

/// The report `p` asks for, or what is wrong with it.
fn query(p: &ReportParams, now: u64) -> Result<Query, String> {
    let time = |name: &str, v: &Option<String>, default: u64| match v {
        None => Ok(default),
        Some(v) => parse_time(v).ok_or_else(|| {
            format!("poolgate: {name}=`{v}` is not a time (ms since the epoch, YYYY-MM-DD or RFC 3339)")
        }),
    };
    let from_ms = time("from", &p.from, Period::Month.around(now).0)?;
    let to_ms = time("to", &p.to, now + 1)?;
    if to_ms <= from_ms {
        return Err(format!("poolgate: `to` ({}) is not after `from` ({})", rfc3339(to_ms), rfc3339(from_ms)));
    }
    let mut by = Vec::new();
    for name in p.by.as_deref().unwrap_or("").split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let dim = Dim::parse(name)
            .ok_or_else(|| format!("poolgate: by=`{name}` is not one of key, team, model, account, day"))?;
        if !by.contains(&dim) {
            by.push(dim);
        }
    }
    if let Some(f) = p.format.as_deref().filter(|f| !["json", "csv"].contains(f)) {
        return Err(format!("poolgate: format=`{f}` is not json or csv"));
    }
    Ok(Query { from_ms, to_ms, key: p.key.clone(), by })
}
