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
    /// Per account: its per-minute limits when it is an API key (which has
    /// them instead of windows), else `None`.
    per_minute: Vec<Option<PerMinute>>,
    state: Mutex<State>,
}

struct State {
    ledgers: Vec<Ledger>,
    /// Per API-key account: what its current minute has used.
    minutes: Vec<Minute>,
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
    /// Accounts named `names` with `plans`, their windows starting now;
    /// those `api_key` marks are API keys, limited per minute instead.
    pub fn new(names: &[String], plans: &[Plan], api_key: &[bool], clock: &Clock) -> Provider {
        let start = clock.now_ms();
        let per_minute = plans
            .iter()
            .zip(api_key)
            .map(|(p, &key)| {
                key.then_some(PerMinute {
                    requests: p.requests_per_minute,
                    input: p.input_tokens_per_minute,
                    output: p.output_tokens_per_minute,
                })
            })
            .collect();
        let ledgers =
            plans.iter().zip(names).map(|(p, n)| Ledger::new(&p.spec(n), &Timescale::real(), start)).collect();
        Provider {
            clock: clock.clone(),
            names: names.to_vec(),
            per_minute,
            state: Mutex::new(State {
                ledgers,
                minutes: vec![Minute::default(); names.len()],
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
        let family = model_family(model);
        let mut s = self.rolled(now);
        let State { ledgers, minutes, .. } = &mut *s;
        let windows = ledgers.iter().zip(minutes.iter_mut()).zip(&self.per_minute);
        windows
            .map(|((l, minute), limits)| match limits {
                Some(limits) => 1.0 - minute.now(now).used_share(limits),
                None => 1.0 - l.reported(family).iter().map(|w| w.utilization()).fold(0.0, f64::max),
            })
            .collect()
    }

    /// Rolls every window to `now` and returns the tokens left unused at
    /// each reset so far: per account name, per window.
    pub fn wasted(&self) -> BTreeMap<String, BTreeMap<String, Reset>> {
        let s = self.rolled(self.clock.now_ms());
        self.names.iter().cloned().zip(s.wasted.iter().cloned()).collect()
    }

    /// Each account's windows now: (name, utilization) pairs.
    /// (An idle window is rolled first: one that reset while nobody asked
    /// reads 0, and what it left counts as wasted.)
    pub fn utilization(&self) -> Vec<Vec<(String, f64)>> {
        let s = self.rolled(self.clock.now_ms());
        s.ledgers.iter().map(|l| l.windows().iter().map(|w| (w.name.clone(), w.utilization())).collect()).collect()
    }

    /// The state with every account's windows rolled to `now` (API keys have
    /// none), what each left unused at its resets counted.
    fn rolled(&self, now: u64) -> parking_lot::MutexGuard<'_, State> {
        let mut s = self.state.lock();
        let State { ledgers, wasted, .. } = &mut *s;
        for ((l, w), limits) in ledgers.iter_mut().zip(wasted.iter_mut()).zip(&self.per_minute) {
            if limits.is_none() {
                roll(l, now, w);
            }
        }
        s
    }

    fn answer(&self, account: usize, entry: &Entry) -> Answer {
        let now = self.clock.now_ms();
        let family = model_family(&entry.model);
        let mut s = self.state.lock();
        let State { ledgers, warm, wasted, answered, minutes, .. } = &mut *s;
        let ledger = &mut ledgers[account];
        let limits = self.per_minute[account];
        let refused = |headers| {
            let body = error::body(ErrorType::RateLimit, error::RATE_LIMITED, None);
            Answer { status: 429, headers, body: Bytes::from(body), sse: false }
        };
        if let Some(limits) = &limits {
            let minute = minutes[account].now(now);
            if !minute.admits(limits, (1, entry.input_tokens + entry.cache_creation_tokens, entry.output_tokens)) {
                let mut headers = minute.headers(limits, now);
                headers.push(("retry-after".into(), minute.retry_after_s(now).to_string()));
                return refused(headers);
            }
        } else {
            roll(ledger, now, &mut wasted[account]);
            if let Err(refusal) = ledger.admit(family, now) {
                return refused(ledger.headers(family, Some(&refusal)));
            }
        }
        let key = (account, entry.session.clone());
        let hot = warm.get(&key).is_some_and(|&t| now.saturating_sub(t) < CACHE_TTL_MS);
        warm.insert(key, now);
        let (read, written) = if hot {
            (entry.cache_read_tokens, entry.cache_creation_tokens)
        } else {
            (0, entry.cache_creation_tokens + entry.cache_read_tokens)
        };
        let headers = match &limits {
            Some(limits) => {
                let minute = minutes[account].now(now);
                minute.spend(1, entry.input_tokens + written, entry.output_tokens);
                minute.headers(limits, now)
            }
            None => {
                let spend =
                    entry.input_tokens + written + entry.output_tokens + (read as f64 * CACHE_READ_WEIGHT) as u64;
                ledger.charge(family, spend, now);
                ledger.headers(family, None)
            }
        };
        *answered = Answered { account: Some(account), cold_reads: entry.cache_read_tokens - read };
        let reply = Reply {
            id: format!("msg_sim{now}"),
            model: entry.model.clone(),
            thinking: None,
            text: "ok".into(),
            tool: None,
            stop_reason: StopReason::EndTurn,
            input_tokens: entry.input_tokens,
            output_tokens: entry.output_tokens,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: written,
        };
        let body = if entry.stream {
            reply.events(&Chunking { text: TextPieces::AtMost(1), json_parts: 1 }).concat()
        } else {
            reply.to_json()
        };
        Answer { status: 200, headers, body: Bytes::from(body), sse: entry.stream }
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
        self.state.lock().answered = Answered::default();
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

/// An API key's per-minute limits.
#[derive(Debug, Clone, Copy)]
struct PerMinute {
    requests: u64,
    input: u64,
    output: u64,
}

/// What an API key used in one minute. Minutes are the clock's: Anthropic
/// replenishes continuously, and a fixed minute is the simulator's simpler
/// model of the same limit.
#[derive(Debug, Clone, Copy, Default)]
struct Minute {
    /// Which minute (ms since the epoch / 60 000).
    index: u64,
    requests: u64,
    input: u64,
    output: u64,
}

const MINUTE_MS: u64 = 60_000;

impl Minute {
    /// This minute's use at `now`, starting a new minute if it is one.
    fn now(&mut self, now: u64) -> &mut Minute {
        if now / MINUTE_MS != self.index {
            *self = Minute { index: now / MINUTE_MS, ..Minute::default() };
        }
        self
    }

    /// Whether a request asking (requests, input, output) fits; a limit of 0
    /// is none.
    fn admits(&self, limits: &PerMinute, (requests, input, output): (u64, u64, u64)) -> bool {
        let fits = |used: u64, more: u64, limit: u64| limit == 0 || used + more <= limit;
        fits(self.requests, requests, limits.requests)
            && fits(self.input, input, limits.input)
            && fits(self.output, output, limits.output)
    }

    fn spend(&mut self, requests: u64, input: u64, output: u64) {
        (self.requests, self.input, self.output) = (self.requests + requests, self.input + input, self.output + output);
    }

    /// The fullest of its limits, as a share.
    fn used_share(&self, limits: &PerMinute) -> f64 {
        let share = |used: u64, limit: u64| if limit == 0 { 0.0 } else { used as f64 / limit as f64 };
        share(self.requests, limits.requests)
            .max(share(self.input, limits.input))
            .max(share(self.output, limits.output))
            .min(1.0)
    }

    fn retry_after_s(&self, now: u64) -> u64 {
        ((self.index + 1) * MINUTE_MS).saturating_sub(now).div_ceil(1000).max(1)
    }

    /// The `anthropic-ratelimit-{requests,input-tokens,output-tokens}-*` headers.
    fn headers(&self, limits: &PerMinute, now: u64) -> Vec<(String, String)> {
        let reset_s = (now / MINUTE_MS + 1) * MINUTE_MS / 1000;
        let mut quota = poolgate_wire::ratelimit::Quota::default();
        for (kind, used, limit) in [
            ("requests", self.requests, limits.requests),
            ("input-tokens", self.input, limits.input),
            ("output-tokens", self.output, limits.output),
        ] {
            if limit > 0 {
                quota = quota.with_api_limit(kind, limit, limit.saturating_sub(used), reset_s);
            }
        }
        quota.headers()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(t_ms: u64, session: &str) -> Entry {
        Entry {
            t_ms,
            session: session.into(),
            client: None,
            model: "claude-sonnet-4-5".into(),
            input_tokens: 10,
            output_tokens: 100,
            cache_read_tokens: 50_000,
            cache_creation_tokens: 1_000,
            stream: false,
        }
    }

    #[test]
    fn an_api_key_is_limited_per_minute_and_a_seat_by_its_windows_and_cache() {
        let clock = Clock::manual(1_767_571_200_000);
        let names = ["seat".to_string(), "key".to_string()];
        let key_plan = Plan { requests_per_minute: 2, ..Plan::default() };
        let p = Provider::new(&names, &[Plan::default(), key_plan], &[false, true], &clock);

        // The API key: two requests a minute, then a 429 that says when.
        assert_eq!(p.answer(1, &entry(0, "s")).status, 200);
        assert_eq!(p.answer(1, &entry(0, "s")).status, 200);
        let refused = p.answer(1, &entry(0, "s"));
        assert_eq!(refused.status, 429);
        let header = |a: &Answer, n: &str| a.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(header(&refused, "retry-after").as_deref(), Some("60"));
        assert_eq!(header(&refused, "anthropic-ratelimit-requests-remaining").as_deref(), Some("0"));
        clock.advance(Duration::from_secs(60));
        assert_eq!(p.answer(1, &entry(0, "s")).status, 200, "a new minute");

        // The seat: a cold cache writes what a warm one reads, and it stays
        // warm for five minutes.
        p.answer(0, &entry(0, "s"));
        assert_eq!(p.answered().cold_reads, 50_000, "cold: its reads were written");
        clock.advance(Duration::from_secs(299));
        p.answer(0, &entry(0, "s"));
        assert_eq!(p.answered().cold_reads, 0, "warm within five minutes");
        clock.advance(Duration::from_secs(301));
        p.answer(0, &entry(0, "s"));
        assert_eq!(p.answered().cold_reads, 50_000, "cold again after five idle minutes");
        assert!(p.wasted()["key"].is_empty(), "an API key has no windows to waste");
    }
}
