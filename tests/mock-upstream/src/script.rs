//! Per-account behaviour scripts.
//!
//! A gateway test needs to say "account A answers the next request with a 429, then
//! recovers" without racing the gateway. Each account therefore holds a FIFO of one-shot
//! [`Step`]s and a default step for when the queue is empty; every authenticated request
//! pops exactly one step at arrival, so the order of behaviours follows the order in which
//! the gateway sends requests to that account.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use axum::http::{HeaderName, HeaderValue};
use poolgate_wire::ids::fnv1a;
use poolgate_wire::ratelimit::Quota;

use crate::quota;

/// What an account does with one request.
///
/// Steps that produce a normal reply ([`Step::Ok`], [`Step::Text`], [`Step::SlowStream`],
/// [`Step::ResetMidStream`]) answer in the shape of the endpoint: a message (JSON or SSE,
/// per the request's `stream`) on `/v1/messages`, a count on `count_tokens`, the model
/// list on `/v1/models`.
#[derive(Clone, Debug)]
pub enum Step {
    /// A normal reply.
    Ok,
    /// A normal reply whose text block is this text.
    Text(String),
    /// A 429 `rate_limit_error`.
    ///
    /// `unified: true` sends the account's quota headers with the unified status
    /// `rejected` (adding a reset, claim and rejected 5h window when the quota has none).
    /// `unified: false` is the bare burst-limit 429: no rate-limit headers at all and the
    /// message `"Error"`. `retry_after` adds a `retry-after` header in either case.
    RateLimited {
        /// Whether the unified rate-limit headers come with the 429.
        unified: bool,
        /// The `retry-after` header value, verbatim (seconds or an HTTP date).
        retry_after: Option<String>,
    },
    /// A 529 `overloaded_error`.
    Overloaded,
    /// An `api_error` with this status (500, 502, 503, …).
    ServerError(u16),
    /// Any status with this JSON body and these extra headers (which override the
    /// defaults, `content-type` included). A `Value::Null` body sends no body; a
    /// `Value::String` body is sent raw, not as a JSON string, for HTML or text pages.
    Status {
        /// HTTP status code.
        status: u16,
        /// Response body.
        body: serde_json::Value,
        /// Extra response headers (name, value).
        headers: Vec<(String, String)>,
    },
    /// Waits `ms` milliseconds, then behaves as `then`.
    Delay {
        /// Milliseconds to wait before answering.
        ms: u64,
        /// What to do after the wait.
        then: Box<Step>,
    },
    /// A normal reply, slowly: an SSE stream waits `chunk_delay_ms` between events; a JSON
    /// reply waits `chunk_delay_ms` once before answering.
    SlowStream {
        /// Milliseconds between SSE events.
        chunk_delay_ms: u64,
    },
    /// A normal reply with a long text, `deltas` SSE `text_delta` events of about
    /// `delta_bytes` each (a JSON reply carries the same text whole), spaced by the
    /// server's `chunk_delay_ms`: a large answer, for what a gateway holds while its
    /// client does not read.
    LongStream {
        /// How many `text_delta` events.
        deltas: usize,
        /// About how many bytes of text each carries.
        delta_bytes: usize,
    },
    /// Reads the request, then drops the connection (TCP reset) without a response byte.
    ResetBeforeResponse,
    /// Sends the 200 headers and the first `after_events` SSE events, then resets the
    /// connection. A non-streaming reply sends its headers (with the full
    /// `content-length`) and half of its body, then resets.
    ResetMidStream {
        /// How many SSE events are sent before the cut.
        after_events: usize,
    },
    /// Never answers; the request hangs until the client gives up or the server stops.
    Hang,
}

/// A handle to one scripted account; clones share the account.
#[derive(Clone)]
pub struct Account {
    pub(crate) inner: Arc<AccountState>,
}

pub(crate) struct AccountState {
    credential: String,
    answered: AtomicUsize,
    script: Mutex<Script>,
}

struct Script {
    queue: VecDeque<Step>,
    default: Step,
    quota: Quota,
    /// `quota` rendered once, so each response only clones header handles.
    quota_headers: Arc<[(HeaderName, HeaderValue)]>,
    org: HeaderValue,
}

impl Account {
    pub(crate) fn new(credential: &str, quota: Option<&Quota>) -> Account {
        let quota = quota.cloned().unwrap_or_default();
        let org = format!("org-{:016x}", fnv1a(credential.as_bytes()));
        Account {
            inner: Arc::new(AccountState {
                credential: credential.to_owned(),
                answered: AtomicUsize::new(0),
                script: Mutex::new(Script {
                    queue: VecDeque::new(),
                    default: Step::Ok,
                    quota_headers: quota::render(&quota).into(),
                    quota,
                    org: HeaderValue::try_from(org).expect("hex org id is a valid header value"),
                }),
            }),
        }
    }

    /// Queues a one-shot behaviour for this account's next request (FIFO).
    pub fn push(&self, step: Step) {
        self.script().queue.push_back(step);
    }

    /// Sets the behaviour once the queue is empty (default: [`Step::Ok`]).
    pub fn set_default(&self, step: Step) {
        self.script().default = step;
    }

    /// Sets the quota headers added to every response of this account from now on
    /// (except the bare 429 of [`Step::RateLimited`] with `unified: false`).
    ///
    /// # Panics
    /// If a header name or value in `quota` is not valid in HTTP.
    pub fn set_quota(&self, quota: Quota) {
        let rendered = quota::render(&quota).into();
        let mut script = self.script();
        script.quota = quota;
        script.quota_headers = rendered;
    }

    /// Sets the organization id reported in `anthropic-organization-id` (default:
    /// `"org-<credential hash>"`, 16 hex digits of FNV-1a).
    ///
    /// # Panics
    /// If `org` is not a valid header value.
    pub fn set_org(&self, org: &str) {
        self.script().org =
            HeaderValue::try_from(org).unwrap_or_else(|e| panic!("invalid organization id `{org}`: {e}"));
    }

    /// How many requests this account has answered (every authenticated request counts
    /// when it arrives, whatever its step; `HEAD` probes do not).
    pub fn count(&self) -> usize {
        self.inner.answered.load(Ordering::Relaxed)
    }

    /// The credential (API key or bearer token) this account answers to.
    pub fn credential(&self) -> &str {
        &self.inner.credential
    }

    /// How many one-shot steps are still queued.
    pub fn pending(&self) -> usize {
        self.script().queue.len()
    }

    /// The quota currently scripted.
    pub fn quota(&self) -> Quota {
        self.script().quota.clone()
    }

    /// Takes the step for one request and counts the request, under one lock so that
    /// concurrent requests each get a distinct queued step.
    pub(crate) fn take(&self) -> Taken {
        let mut script = self.script();
        self.inner.answered.fetch_add(1, Ordering::Relaxed);
        let step = match script.queue.pop_front() {
            Some(step) => step,
            None => script.default.clone(),
        };
        Taken { step, quota_headers: script.quota_headers.clone(), org: script.org.clone() }
    }

    /// A poisoned lock only means another test thread panicked; the script is still usable.
    fn script(&self) -> MutexGuard<'_, Script> {
        self.inner.script.lock()
    }
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("credential", &self.inner.credential)
            .field("count", &self.count())
            .finish_non_exhaustive()
    }
}

/// What one request got from its account's script.
pub(crate) struct Taken {
    pub step: Step,
    pub quota_headers: Arc<[(HeaderName, HeaderValue)]>,
    pub org: HeaderValue,
}
