//! `GET /ui/events`: what the web page shows, as server-sent events, with
//! the admin token.
//!
//! Events: `status` (what `GET /status` answers) every second; `decision`
//! (one decision record, as `/admin/decisions` lists it) as each request
//! ends, within a [`TICK`]; `usage` (every key's usage and budgets, as
//! `/v1/usage` answers each) every two seconds when it changed; a comment
//! as a keep-alive when nothing else went for 15 s. A page that goes away
//! ends its task at the next send.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use tokio::sync::OwnedSemaphorePermit;

use super::super::handlers::{AppState, admin_refused, status_value};
use crate::gateway::Gateway;
use crate::gateway::request::errors::{ErrorType, error};

/// How often an open page's task looks at the gateway.
pub const TICK: Duration = Duration::from_millis(250);
/// Pages streaming at once, at most.
pub const PAGES_MAX: usize = 16;
/// Decision records sent when a page opens (the newest).
const FIRST_DECISIONS: usize = 50;

/// `GET /ui/events`.
pub async fn events(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(r) = admin_refused(&s, &headers) {
        return r;
    }
    let Ok(permit) = s.ui_pages.clone().try_acquire_owned() else {
        let msg = format!("poolgate: {PAGES_MAX} pages are open already; close one");
        return error(StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimit, &msg);
    };
    let watch = Watch::new(s.gateway.clone(), permit);
    let stream = futures_util::stream::unfold(watch, |mut w| async move {
        let bytes = w.next().await;
        Some((Ok::<Bytes, Infallible>(bytes), w))
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// One open page's view of what it was sent.
struct Watch {
    gateway: Arc<Gateway>,
    ticks: u64,
    /// Decision records pushed when the page last looked.
    seen: Option<u64>,
    /// The last `usage` sent.
    usage: Option<String>,
    /// Ticks since anything was sent.
    quiet: u32,
    _permit: OwnedSemaphorePermit,
}

impl Watch {
    fn new(gateway: Arc<Gateway>, permit: OwnedSemaphorePermit) -> Watch {
        Watch { gateway, ticks: 0, seen: None, usage: None, quiet: 0, _permit: permit }
    }

    /// The next events to send: at once when the page has just opened, else
    /// as soon as a tick has something.
    async fn next(&mut self) -> Bytes {
        loop {
            if self.ticks > 0 {
                tokio::time::sleep(TICK).await;
            }
            let out = self.look();
            self.ticks += 1;
            if !out.is_empty() {
                self.quiet = 0;
                return Bytes::from(out);
            }
            self.quiet += 1;
            if self.quiet >= 60 {
                self.quiet = 0;
                return Bytes::from_static(b": keep-alive\n\n");
            }
        }
    }

    /// What changed since the last look, as events.
    fn look(&mut self) -> String {
        let mut out = String::new();
        let gw = &self.gateway;
        if self.ticks.is_multiple_of(4) {
            event(&mut out, "status", &status_value(gw));
        }
        let (pushed, records) = match self.seen {
            None => (gw.decisions.after(0).0, gw.decisions.latest(FIRST_DECISIONS).into_iter().rev().collect()),
            Some(seen) => gw.decisions.after(seen),
        };
        self.seen = Some(pushed);
        for r in records {
            event(&mut out, "decision", &*r);
        }
        if self.ticks.is_multiple_of(8) && gw.ledger.is_some() {
            let usage = serde_json::to_string(&usage(gw)).unwrap_or_default();
            if self.usage.as_ref() != Some(&usage) {
                let _ = write!(out, "event: usage\ndata: {usage}\n\n");
                self.usage = Some(usage);
            }
        }
        out
    }
}

/// Every key's usage and budgets: the configured keys, those managed at run
/// time, and any other the meters know (a key since removed that spent).
fn usage(gw: &Gateway) -> serde_json::Value {
    let g = gw.generation();
    let mut names: Vec<String> = g.config.server.client_keys.iter().map(|k| k.name.clone()).collect();
    names.extend(gw.runtime_keys.load().names());
    names.extend(gw.meters.keys());
    names.sort_unstable();
    names.dedup();
    let keys: Vec<serde_json::Value> = names.iter().map(|k| super::super::usage::key_usage(gw, &g, k)).collect();
    serde_json::Value::Array(keys)
}

/// Appends one event: its name and its data, as JSON on one line.
fn event(out: &mut String, name: &str, data: &impl serde::Serialize) {
    if let Ok(json) = serde_json::to_string(data) {
        let _ = write!(out, "event: {name}\ndata: {json}\n\n");
    }
}
