//! The simulated provider a simulation's gateway sends to: a [`Transport`]
//! (the seam every upstream request of the real gateway goes through) that
//! answers from each account's quota ledger ([`crate::sim::quota`], the
//! demo's arithmetic: windows that fill as tokens are served and reset on
//! their schedule, a 429 with the unified headers once one is spent) and its
//! prompt cache, on the simulation's clock.
//!
//! What a request spends of a window: its input, cache-creation and output
//! tokens, and a tenth of its cache reads (cache reads are cheap; how much a
//! subscription counts them is not published, so this weight is the
//! simulator's, stated in `docs/simulator.md`). The prompt cache is per
//! account and session and lives five minutes from its last use: on an
//! account where it is cold the request's cache reads are written instead —
//! what a mid-session switch costs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;

use super::plans::Plan;
use super::trace::Entry;
use crate::account::model_family;
use crate::clock::Clock;
use crate::gateway::request::upstream::{BoxError, Target, Transport, UpstreamResponse};
use crate::sim::quota::{Ledger, Window};
use crate::sim::scenario::Timescale;
use poolgate_wire::error::{self, ErrorType};
use poolgate_wire::message::{Chunking, Reply, StopReason, TextPieces};

/// How long a prompt cache entry lives after its last use.
pub const CACHE_TTL_MS: u64 = 5 * 60 * 1000;
/// Cache reads count this fraction of a token against a window.
pub const CACHE_READ_WEIGHT: f64 = 0.1;

/// The base URL the simulation gives account `i`.
pub fn base_url(i: usize) -> String {
    format!("http://account-{i}.sim.invalid")
}

/// What one answer of the simulated provider was.
#[derive(Debug, Clone, Default)]
pub struct Answered {
    /// The account that served (an index), if one did.
    pub account: Option<usize>,
    /// Cache reads the request would have had that were written instead,
    /// because its cache was cold on the serving account.
    pub cold_reads: u64,
    /// Whether a fallback backend answered.
    pub fallback: bool,
}

/// One answer of the simulated provider.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
    /// Whether the body is an event stream.
    sse: bool,
}

/// What one window left at its resets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reset {
    /// Tokens left unused, summed over its resets.
    pub unused: u64,
    /// How many times it reset.
    pub resets: u64,
}

/// The simulated provider.
pub struct Provider {
    clock: Clock,
    names: Vec<String>,
    state: Mutex<State>,
}

struct State {
    ledgers: Vec<Ledger>,
    /// Per account and session: when its cache was last used.
    warm: HashMap<(usize, String), u64>,
    /// Per account and window: tokens left unused at its resets, and how
    /// many resets there were.
    wasted: Vec<BTreeMap<String, Reset>>,
    /// The request being replayed.
    current: Option<Entry>,
    /// What its last answer was.
    answered: Answered,
}

impl Provider {
    /// Accounts named `names` with `plans`, their windows starting at `start_ms`.
    pub fn new(names: &[String], plans: &[Plan], clock: &Clock) -> Provider {
        let start = clock.now_ms();
        let ledgers =
            plans.iter().zip(names).map(|(p, n)| Ledger::new(&p.spec(n), &Timescale::real(), start)).collect();
        Provider {
            clock: clock.clone(),
            names: names.to_vec(),
            state: Mutex::new(State {
                ledgers,
                warm: HashMap::new(),
                wasted: vec![BTreeMap::new(); names.len()],
                current: None,
                answered: Answered::default(),
            }),
        }
    }

    /// Sets the request the next upstream calls answer for.
    pub fn replaying(&self, entry: &Entry) {
        let mut s = self.state.lock();
        s.current = Some(entry.clone());
        s.answered = Answered::default();
    }

    /// What the request being replayed got.
    pub fn answered(&self) -> Answered {
        self.state.lock().answered.clone()
    }

    /// Each account's headroom for `model` now: one minus the fullest of its
    /// 5h, 7d and the model's bucket (the provider's truth, not a reading).
    pub fn headroom(&self, model: &str) -> Vec<f64> {
        let now = self.clock.now_ms();
        let mut s = self.state.lock();
        let State { ledgers, wasted, .. } = &mut *s;
        let family = model_family(model);
        ledgers
            .iter_mut()
            .zip(wasted.iter_mut())
            .map(|(l, w)| {
                roll(l, now, w);
                1.0 - l.reported(family).iter().map(|w| w.utilization()).fold(0.0, f64::max)
            })
            .collect()
    }

    /// Rolls every window to `now` and returns the tokens left unused at
    /// each reset so far: per account name, per window.
    pub fn wasted(&self) -> BTreeMap<String, BTreeMap<String, Reset>> {
        let now = self.clock.now_ms();
        let mut s = self.state.lock();
        let State { ledgers, wasted, .. } = &mut *s;
        for (l, w) in ledgers.iter_mut().zip(wasted.iter_mut()) {
            roll(l, now, w);
        }
        self.names.iter().cloned().zip(wasted.iter().cloned()).collect()
    }

    /// Each account's windows now: (name, utilization) pairs.
    pub fn utilization(&self) -> Vec<Vec<(String, f64)>> {
        let s = self.state.lock();
        s.ledgers.iter().map(|l| l.windows().iter().map(|w| (w.name.clone(), w.utilization())).collect()).collect()
    }

    fn answer(&self, account: usize, entry: &Entry) -> Answer {
        let now = self.clock.now_ms();
        let family = model_family(&entry.model);
        let mut s = self.state.lock();
        let State { ledgers, warm, wasted, answered, .. } = &mut *s;
        let ledger = &mut ledgers[account];
        roll(ledger, now, &mut wasted[account]);
        if let Err(refusal) = ledger.admit(family, now) {
            let body = error::body(ErrorType::RateLimit, error::RATE_LIMITED, None);
            return Answer {
                status: 429,
                headers: ledger.headers(family, Some(&refusal)),
                body: Bytes::from(body),
                sse: false,
            };
        }
        let key = (account, entry.session.clone());
        let hot = warm.get(&key).is_some_and(|&t| now.saturating_sub(t) < CACHE_TTL_MS);
        warm.insert(key, now);
        let (read, written) = if hot {
            (entry.cache_read_tokens, entry.cache_creation_tokens)
        } else {
            (0, entry.cache_creation_tokens + entry.cache_read_tokens)
        };
        let spend = entry.input_tokens + written + entry.output_tokens + (read as f64 * CACHE_READ_WEIGHT) as u64;
        ledger.charge(family, spend, now);
        *answered = Answered { account: Some(account), cold_reads: entry.cache_read_tokens - read, fallback: false };
        let reply = Reply {
            id: format!("msg_sim{now}"),
            model: entry.model.clone(),
            text: "ok".into(),
            tool: None,
            stop_reason: StopReason::EndTurn,
            input_tokens: entry.input_tokens,
            output_tokens: entry.output_tokens,
        };
        let body = if entry.stream {
            reply.events(&Chunking { text: TextPieces::AtMost(1), json_parts: 1 }).concat()
        } else {
            reply.to_json()
        };
        Answer { status: 200, headers: ledger.headers(family, None), body: Bytes::from(body), sse: entry.stream }
    }

    /// What `/api/oauth/usage` says about account `i`: its windows as
    /// percents and reset times, its per-model buckets as scoped limits.
    fn usage(&self, i: usize) -> Answer {
        let now = self.clock.now_ms();
        let mut s = self.state.lock();
        let State { ledgers, wasted, .. } = &mut *s;
        roll(&mut ledgers[i], now, &mut wasted[i]);
        let l = &ledgers[i];
        let at = |w: &Window| {
            let t = std::time::UNIX_EPOCH + Duration::from_millis(w.resets_at_ms);
            humantime::format_rfc3339_seconds(t).to_string()
        };
        let window = |w: &Window| serde_json::json!({"utilization": w.utilization() * 100.0, "resets_at": at(w)});
        let limits: Vec<_> = l
            .buckets
            .iter()
            .map(|b| {
                let name = b.family.clone();
                serde_json::json!({"kind": "weekly_scoped", "percent": b.window.utilization() * 100.0,
                    "resets_at": at(&b.window), "scope": {"model": {"display_name": name}}})
            })
            .collect();
        let body =
            serde_json::json!({"five_hour": window(&l.five_hour), "seven_day": window(&l.seven_day), "limits": limits});
        Answer { status: 200, headers: Vec::new(), body: Bytes::from(body.to_string()), sse: false }
    }

    fn fallback(&self, entry: &Entry) -> Answer {
        self.state.lock().answered = Answered { account: None, cold_reads: 0, fallback: true };
        let usage = serde_json::json!({"prompt_tokens": entry.input_tokens, "completion_tokens": entry.output_tokens,
            "total_tokens": entry.input_tokens + entry.output_tokens});
        let body = if entry.stream {
            let chunk = serde_json::json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0,
                "model": entry.model, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": usage});
            format!("data: {chunk}\n\ndata: [DONE]\n\n")
        } else {
            serde_json::json!({"id": "chatcmpl-sim", "object": "chat.completion", "created": 0, "model": entry.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": usage})
            .to_string()
        };
        Answer { status: 200, headers: Vec::new(), body: Bytes::from(body), sse: entry.stream }
    }
}

/// Rolls `ledger`'s windows to `now`, adding what each left unused at every
/// reset it passed to `wasted` (a period nothing used wastes its budget).
fn roll(ledger: &mut Ledger, now: u64, wasted: &mut BTreeMap<String, Reset>) {
    let windows: Vec<&mut Window> = std::iter::once(&mut ledger.five_hour)
        .chain(std::iter::once(&mut ledger.seven_day))
        .chain(ledger.buckets.iter_mut().map(|b| &mut b.window))
        .collect();
    for w in windows {
        while now >= w.resets_at_ms {
            let r = wasted.entry(w.name.clone()).or_default();
            (r.unused, r.resets) = (r.unused + w.budget.saturating_sub(w.used), r.resets + 1);
            w.used = 0;
            w.resets_at_ms += w.period_ms;
        }
    }
}

#[async_trait::async_trait]
impl Transport for Provider {
    async fn send(
        &self,
        target: &Target,
        _method: &Method,
        uri: &Uri,
        _client_headers: &HeaderMap,
        _body: &Bytes,
        _timeout: Duration,
    ) -> Result<UpstreamResponse, String> {
        let account = (0..self.names.len()).find(|&i| base_url(i) == target.prefix());
        if let (Some(i), "/api/oauth/usage") = (account, uri.path()) {
            return Ok(response(self.usage(i)));
        }
        let Some(entry) = self.state.lock().current.clone() else {
            return Err("connect error: no request is being replayed".into());
        };
        let answer = match account {
            Some(i) => self.answer(i, &entry),
            None => self.fallback(&entry),
        };
        Ok(response(answer))
    }
}

/// An answer as the gateway's transport hands it on.
fn response(Answer { status, headers, body, sse }: Answer) -> UpstreamResponse {
    let mut r = http::Response::new(Full::new(body).map_err(|e| -> BoxError { match e {} }).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(status).expect("a status");
    let content_type = if sse { "text/event-stream" } else { "application/json" };
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(name.as_bytes()), http::HeaderValue::from_str(&value)) {
            r.headers_mut().insert(n, v);
        }
    }
    r
}
