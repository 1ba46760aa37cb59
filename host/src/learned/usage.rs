//! The usage poll: what `/api/oauth/usage` says about an OAuth seat, as a
//! quota reading like any header reading (with its own observed time).
//!
//! A seat that has not served lately has no fresh reading, and a fresh
//! gateway has none at all, so the chain would rank it on nothing (headroom
//! 1.0). The keeper polls such seats — never more often than
//! `[oauth] usage_poll_ms` per seat, never on a request's path — so they are
//! ranked on real data. The endpoint also reports model-scoped weekly limits
//! (`limits[].kind = "weekly_scoped"`) that the headers only show once that
//! model is served.

use serde::Deserialize;

use crate::account::{Status, WindowReading};
use crate::learned::quota::QuotaReading;

#[derive(Deserialize)]
struct Window {
    utilization: Option<f64>,
    resets_at: Option<String>,
}

#[derive(Deserialize)]
struct Model {
    display_name: Option<String>,
}

#[derive(Deserialize)]
struct Scope {
    model: Option<Model>,
}

#[derive(Deserialize)]
struct Limit {
    kind: String,
    percent: Option<f64>,
    resets_at: Option<String>,
    scope: Option<Scope>,
}

#[derive(Deserialize)]
struct Usage {
    five_hour: Option<Window>,
    seven_day: Option<Window>,
    #[serde(default)]
    limits: Vec<Limit>,
}

fn rfc3339_ms(s: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(s.trim()).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

fn window(name: String, percent: f64, resets_at: Option<&str>, now_ms: u64) -> Option<WindowReading> {
    let utilization = poolgate_sdk::quota::utilization(percent / 100.0)?;
    Some(WindowReading {
        name,
        utilization,
        resets_at_ms: resets_at.and_then(rfc3339_ms),
        status: if utilization >= 1.0 { Status::Rejected } else { Status::Allowed },
        observed_at_ms: Some(now_ms),
    })
}

/// The reading a usage answer holds, observed at `now_ms`; `None` when the
/// body is not a usage answer.
pub fn parse(body: &[u8], now_ms: u64) -> Option<QuotaReading> {
    let u: Usage = serde_json::from_slice(body).ok()?;
    let mut windows = Vec::new();
    for (name, w) in [("5h", &u.five_hour), ("7d", &u.seven_day)] {
        if let Some(w) = w
            && let Some(p) = w.utilization
            && let Some(r) = window(name.into(), p, w.resets_at.as_deref(), now_ms)
        {
            windows.push(r);
        }
    }
    for l in u.limits.iter().filter(|l| l.kind == "weekly_scoped") {
        let model = l.scope.as_ref().and_then(|s| s.model.as_ref()).and_then(|m| m.display_name.as_deref());
        let Some(family) = model.and_then(|m| m.split_whitespace().next()).map(str::to_ascii_lowercase) else {
            continue;
        };
        if let Some(p) = l.percent
            && let Some(r) = window(format!("7d_{family}"), p, l.resets_at.as_deref(), now_ms)
        {
            windows.push(r);
        }
    }
    windows.sort_by(|a, b| a.name.cmp(&b.name));
    windows.dedup_by(|a, b| a.name == b.name);
    Some(QuotaReading { windows, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_answer_becomes_windows_including_scoped_ones() {
        let body = br#"{"five_hour":{"utilization":42,"resets_at":"2025-10-09T10:00:00Z"},
            "seven_day":{"utilization":7,"resets_at":"2025-10-14T00:00:00Z"},
            "limits":[{"kind":"session","percent":42},
                      {"kind":"weekly_scoped","percent":100,"resets_at":"2025-10-14T00:00:00Z","scope":{"model":{"display_name":"Opus"}}},
                      {"kind":"weekly_scoped","percent":-5,"scope":{"model":{"display_name":"Fable"}}}]}"#;
        let r = parse(body, 7).unwrap();
        let names: Vec<&str> = r.windows.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["5h", "7d", "7d_opus"], "a negative percent is no reading");
        let five = r.window("5h").unwrap();
        assert_eq!((five.utilization, five.observed_at_ms), (0.42, Some(7)));
        assert_eq!(five.resets_at_ms, Some(1_760_004_000_000));
        assert_eq!(r.window("7d_opus").unwrap().status, Status::Rejected);
        assert!(parse(b"<html>", 0).is_none());
    }
}
