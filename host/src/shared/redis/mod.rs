//! The Redis backend: what replicas of one pool share, kept in one Redis
//! server under `[state] key_prefix` (`P` below).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P facts:<account>` | hash | per replica, its record of the account (`learned::facts`) |
//! | `P ps:<n>:<scope>:<key>` | string | one plugin state entry, with its write time, expiring with its TTL |
//! | `P lease:<account>` | sorted set | in-flight leases, scored by when they lapse |
//! | `P oauth:<account>:lock` | string | the replica refreshing the seat, for a lease |
//! | `P oauth:<account>:cred` | string | the seat's newest pair (with `share_credentials`) |
//! | `P events` | channel | every record and plugin write, as it is made |
//!
//! One task per replica ([`Redis::start`]) holds a connection and a
//! subscription. It writes what changed every `flush_ms` (one pipeline),
//! applies what other replicas announce as it arrives, and re-reads every
//! account record every `poll_ms`. Any error drops the connection: the task
//! reconnects with backoff (100 ms doubling to 5 s), and on reconnecting
//! reads everything (plugin state included), then writes everything this
//! replica holds — the merge by time on both sides keeps the newer of each.
//!
//! Writes that compare (a plugin entry only over an older one, a lease only
//! under the limit, a lock only if free) are Lua scripts (`scripts`), so
//! each is atomic in Redis whatever the other replicas do. `sync` is the
//! task that keeps a replica in step; the seat's side is in `oauth`.

mod oauth;
mod scripts;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use async_trait::async_trait;
use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};

use super::plugin::{Outbox, SharedPluginState};
use super::{BackendStatus, LeaseAnswer, RemoteLease, StateBackend};
use crate::clock::Clock;
use crate::config::StateConfig;
use crate::learned::AccountBook;
use crate::learned::facts::AccountFacts;
use crate::metrics::Metrics;
use crate::oauth::CredentialShare;

/// How long a record of an account lives in Redis without being rewritten:
/// longer than the longest quota window (7 days).
const FACTS_TTL_MS: u64 = 8 * 24 * 3600 * 1000;
/// How long a plugin entry without a TTL lives in Redis (the in-process
/// store bounds it by size; Redis needs a bound in time).
const PLUGIN_TTL_MS: u64 = 7 * 24 * 3600 * 1000;
/// Plugin writes sent per flush at most (the rest go with the next).
const WRITES_PER_FLUSH: usize = 2_000;
/// How long leases are not asked for after one took longer than
/// `lease_wait_ms` (requests are admitted on this replica's count meanwhile).
const LEASE_PAUSE_MS: u64 = 1_000;
/// A record no replica has rewritten for this long belongs to a replica that
/// is gone (each rewrites all of its records every [`REWRITE_MS`]).
const RECORD_STALE_MS: u64 = 24 * 3600 * 1000;
/// How recently a replica must have written to count in `replicas_seen`.
const SEEN_MS: u64 = 10 * 60 * 1000;
/// How often a replica rewrites every record it holds, changed or not.
const REWRITE_MS: u64 = 3600 * 1000;
/// The first and the longest pause before reconnecting.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

use scripts::Scripts;

/// What travels on the channel.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
enum Event {
    /// A replica's record of an account.
    Facts { r: String, a: String, f: AccountFacts },
    /// A plugin state write (`val` absent: a delete).
    Ps { r: String, s: String, key: String, val: Option<String>, x: Option<u64>, w: u64 },
}

/// A plugin entry as stored in Redis.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    v: String,
    w: u64,
    #[serde(default)]
    x: Option<u64>,
}

#[derive(Default)]
struct Health {
    since_ms: Option<u64>,
    last_error: Option<String>,
    errors: u64,
    connects: u64,
    lag_ms: Option<u64>,
    max_lag_ms: Option<u64>,
    other_identity: u64,
    records_merged: u64,
    plugin_writes_applied: u64,
}

/// The Redis backend of one replica.
pub struct Redis {
    cfg: StateConfig,
    client: redis::Client,
    replica: String,
    /// The command connection, while connected.
    conn: Mutex<Option<MultiplexedConnection>>,
    connected: AtomicBool,
    /// Set once the first attempt to get in step has ended, either way.
    settled: tokio::sync::watch::Sender<bool>,
    plugin: Arc<SharedPluginState>,
    outbox: Arc<Outbox>,
    metrics: Arc<Metrics>,
    health: Mutex<Health>,
    /// Leases held: account → members.
    held: Mutex<HashMap<String, HashSet<String>>>,
    /// Leases to give back at the next flush.
    releases: Mutex<Vec<RemoteLease>>,
    next_member: AtomicU64,
    /// Until when leases are not asked for (see [`LEASE_PAUSE_MS`]).
    lease_skip_until: AtomicU64,
    /// Per account, the version last written.
    flushed: Mutex<HashMap<String, u64>>,
    /// Replicas whose records were seen, with when.
    seen: Mutex<HashMap<String, u64>>,
    scripts: Scripts,
    /// The gateway's clock: facts, leases and locks are stamped with it.
    clock: Clock,
}

/// A lease asked for and not yet handed to its request; given back on drop.
struct Pending<'a> {
    backend: &'a Redis,
    lease: Option<RemoteLease>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.lease.take() {
            self.backend.releases.lock().push(l);
            self.backend.outbox.notify.notify_one();
        }
    }
}

/// A name for this process among replicas: host, process id, random suffix.
pub fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "poolgate".into());
    format!("{host}-{}-{}", std::process::id(), crate::random::random_hex(2).unwrap_or_default())
}

impl Redis {
    /// The backend for `cfg`; `plugin` is the shared plugin store whose
    /// writes `outbox` queues. Connects only when started.
    pub fn new(
        cfg: &StateConfig,
        plugin: Arc<SharedPluginState>,
        outbox: Arc<Outbox>,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Result<Redis> {
        let url = cfg.url.as_deref().context("state.url is not set")?;
        let client = redis::Client::open(url).map_err(|_| anyhow!("state.url does not parse as a Redis URL"))?;
        Ok(Redis {
            cfg: cfg.clone(),
            client,
            replica: cfg.replica.clone().unwrap_or_else(replica_name),
            conn: Mutex::new(None),
            connected: AtomicBool::new(false),
            settled: tokio::sync::watch::Sender::new(false),
            plugin,
            outbox,
            metrics,
            health: Mutex::new(Health::default()),
            held: Mutex::new(HashMap::new()),
            releases: Mutex::new(Vec::new()),
            next_member: AtomicU64::new(0),
            lease_skip_until: AtomicU64::new(0),
            flushed: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            scripts: Scripts {
                lease: redis::Script::new(scripts::LEASE),
                renew: redis::Script::new(scripts::RENEW),
                unlock: redis::Script::new(scripts::UNLOCK),
            },
            clock,
        })
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.cfg.key_prefix)
    }

    fn plugin_key(&self, scope: &str, key: &str) -> String {
        // The scope's length first: scopes hold `:` (file paths), keys anything.
        self.key(&format!("ps:{}:{scope}:{key}", scope.len()))
    }

    fn split_plugin_key<'a>(&self, full: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = full.strip_prefix(self.cfg.key_prefix.as_str())?.strip_prefix("ps:")?;
        let (n, rest) = rest.split_once(':')?;
        let n: usize = n.parse().ok()?;
        let scope = rest.get(..n)?;
        let key = rest.get(n..)?.strip_prefix(':')?;
        Some((scope, key))
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.timeout_ms)
    }

    /// The connection, while connected.
    fn conn(&self) -> Option<MultiplexedConnection> {
        if !self.connected.load(Ordering::Acquire) {
            return None;
        }
        self.conn.lock().clone()
    }

    /// Records a failed operation; with `drop_link`, the connection goes too
    /// (the session task reconnects).
    fn fail(&self, op: &'static str, e: &dyn std::fmt::Display, drop_link: bool) {
        self.metrics.state_error(op);
        let message = crate::policy::fault::escape_controls(&format!("{op}: {e}")).into_owned();
        let mut h = self.health.lock();
        h.errors += 1;
        let was = self.connected.load(Ordering::Acquire);
        // Said once when the link goes, and once if it never came: the
        // retries every few seconds after that are at debug.
        let first = h.connects == 0 && h.last_error.is_none();
        if drop_link && (was || first) {
            self.connected.store(false, Ordering::Release);
            h.since_ms = Some(self.clock.now_ms());
            tracing::warn!(url = %self.cfg.redacted_url(), error = %message, "the shared state backend is unreachable; serving on this replica's own state and retrying");
        } else {
            tracing::debug!(error = %message, "shared state backend operation failed");
        }
        h.last_error = Some(message);
    }

    /// Runs `f` on the connection within the command timeout.
    async fn run<T>(
        &self,
        op: &'static str,
        f: impl AsyncFnOnce(&mut MultiplexedConnection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        let mut c = self.conn()?;
        match tokio::time::timeout(self.timeout(), f(&mut c)).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.fail(op, &e, e.is_io_error() || e.is_connection_dropped() || e.is_timeout());
                None
            }
            Err(_) => {
                self.fail(op, &"timed out", true);
                None
            }
        }
    }
}

#[async_trait]
impl StateBackend for Redis {
    fn status(&self) -> BackendStatus {
        let h = self.health.lock();
        BackendStatus {
            kind: "redis",
            url: Some(self.cfg.redacted_url()),
            replica: Some(self.replica.clone()),
            connected: self.connected.load(Ordering::Acquire),
            since_ms: h.since_ms,
            last_error: h.last_error.clone(),
            errors: h.errors,
            connects: h.connects,
            replicas_seen: self
                .seen
                .lock()
                .values()
                .filter(|at| self.clock.now_ms().saturating_sub(**at) < SEEN_MS)
                .count(),
            other_identity: h.other_identity,
            records_merged: h.records_merged,
            plugin_writes_applied: h.plugin_writes_applied,
            lag_ms: h.lag_ms,
            max_lag_ms: h.max_lag_ms,
        }
    }

    fn start(self: Arc<Self>, book: Weak<AccountBook>) {
        tokio::spawn(async move {
            let mut backoff = FIRST_BACKOFF;
            loop {
                if book.strong_count() == 0 {
                    return;
                }
                let started = crate::clock::machine_instant();
                if let Err(e) = self.session(&book).await {
                    self.fail("connect", &format!("{e:#}"), true);
                }
                self.settled.send_replace(true);
                self.connected.store(false, Ordering::Release);
                *self.conn.lock() = None;
                if started.elapsed() > Duration::from_secs(10) {
                    backoff = FIRST_BACKOFF;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        });
    }

    async fn settle(&self) {
        let mut settled = self.settled.subscribe();
        // Connecting, subscribing and the first reads, each bounded by the timeout.
        let bound = Duration::from_millis(self.cfg.timeout_ms.saturating_mul(4));
        let _ = tokio::time::timeout(bound, settled.wait_for(|s| *s)).await;
    }

    fn shares_leases(&self) -> bool {
        true
    }

    async fn lease(&self, account: &str, max: u32) -> LeaseAnswer {
        if !self.connected.load(Ordering::Acquire)
            || self.lease_skip_until.load(Ordering::Acquire) > self.clock.now_ms()
        {
            return LeaseAnswer::Unavailable;
        }
        let member = format!("{}:{}", self.replica, self.next_member.fetch_add(1, Ordering::Relaxed));
        // Whatever happens from here — an answer past the budget, or the
        // request going away mid-wait — a grant Redis may have made is taken
        // back at the next flush, unless it is handed to the request.
        let mut pending = Pending { backend: self, lease: Some(RemoteLease { account: account.into(), member }) };
        let member = &pending.lease.as_ref().map_or("", |l| l.member.as_str()).to_string();
        let key = self.key(&format!("lease:{account}"));
        let ttl = self.cfg.lease_ttl_ms;
        let ask = self.run("lease", async |c| {
            self.scripts.lease.key(&key).arg(member).arg(max).arg(ttl).invoke_async::<i64>(c).await
        });
        let Ok(answer) = tokio::time::timeout(Duration::from_millis(self.cfg.lease_wait_ms), ask).await else {
            // Past the request's budget: admitted on this replica's count.
            // Redis that slow is asked again only after a pause, so a slow
            // but connected server costs requests one wait, not one each.
            self.metrics.state_error("lease");
            self.lease_skip_until.store(self.clock.now_ms() + LEASE_PAUSE_MS, Ordering::Release);
            self.fail(
                "lease",
                &format!("no answer within lease_wait_ms; leases paused for {LEASE_PAUSE_MS} ms"),
                false,
            );
            return LeaseAnswer::Unavailable;
        };
        match answer {
            Some(1) => {
                let lease = pending.lease.take().expect("the pending lease");
                self.held.lock().entry(account.to_string()).or_default().insert(lease.member.clone());
                LeaseAnswer::Granted(lease)
            }
            Some(_) => {
                pending.lease = None;
                LeaseAnswer::Full
            }
            None => LeaseAnswer::Unavailable,
        }
    }

    fn release(&self, lease: RemoteLease) {
        if let Some(m) = self.held.lock().get_mut(&lease.account) {
            m.remove(&lease.member);
        }
        self.releases.lock().push(lease);
        self.outbox.notify.notify_one();
    }

    fn credentials(self: Arc<Self>) -> Option<Arc<dyn CredentialShare>> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(prefix: &str) -> Redis {
        let cfg = StateConfig {
            backend: crate::config::StateBackendKind::Redis,
            url: Some("redis://127.0.0.1:1".into()),
            key_prefix: prefix.into(),
            ..StateConfig::default()
        };
        let outbox = Arc::new(Outbox::default());
        let plugin = Arc::new(SharedPluginState::new(Arc::default(), outbox.clone(), Clock::default()));
        Redis::new(&cfg, plugin, outbox, Arc::default(), Clock::default()).unwrap()
    }

    #[test]
    fn plugin_keys_round_trip_whatever_the_scope_and_key_hold() {
        let r = backend("team:a:");
        for (scope, key) in [("builtin:affinity", "s1"), ("file:/p/x:y.wasm", "a:b:c"), ("s", "")] {
            let full = r.plugin_key(scope, key);
            assert_eq!(r.split_plugin_key(&full), Some((scope, key)), "{full}");
        }
        assert_eq!(r.split_plugin_key("other:ps:1:s:k"), None);
    }
}
