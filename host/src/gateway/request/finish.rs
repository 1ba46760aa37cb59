//! The one place a request ends, however it ends: an answer streamed or
//! buffered from an account, a local answer (a parked pool, refused
//! credentials, an upstream outage, a full queue), or a client gone mid-way.
//!
//! [`Finish::respond`] writes the explanation headers on the response when it
//! starts (the response as the client gets it: already in the client's
//! dialect, so the status kept is the client's); [`Finish::complete`] — when
//! the response is over, for a stream at its end — releases the in-flight
//! slot, tells the chain how the request ended (`observe`), completes the
//! decision record, counts it in the metrics and keeps it. A `Finish`
//! dropped before that (the client went away while its answer streamed or
//! was read) completes as `client_gone` — or `send_timeout`, when its
//! connection was closed because the client took no byte of it. The headers
//! are the same on every path:
//!
//! - `x-poolgate-request-id` always;
//! - `x-poolgate-account`: the id of the account whose answer the response is
//!   (its alias is in the record) — an answer relayed — and never on an
//!   answer the gateway writes itself;
//! - `x-poolgate-reason` and `x-poolgate-policy-error`: whenever the chain
//!   decided something for the request, local answers included; on an
//!   account's answer that was not the chain's first choice, the reason goes
//!   on with `; passed over <id> <cause>, …`;
//! - `x-poolgate-attempts`: how many times the chain ranked for it.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use http::{HeaderName, HeaderValue, Method};

use super::admission::Lease;
use super::record::{Ending, RequestRecord};
use crate::gateway::Gateway;
use crate::gateway::generation::{Generation, PoolAccount};
use crate::learned::accounts::Change;
use crate::policy::types as wit;

// The gateway's own headers, by name made once: a name given as a string is
// parsed, and copied, on every answer (#30).
static REQUEST_ID: HeaderName = HeaderName::from_static("x-poolgate-request-id");
static ACCOUNT: HeaderName = HeaderName::from_static("x-poolgate-account");
static REASON: HeaderName = HeaderName::from_static("x-poolgate-reason");
static POLICY_ERROR: HeaderName = HeaderName::from_static("x-poolgate-policy-error");
static ATTEMPTS: HeaderName = HeaderName::from_static("x-poolgate-attempts");

/// How the chain hears a request ended: the request as it saw it, the pool
/// index of the account, and the outcome.
pub type Observed = (wit::Request, u32, wit::Outcome);

/// What the chain's `observe` hears when the request ends.
pub enum Observe {
    /// Nothing: no attempt reached an account.
    Nothing,
    /// The answer of `account` to `request`; how it went is known at its end
    /// (a stream that breaks is a failure whatever its status said).
    Answer {
        /// The account's pool index.
        account: u32,
        /// The request as the chain saw it for that attempt.
        request: wit::Request,
        /// The status the account answered with (the client's may be its
        /// translation).
        status: u16,
    },
    /// Known already: how the last failed attempt went.
    Known(Observed),
}

/// A request on its way out.
pub struct Finish {
    pub(super) gateway: Arc<Gateway>,
    /// The generation the request ran on (its chain hears how it ended).
    pub(super) generation: Arc<Generation>,
    /// When the client request arrived.
    pub(super) started: Instant,
    /// The record to complete and keep.
    pub(super) record: RequestRecord,
    /// The in-flight slot of the account answering, released on completion.
    pub(super) lease: Option<Lease>,
    /// Whether the response is `record.account`'s answer (and says so).
    pub(super) account_answers: bool,
    /// What the chain hears.
    pub(super) observe: Observe,
    /// How the client's answers are written: [`Finish::now`] translates.
    pub(super) dialect: super::dialect::Dialect,
    /// The status the client got, once [`Finish::respond`] saw it.
    pub(super) status: u16,
    /// Whether the request was completed (and kept).
    pub(super) done: bool,
    /// Its place on its client key's meter, settled with what it used.
    pub(super) key_lease: Option<crate::ledger::limits::KeyLease>,
    /// The connection it came on: asked why, if the answer is dropped early.
    pub(super) connection: Option<super::read::Connection>,
}

impl Finish {
    /// Writes the explanation headers on `r`, the response as the client
    /// gets it, and notes its status.
    pub fn respond(&mut self, mut r: Response) -> Response {
        self.status = r.status().as_u16();
        let record = &self.record;
        let h = r.headers_mut();
        h.insert(REQUEST_ID.clone(), HeaderValue::from(record.id));
        if self.account_answers
            && let Some(v) = record.account.as_deref().and_then(|a| HeaderValue::from_str(a).ok())
        {
            h.insert(ACCOUNT.clone(), v);
        }
        // On an account's answer, also the accounts passed over on the way
        // to it and why (`decisions::reason_header`).
        let mut reason = match self.account_answers && !record.passed_over.is_empty() {
            true => std::borrow::Cow::Owned(super::record::reason_header(&record.reason, &record.passed_over)),
            false => std::borrow::Cow::Borrowed(&record.reason),
        };
        // A stage skipped as busy for most requests is off in effect: the
        // answers it was skipped on say so.
        let busy = record.attempts.last().into_iter().flat_map(|a| &a.decision.policy_errors);
        for e in busy.filter(|e| e.cause == crate::policy::Cause::Busy) {
            if let Some(note) = self.generation.chain.mostly_busy(&e.stage) {
                reason = std::borrow::Cow::Owned(format!("{reason}; {note}"));
            }
        }
        if let Some(v) = Some(&reason).filter(|r| !r.is_empty()).and_then(|r| HeaderValue::from_str(r).ok()) {
            h.insert(REASON.clone(), v);
        }
        let policy_error = record
            .attempts
            .iter()
            .rev()
            .find_map(|a| a.decision.policy_errors.first())
            .map(|e| format!("{}:{}", e.stage, e.cause.as_str()));
        if let Some(v) = policy_error.and_then(|p| HeaderValue::from_str(&p).ok()) {
            h.insert(POLICY_ERROR.clone(), v);
        }
        if !record.attempts.is_empty() {
            h.insert(ATTEMPTS.clone(), HeaderValue::from(record.attempts.len()));
        }
        if self.account_answers && record.fallback.is_none() {
            super::unified::pool_headers(&self.generation, h, self.gateway.clock.now_ms());
        }
        super::key_limits::budget_headers(&self.gateway, &self.generation, record.client.as_deref(), h);
        r
    }

    /// Ends the request (with the status [`Finish::respond`] saw): a local
    /// answer at once, a relayed one when its body ends.
    pub fn complete(mut self, ending: Ending) {
        self.end(ending);
    }

    fn end(&mut self, ending: Ending) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let gateway = &self.gateway;
        drop(self.lease.take());
        let mut record = std::mem::take(&mut self.record);
        // A substitute's answer that reached the client whole.
        let ending = match ending {
            Ending::Complete if record.fallback.is_some() => Ending::Fallback,
            e => e,
        };
        let observed = match std::mem::replace(&mut self.observe, Observe::Nothing) {
            Observe::Nothing => None,
            Observe::Answer { account, request, status } => {
                stream_ended(gateway, &self.generation, account, ending);
                Some((request, account, relayed_outcome(ending, status)))
            }
            Observe::Known(o) => Some(o),
        };
        if let Some((request, account, outcome)) = observed {
            self::observe(self.generation.clone(), request, account, outcome);
        }
        record.status = self.status;
        record.outcome = ending;
        record.duration_ms = gateway.clock.since(self.started).as_millis() as u64;
        gateway.metrics.request(record.account.as_deref().unwrap_or("-"), record.status);
        log_line(&RequestLine {
            id: record.id,
            method: &record.method,
            path: &record.path,
            status: record.status,
            account: record.account.as_deref().filter(|_| self.account_answers),
            client: record.client.as_deref(),
            model: Some(record.model.as_str()).filter(|m| !m.is_empty()),
            ms: record.duration_ms,
        });
        let entry = self.entry(&record);
        // Every key's spend is metered (by when the request arrived, as the
        // ledger files it): `/v1/usage` reads it, and a budget a reload adds
        // counts what was already spent; a key with limits also frees its
        // in-flight place.
        let (nano, now) = (entry.cost_nano.unwrap_or(0), gateway.clock.now_ms());
        match self.key_lease.take() {
            Some(lease) => lease.settle(&entry.usage, nano, entry.at_ms, now),
            None => gateway.meters.spend(&entry.key, &entry.usage, nano, entry.at_ms),
        }
        // Only a model an account answered for names a metrics label (a
        // client may name any model; 32 label values at most).
        let answered = entry.usage_known && entry.usage.total() > 0;
        gateway.metrics.usage(&entry.key, if answered { &entry.model } else { "other" }, &entry.usage, entry.cost_nano);
        // By the account that answered (or the fallback backend). An estimate
        // (a stream cut before its closing count, charged by its bytes) counts
        // under `other`, as the client's usage does.
        if !entry.account.is_empty() {
            gateway.metrics.tokens(&entry.account, if answered { &entry.model } else { "other" }, &entry.usage);
        }
        if let Some(ledger) = &gateway.ledger {
            ledger.push(entry);
        }
        if let (Some(t), Some(ids)) = (&gateway.telemetry, record.trace.as_ref().filter(|ids| ids.sampled)) {
            let took = gateway.clock.since(self.started);
            t.send(super::trace::trace(&record, ids, took, &self.generation, now));
        }
        gateway.decisions.push(record);
    }

    /// The ledger's entry for the request `record` describes.
    fn entry(&self, record: &RequestRecord) -> crate::ledger::Entry {
        let key = record.client.clone().unwrap_or_else(|| "-".into());
        let team = crate::gateway::keys::team(&self.gateway, &self.generation, &key).unwrap_or_default();
        let account = match (&record.fallback, self.account_answers) {
            (Some(f), _) => format!("fallback:{f}"),
            (None, true) => record.account.clone().unwrap_or_default(),
            (None, false) => String::new(),
        };
        // Unknown only where an answer should have said: a successful
        // answer to a generating request that reported no usage.
        let metered = matches!(record.api, "messages" | "chat_completions")
            && (200..300).contains(&record.status)
            && !account.is_empty();
        let usage = record.usage.unwrap_or_default();
        // A fallback's answer is priced as its model (`<name>/<model>`).
        let served_model =
            record.fallback.as_deref().and_then(|f| f.split_once('/')).map_or(&*record.model, |(_, m)| m);
        crate::ledger::Entry {
            at_ms: record.at_ms,
            request: record.id,
            replica: self.gateway.replica.clone(),
            key,
            team,
            api: record.api,
            model: record.model.clone(),
            account,
            status: record.status,
            outcome: record.outcome.as_str(),
            usage,
            usage_known: (record.usage.is_some() && !record.usage_estimated) || !metered,
            cost_nano: self.generation.prices.cost_nano(served_model, &usage),
        }
    }

    /// Answers with `r`, whose body is in memory, at once — in the client's
    /// dialect — and ends the request.
    pub fn now(mut self, r: Response, ending: Ending) -> Response {
        let r = self.dialect.whole(r);
        let r = self.respond(r);
        self.complete(ending);
        r
    }
}

impl Drop for Finish {
    /// Dropped before it completed: the client went away while its answer
    /// was on its way — or stopped taking it, and its connection was closed
    /// for it (`send_timeout`).
    fn drop(&mut self) {
        let timed_out = self.connection.as_ref().is_some_and(|c| c.0.send_timed_out());
        self.end(if timed_out { Ending::SendTimeout } else { Ending::ClientGone });
    }
}

/// Tells the account whose answer reached the client how it ended: whole
/// (`Complete`) or cut after its first byte (`StreamError`). A client that went
/// away says nothing about the account.
fn stream_ended(gateway: &Gateway, generation: &Generation, account: u32, ending: Ending) {
    let whole = match ending {
        Ending::Complete => true,
        Ending::StreamError => false,
        _ => return,
    };
    let Some(a) = generation.account(account) else { return };
    if !whole {
        gateway.metrics.stream_cut(&a.config.id);
    }
    let change = a.state.stream_ended(whole, &generation.config.cooldowns, gateway.clock.now_ms());
    note(gateway, a, change);
}

/// A request refused before its record began — its head, its body, or a pool
/// with no accounts: what it asked and when it arrived.
pub struct Early<'a> {
    /// The request's number.
    pub id: u64,
    /// Its method.
    pub method: &'a Method,
    /// Its path (without the query).
    pub path: &'a str,
    /// When it arrived.
    pub started: Instant,
}

impl Early<'_> {
    /// Ends the request with `r`: counted in `poolgate_refused_total{reason}`,
    /// logged, and tagged with its request id.
    pub fn refuse(&self, gw: &Gateway, reason: &'static str, r: Response) -> Response {
        self.refuse_from(gw, reason, None, r)
    }

    /// [`Early::refuse`] for a request whose client key was accepted
    /// (`client`, its name): the log line says who was refused.
    pub fn refuse_from(&self, gw: &Gateway, reason: &'static str, client: Option<&str>, mut r: Response) -> Response {
        gw.metrics.refused(reason);
        r.headers_mut().insert(REQUEST_ID.clone(), HeaderValue::from(self.id));
        log_line(&RequestLine {
            id: self.id,
            method: self.method.as_str(),
            path: self.path,
            status: r.status().as_u16(),
            account: None,
            client,
            model: None,
            ms: gw.clock.since(self.started).as_millis() as u64,
        });
        r
    }
}

/// What the one `info` line of a request says.
pub struct RequestLine<'a> {
    /// The request id (as in `x-poolgate-request-id`).
    pub id: u64,
    /// Its method.
    pub method: &'a str,
    /// Its path, without the query.
    pub path: &'a str,
    /// The status the client got.
    pub status: u16,
    /// The account whose answer the response is (none for a local answer).
    pub account: Option<&'a str>,
    /// The accepted client key's name (none without client keys, or before
    /// the key was checked).
    pub client: Option<&'a str>,
    /// The model asked for (none before the body was read).
    pub model: Option<&'a str>,
    /// Total time, ms (to the end of a stream).
    pub ms: u64,
}

/// The one `info` line of a request (its full record is logged at `debug`,
/// target `poolgate::decision`): nothing in it is secret. What is unknown is
/// `-`, so every line has every key.
pub fn log_line(l: &RequestLine<'_>) {
    use crate::logs::Token;
    let (account, client, model) =
        (Token(l.account.unwrap_or("-")), Token(l.client.unwrap_or("-")), Token(l.model.unwrap_or("-")));
    // A method and a path hold no spaces or line breaks (hyper refuses them);
    // the account id and key name (the operator's text) and the model (the
    // client's) are written as one word, or quoted, so none can forge a field.
    tracing::info!(target: "poolgate::request", request = l.id, method = %l.method, path = %l.path, status = l.status, account = %account, client = %client, model = %model, ms = l.ms, "answered");
}

/// What the chain hears about an attempt that ended with HTTP `status`, or
/// with no answer at all (`None`): the one mapping from statuses to outcomes.
pub fn outcome_of(status: Option<u16>, retry_after_ms: Option<u64>) -> wit::Outcome {
    match status {
        None => wit::Outcome::Failed,
        Some(200..=299) => wit::Outcome::Success,
        Some(429) => wit::Outcome::RateLimited(retry_after_ms),
        Some(529) => wit::Outcome::Overloaded,
        Some(s) => wit::Outcome::UpstreamError(s),
    }
}

/// How an answer that reached the client ended, for the chain: a stream that
/// broke or a client that left is a failure whatever its status said.
fn relayed_outcome(ending: Ending, status: u16) -> wit::Outcome {
    match ending {
        Ending::Complete => outcome_of(Some(status), None),
        _ => wit::Outcome::Failed,
    }
}

/// Reports a cooldown change to metrics and the log.
pub(super) fn note(gw: &Gateway, account: &PoolAccount, change: Change) {
    match change {
        Change::Cooled(reason) => {
            gw.metrics.cooldown(&account.config.id, reason.as_str());
            tracing::info!(account = %account.config.id, reason = reason.as_str(), "account cooling down");
        }
        Change::Gated(family) => {
            gw.metrics.cooldown(&account.config.id, "model_exhausted");
            tracing::info!(account = %account.config.id, family, "model family gated on account");
        }
        Change::Cleared | Change::None => {}
    }
}

/// Tells the chain how a request ended: at once when the calls finish in
/// one go, else on the plugin call threads (see [`crate::policy::calls`]).
/// One waiting for an instance queues for it (the pool grows meanwhile; see
/// `policy::pool`) instead of being dropped: only past the queue's bound is an
/// `observe` dropped, and then counted.
pub fn observe(generation: Arc<Generation>, request: wit::Request, account: u32, ended: wit::Outcome) {
    generation.chain.observe_detached(request, account, ended);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mapping_from_statuses_to_outcomes() {
        assert_eq!(format!("{:?}", outcome_of(Some(200), None)), format!("{:?}", wit::Outcome::Success));
        assert_eq!(
            format!("{:?}", outcome_of(Some(429), Some(5))),
            format!("{:?}", wit::Outcome::RateLimited(Some(5)))
        );
        assert_eq!(format!("{:?}", outcome_of(Some(529), None)), format!("{:?}", wit::Outcome::Overloaded));
        assert_eq!(format!("{:?}", outcome_of(Some(503), None)), format!("{:?}", wit::Outcome::UpstreamError(503)));
        assert_eq!(format!("{:?}", outcome_of(None, None)), format!("{:?}", wit::Outcome::Failed));
        assert_eq!(format!("{:?}", relayed_outcome(Ending::StreamError, 200)), format!("{:?}", wit::Outcome::Failed));
        assert_eq!(format!("{:?}", relayed_outcome(Ending::ClientGone, 200)), format!("{:?}", wit::Outcome::Failed));
        assert_eq!(
            format!("{:?}", relayed_outcome(Ending::Complete, 400)),
            format!("{:?}", wit::Outcome::UpstreamError(400))
        );
    }
}
