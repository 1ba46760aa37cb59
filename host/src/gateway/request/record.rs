//! The request record — what was decided for one client request and how it went
//! — and the ring of the last N records behind `GET /admin/decisions`.
//!
//! When the account that served was not the one the chain put first, the
//! record says why: every account ranked ahead of it, on every attempt, is in
//! `passed_over` with its cause (at its in-flight limit, cooling, gated, an
//! overflow account, failed over …), and `x-poolgate-reason` carries the same
//! list in one bounded ASCII line ([`reason_header`]). Without that an operator
//! reads `preferred_primary` on an answer the primary never saw.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::account::{AccountSnapshot, CooldownReason};
use crate::policy::Decision;

/// How one attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Its answer went to the client.
    Served,
    /// It failed before the first byte reached the client; the next account was tried.
    Failover,
    /// The upstream could not be reached.
    ConnectError,
    /// No usable account was left for it.
    NoUsableAccount,
    /// Every usable account was at its in-flight limit and the queue was full.
    QueueFull,
    /// It waited the whole queue timeout for an in-flight slot.
    QueueTimeout,
    /// The shutdown grace period ended before its upstream answered.
    Shutdown,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Not yet: the answer is still streaming.
    #[default]
    Pending,
    /// The upstream's answer reached the client whole.
    Complete,
    /// The upstream's answer broke after its first byte.
    StreamError,
    /// The client went away before the answer was whole.
    ClientGone,
    /// The client accepted no byte of its answer for
    /// `server.send_timeout_ms`: its connection was closed and the upstream
    /// request cancelled.
    SendTimeout,
    /// The gateway was shutting down and the answer was still open when its
    /// grace period ended: cut, with an SSE `error` event for a stream.
    Shutdown,
    /// Some account waits out a quota and none could serve: a local 429.
    Parked,
    /// Credentials were refused and no account could serve: a local 503.
    AuthRefused,
    /// Every attempt failed upstream (5xx, 529, no connection): a local 502.
    UpstreamFailed,
    /// Every account was cooling after upstream failures: a local 503.
    UpstreamCooling,
    /// The admission queue was full: a local 429.
    QueueFull,
    /// The admission queue timed out: a local 429.
    QueueTimeout,
    /// No account could take it: a local 503.
    NoAccount,
    /// The pool could not serve; a `[[fallback]]` backend did.
    Fallback,
}

impl Ending {
    /// The name used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Pending => "pending",
            Ending::Complete => "complete",
            Ending::StreamError => "stream_error",
            Ending::ClientGone => "client_gone",
            Ending::SendTimeout => "send_timeout",
            Ending::Shutdown => "shutdown",
            Ending::Parked => "parked",
            Ending::AuthRefused => "auth_refused",
            Ending::UpstreamFailed => "upstream_failed",
            Ending::UpstreamCooling => "upstream_cooling",
            Ending::QueueFull => "queue_full",
            Ending::QueueTimeout => "queue_timeout",
            Ending::NoAccount => "no_account",
            Ending::Fallback => "fallback",
        }
    }
}

/// One upstream attempt of a request.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// 0 for the first try.
    pub attempt: u32,
    /// The chain's decision for this attempt.
    pub decision: Decision,
    /// The account sent to (none when the request was answered locally).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The upstream status; none on a connection failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What happened.
    pub outcome: AttemptOutcome,
    /// Time spent waiting for an in-flight slot, ms.
    pub queued_ms: u64,
    /// Time to the upstream's response headers, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_ms: Option<u64>,
    /// Why no answer came: the connection's error, or the body that broke
    /// before its first byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// When its ranking began, µs after the request arrived (a traced
    /// request's only: its spans are placed by it).
    #[serde(skip)]
    pub at_us: u64,
    /// The quota its answer reported (a traced request's only: span events).
    #[serde(skip)]
    pub reading: Option<crate::learned::quota::QuotaReading>,
}

/// Everything about one client request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestRecord {
    /// Request number.
    pub id: u64,
    /// When it arrived.
    pub at_ms: u64,
    /// Configuration generation it ran on.
    pub generation: u64,
    /// `messages`, `count_tokens`, `models`.
    pub api: &'static str,
    /// The HTTP method.
    pub method: String,
    /// The path (without the query).
    pub path: String,
    /// Model asked for.
    pub model: String,
    /// Session id, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The client key's name, if keys are configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Each attempt.
    pub attempts: Vec<Attempt>,
    /// When no account served: what stood in each one's way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<Blocked>,
    /// Every account ranked ahead of the one tried, on every attempt, and why
    /// it was passed over (an account once: its first cause). Empty when the
    /// chain's head served.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passed_over: Vec<PassedOver>,
    /// The account that served (or failed last).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The fallback backend that served instead of the pool (`<name>/<model>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The reason that put it first.
    pub reason: String,
    /// The status the client got.
    pub status: u16,
    /// How the request ended.
    pub outcome: Ending,
    /// Total time, ms.
    pub duration_ms: u64,
    /// The tokens the answer reported (its `usage`, read as it passed);
    /// none for an answer that reported none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<poolgate_wire::usage::Usage>,
    /// Whether `usage` is an estimate: a stream that ended before its
    /// closing count, charged by its bytes (`Scanner::charge`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub usage_estimated: bool,
    /// The model the answer says answered (a traced request's only: its
    /// span's `gen_ai.response.model`).
    #[serde(skip)]
    pub response_model: Option<String>,
    /// Its trace (`[telemetry]`), written as the trace id.
    #[serde(rename = "trace_id", skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::telemetry::TraceIds>,
}

/// Why an account ranked ahead of the one tried did not take the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassCause {
    /// At its `max_in_flight` (here, or across replicas): admission went on.
    Full,
    /// Cooling down for this reason (not usable).
    Cooling(CooldownReason),
    /// Its model family is gated (not usable for this request).
    Gated(String),
    /// Disabled: an OAuth seat that needs a login.
    Disabled,
    /// Not usable, for a reason no longer in force when it was looked at.
    NotUsable,
    /// An overflow account (see `[[accounts]] overflow`): tried only after
    /// every usable account that is not.
    Overflow,
    /// Tried, and its answer failed over with this status (429, 529, 5xx, 401, 403).
    FailedOver(u16),
    /// Tried, and no answer came (no connection, a timeout).
    NoAnswer,
    /// Tried, and its body broke before the first byte.
    Broke,
}

impl PassCause {
    /// Whether the account was tried on this request (its answer failed over).
    pub fn tried(&self) -> bool {
        matches!(self, PassCause::FailedOver(_) | PassCause::NoAnswer | PassCause::Broke)
    }
}

impl std::fmt::Display for PassCause {
    /// One token, no spaces: `full`, `cooling:<reason>`, `gated:<family>`,
    /// `disabled`, `not-usable`, `overflow`, `failed-over:<status>`,
    /// `no-answer`, `broke`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassCause::Full => f.write_str("full"),
            PassCause::Cooling(r) => write!(f, "cooling:{}", r.as_str()),
            PassCause::Gated(family) => write!(f, "gated:{}", token(family)),
            PassCause::Disabled => f.write_str("disabled"),
            PassCause::NotUsable => f.write_str("not-usable"),
            PassCause::Overflow => f.write_str("overflow"),
            PassCause::FailedOver(s) => write!(f, "failed-over:{s}"),
            PassCause::NoAnswer => f.write_str("no-answer"),
            PassCause::Broke => f.write_str("broke"),
        }
    }
}

impl Serialize for PassCause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why an account the chain ranked is not usable for a request of model
/// `family` at `now`, and until when.
pub fn unusable_cause(snapshot: &AccountSnapshot, family: Option<&str>, now: u64) -> (PassCause, Option<u64>) {
    if let Some(c) = snapshot.active_cooldown(now) {
        return match c.reason {
            CooldownReason::Disabled => (PassCause::Disabled, None),
            reason => (PassCause::Cooling(reason), Some(c.until_ms)),
        };
    }
    match snapshot.active_gate(family, now) {
        Some(g) => (PassCause::Gated(g.family.clone()), Some(g.until_ms)),
        None => (PassCause::NotUsable, None),
    }
}

/// One account passed over for a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PassedOver {
    /// The account id.
    pub account: String,
    /// The attempt (0 for the first) whose rank put it ahead.
    pub attempt: u32,
    /// Why it did not take the request.
    pub cause: PassCause,
    /// When its cooldown or gate ends, if that was the cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

/// Adds `p` unless its account is listed already (its first cause stands:
/// what stood in the way first is what moved the request on).
pub fn pass_over(list: &mut Vec<PassedOver>, p: PassedOver) {
    if !list.iter().any(|q| q.account == p.account) {
        list.push(p);
    }
}

/// The most bytes the passed-over part of `x-poolgate-reason` takes; past
/// it the rest is counted (`+3 more`). The record has them all.
pub const PASSED_OVER_HEADER_BYTES: usize = 256;

/// The longest an account id or a family takes in the header (encoded).
const TOKEN_BYTES: usize = 64;

/// `text` as one header token: bytes outside printable ASCII, and the list's
/// own separators (space, `,`, `;`, `%`), percent-encoded; past
/// [`TOKEN_BYTES`], cut and ended with `...`.
fn token(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_graphic() && !matches!(b, b',' | b';' | b'%') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > TOKEN_BYTES {
        // Cut before any escape the cut would split.
        let mut cut = TOKEN_BYTES - 3;
        if let Some(p) = out[cut.saturating_sub(2)..cut].find('%') {
            cut = cut - 2 + p;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// The value of `x-poolgate-reason`: the chain's reason, and — when accounts
/// were passed over — `; passed over <id> <cause>, <id> <cause>` (ids
/// percent-encoded where they hold anything but printable ASCII or a
/// separator), at most [`PASSED_OVER_HEADER_BYTES`] of it, then `, +N more`.
/// One line, ASCII only.
pub fn reason_header(reason: &str, passed_over: &[PassedOver]) -> String {
    if passed_over.is_empty() {
        return reason.to_string();
    }
    let mut list = String::new();
    for (i, p) in passed_over.iter().enumerate() {
        let item = format!("{} {}", token(&p.account), p.cause);
        let sep = if list.is_empty() { "" } else { ", " };
        let rest = passed_over.len() - i;
        // Room for this item, and for the count of the rest if more follow.
        let tail = if rest > 1 { format!(", +{} more", rest - 1).len() } else { 0 };
        if !list.is_empty() && list.len() + sep.len() + item.len() + tail > PASSED_OVER_HEADER_BYTES {
            list.push_str(&format!(", +{rest} more"));
            break;
        }
        list.push_str(sep);
        list.push_str(&item);
    }
    format!("{reason}; passed over {list}")
}

/// The last N request records.
pub struct DecisionLog {
    kept: Mutex<Kept>,
}

struct Kept {
    max: usize,
    records: VecDeque<Arc<RequestRecord>>,
    /// Records pushed since the start (the web page asks for those after
    /// the last it saw).
    pushed: u64,
}

impl DecisionLog {
    /// Keeps `n` records.
    pub fn new(n: usize) -> Self {
        DecisionLog { kept: Mutex::new(Kept { max: n, records: VecDeque::with_capacity(n.min(1024)), pushed: 0 }) }
    }

    /// Changes how many are kept.
    pub fn resize(&self, n: usize) {
        let mut k = self.kept.lock();
        k.max = n;
        while k.records.len() > n {
            k.records.pop_front();
        }
    }

    /// Adds a record, logging it whole at `debug` (the request's `info` line
    /// is [`super::finish::log_line`]'s) — serialized only when that target is
    /// on; a JSON log embeds it as an object (`crate::logs`).
    pub fn push(&self, record: RequestRecord) {
        if tracing::enabled!(target: "poolgate::decision", tracing::Level::DEBUG)
            && let Ok(json) = serde_json::to_string(&record)
        {
            tracing::debug!(target: "poolgate::decision", request = record.id, account = record.account.as_deref().unwrap_or("-"), status = record.status, reason = %record.reason, record = %json, "record");
        }
        let mut k = self.kept.lock();
        if k.max == 0 {
            return;
        }
        if k.records.len() >= k.max {
            k.records.pop_front();
        }
        k.records.push_back(Arc::new(record));
        k.pushed += 1;
    }

    /// The newest `limit` records, newest first.
    pub fn latest(&self, limit: usize) -> Vec<Arc<RequestRecord>> {
        self.kept.lock().records.iter().rev().take(limit).cloned().collect()
    }

    /// The records pushed after the `seen`-th (those still kept), oldest
    /// first, and how many were pushed in all.
    pub fn after(&self, seen: u64) -> (u64, Vec<Arc<RequestRecord>>) {
        let k = self.kept.lock();
        let new = usize::try_from(k.pushed.saturating_sub(seen)).unwrap_or(usize::MAX).min(k.records.len());
        (k.pushed, k.records.iter().skip(k.records.len() - new).cloned().collect())
    }
}

/// What kept one account from serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A quota window, model gate or rate limit: it recovers at a known time.
    Quota,
    /// Its credential was refused: someone has to re-authenticate it.
    Auth,
    /// The upstream failed (5xx, 529, no connection).
    Upstream,
}

/// One account that could not serve, and why (kept in the request record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocked {
    /// The account id.
    pub account: String,
    /// The cause.
    pub cause: Cause,
    /// What showed it: `cooling: auth`, `HTTP 401`, `no answer`.
    pub detail: String,
    /// When it is expected to serve again (ms since the epoch), if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// When what blocks it is a plan limit — a spent window, not a burst
    /// limit or an outage — the window, as Claude Code names it
    /// (`five_hour`, `seven_day`, `seven_day_opus`; empty when unknown).
    #[serde(skip)]
    pub plan_limit: Option<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{Cooldown, ModelGate};

    fn p(account: &str, cause: PassCause) -> PassedOver {
        PassedOver { account: account.into(), attempt: 0, cause, until_ms: None }
    }

    #[test]
    fn the_reason_names_every_account_passed_over_and_why() {
        assert_eq!(reason_header("headroom", &[]), "headroom");
        let list = [
            p("a0", PassCause::Full),
            p("a1", PassCause::FailedOver(529)),
            p("a2", PassCause::Cooling(CooldownReason::WeeklyExhausted)),
            p("a3", PassCause::Gated("opus".into())),
            p("a4", PassCause::NoAnswer),
        ];
        assert_eq!(
            reason_header("preferred_primary", &list),
            "preferred_primary; passed over a0 full, a1 failed-over:529, a2 cooling:weekly_exhausted, a3 gated:opus, a4 no-answer"
        );
    }

    #[test]
    fn the_header_stays_one_bounded_ascii_line_whatever_the_ids_hold() {
        let odd = [p("team a, eu;1", PassCause::Full), p("é\r\nx-evil: 1", PassCause::Overflow)];
        let h = reason_header("r", &odd);
        assert_eq!(h, "r; passed over team%20a%2C%20eu%3B1 full, %C3%A9%0D%0Ax-evil:%201 overflow");
        assert!(http::HeaderValue::from_str(&h).is_ok());
        let many: Vec<PassedOver> = (0..100).map(|i| p(&format!("account-{i:03}"), PassCause::Full)).collect();
        let h = reason_header("r", &many);
        let list = h.strip_prefix("r; passed over ").unwrap();
        assert!(list.len() <= PASSED_OVER_HEADER_BYTES, "{} bytes", list.len());
        let shown = list.matches(" full").count();
        assert!(list.ends_with(&format!(", +{} more", 100 - shown)), "{list}");
        let long = [p(&"x".repeat(5000), PassCause::Full), p("b", PassCause::Full)];
        let h = reason_header("r", &long);
        assert!(h.len() < 200 && h.contains("x...") && h.ends_with("b full"), "{h}");
        // A cut never splits an escape.
        let t = token(&format!("{}é", "y".repeat(59)));
        assert!(t.ends_with("y...") && t.len() <= TOKEN_BYTES, "{t}");
    }

    #[test]
    fn an_account_is_listed_once_with_its_first_cause() {
        let mut list = Vec::new();
        pass_over(&mut list, p("a", PassCause::Full));
        pass_over(&mut list, p("a", PassCause::Cooling(CooldownReason::Overloaded)));
        pass_over(&mut list, p("b", PassCause::Broke));
        assert_eq!(list, [p("a", PassCause::Full), p("b", PassCause::Broke)]);
        assert_eq!(serde_json::to_value(&list[0]).unwrap()["cause"], "full");
        assert!(PassCause::Broke.tried() && !PassCause::Full.tried());
    }

    #[test]
    fn an_unusable_account_says_what_keeps_it() {
        let now = 1_000;
        let mut s = AccountSnapshot { id: "a".into(), ..Default::default() };
        assert_eq!(unusable_cause(&s, Some("opus"), now), (PassCause::NotUsable, None));
        s.model_gates = vec![ModelGate { family: "opus".into(), until_ms: 5_000 }];
        assert_eq!(unusable_cause(&s, Some("opus"), now), (PassCause::Gated("opus".into()), Some(5_000)));
        s.cooldown = Some(Cooldown { until_ms: 9_000, reason: CooldownReason::Overloaded });
        assert_eq!(
            unusable_cause(&s, Some("opus"), now),
            (PassCause::Cooling(CooldownReason::Overloaded), Some(9_000))
        );
        s.disabled = true;
        assert_eq!(unusable_cause(&s, None, now), (PassCause::Disabled, None));
    }
}
