//! The request record — what was decided for one client request and how it went
//! — and the ring of the last N records behind `GET /admin/decisions`.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

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
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Not yet: the answer is still streaming.
    Pending,
    /// The upstream's answer reached the client whole.
    Complete,
    /// The upstream's answer broke after its first byte.
    StreamError,
    /// The client went away before the answer was whole.
    ClientGone,
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
}

/// Everything about one client request.
#[derive(Debug, Clone, Serialize)]
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
    pub blocked: Vec<super::unserved::Blocked>,
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
}

/// The last N request records.
pub struct DecisionLog {
    kept: Mutex<(usize, VecDeque<Arc<RequestRecord>>)>,
}

impl DecisionLog {
    /// Keeps `n` records.
    pub fn new(n: usize) -> Self {
        DecisionLog { kept: Mutex::new((n, VecDeque::with_capacity(n.min(1024)))) }
    }

    /// Changes how many are kept.
    pub fn resize(&self, n: usize) {
        let mut k = self.kept.lock();
        k.0 = n;
        while k.1.len() > n {
            k.1.pop_front();
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
        if k.0 == 0 {
            return;
        }
        if k.1.len() >= k.0 {
            k.1.pop_front();
        }
        k.1.push_back(Arc::new(record));
    }

    /// The newest `limit` records, newest first.
    pub fn latest(&self, limit: usize) -> Vec<Arc<RequestRecord>> {
        self.kept.lock().1.iter().rev().take(limit).cloned().collect()
    }
}
