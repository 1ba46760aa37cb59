//! State shared between replicas: one trait, two backends.
//!
//! A single gateway keeps everything it learns in its own memory — the
//! embedded backend, [`Embedded`], which shares nothing and costs nothing.
//! Several gateways serving one pool (behind a load balancer, or one per
//! developer against the same accounts) share through Redis
//! (`[state] backend = "redis"`, [`redis::Redis`]), so that what one learns
//! the others know:
//!
//! - per account, bound to the credential's identity: quota readings
//!   (merged by observed time), cooldowns (the longest in force; a later 2xx
//!   anywhere lifts what a success lifts), model gates and failure streaks —
//!   `learned::facts`;
//! - plugin state (affinity's session bindings, with their TTLs), last
//!   writer by write time wins — [`plugin`];
//! - in-flight counts, as leases that expire, so `max_in_flight` holds
//!   across replicas;
//! - OAuth refreshes, as a lock with a lease: one replica refreshes, the
//!   others adopt its credentials.
//!
//! Nothing on a request's path or inside a plugin call waits for Redis,
//! except an in-flight lease of an account with `max_in_flight`, which waits
//! at most `[state] lease_wait_ms`, and a request whose seat answered 401
//! while another replica refreshes it, which waits for that refresh. Each replica keeps its own full view (the
//! same structures a single gateway uses) and a background task keeps it in
//! step: changes are written every `flush_ms` and announced on a channel;
//! every replica applies the announcements as they arrive and re-reads every
//! record every `poll_ms` in case one was missed. A replica is therefore at
//! most `flush_ms` plus one Redis round trip behind another while Redis is
//! up (measured in `docs/benchmarks.md`), and at most `poll_ms` more if an
//! announcement is lost.
//!
//! Redis away, slow or answering garbage never costs a request: each replica
//! serves on its own view, reconnects with backoff, counts the errors and
//! reports them under `state_backend` in `/status`; `/readyz` does not
//! depend on it. When Redis is back, every replica writes its view again,
//! and the merge by observed time keeps anything older from replacing
//! anything newer.

pub mod plugin;
pub mod redis;

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use serde::Serialize;

use crate::learned::AccountBook;
use crate::oauth::CredentialShare;

/// A slot taken in the shared in-flight count of an account.
#[derive(Debug)]
pub struct RemoteLease {
    /// The account.
    pub account: String,
    /// The lease's member in the account's lease set.
    pub member: String,
}

/// What asking for a shared in-flight lease answered.
#[derive(Debug)]
pub enum LeaseAnswer {
    /// A slot across replicas.
    Granted(RemoteLease),
    /// Every slot across replicas is taken.
    Full,
    /// The backend could not answer within its budget: admit on this
    /// replica's count alone (fail open).
    Unavailable,
}

/// The backend's health, for `/status` (`state_backend`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackendStatus {
    /// `memory` or `redis`.
    pub kind: &'static str,
    /// The server, password hidden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// This replica's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Whether this replica is in step with the others now.
    pub connected: bool,
    /// Since when it has been connected (or away).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// The last error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Errors since start (commands failed, timed out, or answered garbage).
    pub errors: u64,
    /// Connections made since start.
    pub connects: u64,
    /// Other replicas whose records this one has seen.
    pub replicas_seen: usize,
    /// Account records from other replicas merged into this one's view.
    pub records_merged: u64,
    /// Plugin state writes from other replicas applied here.
    pub plugin_writes_applied: u64,
    /// Records ignored because they were about another identity.
    pub other_identity: u64,
    /// How far behind the writer the last applied announcement was, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_ms: Option<u64>,
    /// The most it has been since start, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_lag_ms: Option<u64>,
}

/// Where state that outlives a request is shared.
#[async_trait]
pub trait StateBackend: Send + Sync {
    /// Its health, for `/status`.
    fn status(&self) -> BackendStatus;

    /// Starts whatever keeps this replica's learned state in step with the
    /// others', for as long as `book` lives.
    fn start(self: Arc<Self>, book: Weak<AccountBook>);

    /// Waits (bounded by the backend's own timeout) until this replica's first
    /// attempt to get in step has ended, so that a fresh replica starts with
    /// what the others know — and refreshes no seat another has refreshed.
    /// It serves either way.
    async fn settle(&self) {}

    /// Whether in-flight limits are counted across replicas.
    fn shares_leases(&self) -> bool {
        false
    }

    /// Takes one of `max` slots of `account` across replicas.
    async fn lease(&self, _account: &str, _max: u32) -> LeaseAnswer {
        LeaseAnswer::Unavailable
    }

    /// Gives a slot back (never waits).
    fn release(&self, _lease: RemoteLease) {}

    /// How OAuth seats share one refresh, if they do.
    fn credentials(self: Arc<Self>) -> Option<Arc<dyn CredentialShare>> {
        None
    }
}

/// The embedded backend: everything stays in this process.
#[derive(Debug, Default)]
pub struct Embedded;

#[async_trait]
impl StateBackend for Embedded {
    fn status(&self) -> BackendStatus {
        BackendStatus { kind: "memory", connected: true, ..BackendStatus::default() }
    }

    fn start(self: Arc<Self>, _book: Weak<AccountBook>) {}
}
