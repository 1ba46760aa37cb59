//! `GET /api/oauth/usage` and `GET /api/oauth/profile`: what a subscription login can ask
//! about itself.
//!
//! The usage answer is the seat account's scripted [`Quota`] seen the way claude.ai shows
//! it (integer percents, RFC 3339 resets, one entry per limit), so a gateway that polls
//! usage and one that reads response headers see the same numbers from one script.

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use poolgate_wire::error::{self, ErrorType};
use poolgate_wire::ratelimit::{Quota, Window, rfc3339};
use serde_json::{Value, json};

use super::{Access, Authority, EXPIRED, Identity, OAUTH_BETA, json, now_ms};
use crate::script::Account;
use crate::server::bearer;

/// Answers a usage request from the seat account's current quota.
pub(crate) fn usage(authority: &Authority, headers: &HeaderMap, request_id: &HeaderValue) -> Response {
    authority.state().usage_requests += 1;
    let (token, account, _) = match authorize(authority, headers) {
        Ok(seat) => seat,
        Err(refusal) => return refuse(refusal, request_id),
    };
    if let Err(wait_s) = authority.usage_slot(token) {
        let body = error::body(ErrorType::RateLimit, "Rate limited. Please try again later.", None);
        let mut response = json(429, body, request_id);
        response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(wait_s));
        return response;
    }
    json(200, usage_body(&account.quota()).to_string(), request_id)
}

/// Answers a profile request with whom the seat is logged in as.
pub(crate) fn profile(authority: &Authority, headers: &HeaderMap, request_id: &HeaderValue) -> Response {
    match authorize(authority, headers) {
        Ok((_, _, identity)) => json(200, profile_body(&identity).to_string(), request_id),
        Err(refusal) => refuse(refusal, request_id),
    }
}

/// The 401 of a request [`authorize`] refused.
fn refuse(message: &str, request_id: &HeaderValue) -> Response {
    json(401, error::body(ErrorType::Authentication, message, None), request_id)
}

/// The live access token of a seat, with its account and identity, or why the request is
/// refused. These routes exist only for OAuth: they need the beta flag, and an API key is
/// as good as no credential.
fn authorize<'h>(authority: &Authority, headers: &'h HeaderMap) -> Result<(&'h str, Account, Identity), &'static str> {
    let beta = headers.get_all("anthropic-beta").iter().filter_map(|v| v.to_str().ok());
    if !beta.flat_map(|v| v.split(',')).any(|flag| flag.trim() == OAUTH_BETA) {
        return Err("OAuth authentication is currently not supported.");
    }
    let Some(token) = bearer(headers) else { return Err("Invalid bearer token") };
    match authority.access(token, now_ms()) {
        Some(Access::Valid { account, seat, .. }) => Ok((token, account, authority.identity(seat))),
        Some(Access::Expired) => Err(EXPIRED),
        None => Err("Invalid bearer token"),
    }
}

/// `{"five_hour":…,"seven_day":…,"limits":[…]}`; a window the quota does not have is
/// `null` and has no entry in `limits`.
pub(crate) fn usage_body(quota: &Quota) -> Value {
    let window = |w: &Option<Window>| {
        w.as_ref().map_or(Value::Null, |w| json!({"utilization": percent(w), "resets_at": rfc3339(w.reset_s)}))
    };
    let mut limits = Vec::new();
    if let Some(w) = &quota.five_hour {
        limits.push(limit("session", w, None));
    }
    if let Some(w) = &quota.seven_day {
        limits.push(limit("weekly_all", w, None));
    }
    for (bucket, w) in &quota.buckets {
        limits.push(limit("weekly_scoped", w, Some(&display_name(bucket))));
    }
    json!({"five_hour": window(&quota.five_hour), "seven_day": window(&quota.seven_day), "limits": limits})
}

/// One entry of `limits`; only `weekly_scoped` ones have a model scope.
fn limit(kind: &str, w: &Window, model: Option<&str>) -> Value {
    let scope = model.map_or(Value::Null, |name| json!({"model": {"display_name": name}}));
    json!({
        "kind": kind,
        "percent": percent(w),
        "severity": severity(w),
        "resets_at": rfc3339(w.reset_s),
        "is_active": true,
        "scope": scope,
    })
}

/// The utilization as a whole percent: `0.034` is `3`.
fn percent(w: &Window) -> i64 {
    (w.utilization * 100.0).round() as i64
}

/// The window's scripted status decides; a bare percent decides for statuses the mock
/// does not know: `critical` when rejected or full, `warning` when warned or at 80%.
fn severity(w: &Window) -> &'static str {
    match w.status.as_str() {
        "rejected" => "critical",
        "allowed_warning" => "warning",
        _ if percent(w) >= 100 => "critical",
        _ if percent(w) >= 80 => "warning",
        _ => "normal",
    }
}

/// The model family a per-model bucket (`opus`, or its header label `7d_opus`) is shown
/// as: `oi` is "Fable", any other is capitalised.
fn display_name(bucket: &str) -> String {
    let bucket = bucket.strip_prefix("7d_").unwrap_or(bucket);
    if bucket == "oi" {
        return "Fable".to_owned();
    }
    let mut chars = bucket.chars();
    chars.next().map_or_else(String::new, |first| first.to_uppercase().chain(chars).collect())
}

fn profile_body(identity: &Identity) -> Value {
    let display_name = identity.email.split('@').next().unwrap_or_default();
    json!({
        "account": {
            "uuid": identity.account_uuid,
            "email": identity.email,
            "display_name": display_name,
            "has_claude_max": true,
            "has_claude_pro": false,
        },
        "organization": {
            "uuid": identity.organization_uuid,
            "name": identity.organization_name(),
            "organization_type": "claude_max",
            "rate_limit_tier": "default_claude_max_5x",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_body_shows_every_window_of_the_quota() {
        let mut q = Quota::unified_at(0.034, 0.8, 1_795_003_199 - 5 * 3600);
        q.buckets = vec![
            ("opus".into(), Window::new(0.5, "allowed_warning", 1_795_003_199)),
            ("7d_oi".into(), Window::new(1.0, "rejected", 0)),
        ];
        let body = usage_body(&q);
        assert_eq!(body["five_hour"], json!({"utilization": 3, "resets_at": "2026-11-18T11:59:59Z"}));
        assert_eq!(body["seven_day"]["utilization"], 80);
        let limits = body["limits"].as_array().unwrap();
        let summary: Vec<(&str, i64, &str)> = limits
            .iter()
            .map(|l| (l["kind"].as_str().unwrap(), l["percent"].as_i64().unwrap(), l["severity"].as_str().unwrap()))
            .collect();
        assert_eq!(
            summary,
            [
                ("session", 3, "normal"),
                ("weekly_all", 80, "warning"),
                ("weekly_scoped", 50, "warning"),
                ("weekly_scoped", 100, "critical")
            ]
        );
        assert_eq!(limits[0]["scope"], Value::Null);
        assert_eq!(limits[2]["scope"], json!({"model": {"display_name": "Opus"}}));
        assert_eq!(limits[3]["scope"]["model"]["display_name"], "Fable");
        assert_eq!(limits[3]["resets_at"], "1970-01-01T00:00:00Z");
        assert!(limits.iter().all(|l| l["is_active"] == true));
    }

    #[test]
    fn a_quota_without_windows_has_null_windows_and_no_limits() {
        assert_eq!(usage_body(&Quota::default()), json!({"five_hour": null, "seven_day": null, "limits": []}));
    }

    #[test]
    fn buckets_are_named_after_their_model() {
        let names: Vec<String> = ["opus", "7d_opus", "oi", "sonnet", ""].into_iter().map(display_name).collect();
        assert_eq!(names, ["Opus", "Opus", "Fable", "Sonnet", ""]);
    }
}
