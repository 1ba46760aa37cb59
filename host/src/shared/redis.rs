//! The Redis backend: what replicas of one pool share, kept in one Redis
//! server under `[state] key_prefix` (`P` below).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P facts:<account>` | hash | per replica, its record of the account ([`super::facts`]) |
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
//! under the limit, a lock only if free) are Lua scripts, so each is atomic
//! in Redis whatever the other replicas do.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use futures_util::StreamExt;
use parking_lot::Mutex;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};

use super::facts::{self, Absorbed, AccountFacts};
use super::plugin::{Outbox, PluginWrite, SharedPluginState};
use super::{BackendStatus, LeaseAnswer, RemoteLease, StateBackend};
use crate::config::StateConfig;
use crate::gateway::metrics::Metrics;
use crate::gateway::{Gateway, now_ms};
use crate::oauth::{CredentialShare, SharedLock, StoredCredential};

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

/// Sets a plugin entry unless Redis holds one written later.
/// KEYS[1] entry; ARGV: value record, its write time, expiry (ms, absolute), TTL if none.
const SET_IF_NEWER: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, d = pcall(cjson.decode, cur)
  if ok and type(d) == 'table' and tonumber(d.w) and tonumber(d.w) > tonumber(ARGV[2]) then return 0 end
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
end
return 1
"#;

/// Deletes a plugin entry unless it was written after the delete.
const DEL_IF_OLDER: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, d = pcall(cjson.decode, cur)
if ok and type(d) == 'table' and tonumber(d.w) and tonumber(d.w) > tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// Takes an in-flight lease if fewer than the limit are live. Time is
/// Redis's own, so replicas' clocks do not matter.
/// KEYS[1] lease set; ARGV: member, limit, TTL.
const LEASE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[3]))
  return 1
end
return 0
"#;

/// Extends the leases this replica holds — and puts them back if Redis lost
/// them (a restart). KEYS[1] lease set; ARGV: TTL, members…
const RENEW: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[1]))
return 1
"#;

/// Lets a lock go if it is still this holder's. KEYS[1] lock; ARGV[1] token.
const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

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

/// The scripts run one at a time (plugin writes go in pipelines, as `EVAL`).
struct Scripts {
    lease: redis::Script,
    renew: redis::Script,
    unlock: redis::Script,
}

fn replica_name() -> String {
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
                lease: redis::Script::new(LEASE),
                renew: redis::Script::new(RENEW),
                unlock: redis::Script::new(UNLOCK),
            },
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
        if drop_link && was {
            self.connected.store(false, Ordering::Release);
            h.since_ms = Some(now_ms());
            tracing::warn!(error = %message, "the shared state backend is unreachable; serving on this replica's own state");
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

    /// Connects, reads everything, writes everything, then follows the
    /// channel and flushes until the connection fails.
    async fn session(self: &Arc<Self>, gw: &Weak<Gateway>) -> Result<()> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout()))
            .set_response_timeout(Some(self.timeout()));
        let conn = self.client.get_multiplexed_async_connection_with_config(&config).await?;
        let mut pubsub = tokio::time::timeout(self.timeout(), self.client.get_async_pubsub())
            .await
            .map_err(|_| anyhow!("subscribing timed out"))??;
        tokio::time::timeout(self.timeout(), pubsub.subscribe(self.key("events")))
            .await
            .map_err(|_| anyhow!("subscribing timed out"))??;
        *self.conn.lock() = Some(conn);
        self.connected.store(true, Ordering::Release);
        self.pull_facts(gw).await?;
        self.pull_plugin_state().await?;
        // Everything this replica holds, again: Redis may have lost it (a
        // restart without persistence), or missed what happened while away.
        self.flushed.lock().clear();
        let everything = self.plugin.everything(now_ms());
        self.outbox.take_overflowed();
        self.outbox.put_back(everything);
        self.flush(gw).await?;
        {
            let mut h = self.health.lock();
            h.connects += 1;
            h.since_ms = Some(now_ms());
        }
        tracing::info!(url = %self.cfg.redacted_url(), replica = %self.replica, "in step with the shared state backend");
        self.settled.send_replace(true);
        let mut messages = pubsub.on_message();
        let mut flush = tokio::time::interval(Duration::from_millis(self.cfg.flush_ms));
        let mut poll = tokio::time::interval(Duration::from_millis(self.cfg.poll_ms));
        let mut renew = tokio::time::interval(Duration::from_millis((self.cfg.lease_ttl_ms / 3).max(100)));
        let mut rewrite = tokio::time::interval(Duration::from_millis(REWRITE_MS));
        for t in [&mut flush, &mut poll, &mut renew, &mut rewrite] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t.tick().await;
        }
        loop {
            if !self.connected.load(Ordering::Acquire) {
                bail!("{}", self.health.lock().last_error.clone().unwrap_or_else(|| "connection lost".into()));
            }
            tokio::select! {
                m = messages.next() => match m {
                    Some(m) => self.on_message(gw, &m),
                    None => bail!("the subscription ended"),
                },
                _ = flush.tick() => self.flush(gw).await?,
                _ = self.outbox.notify.notified() => self.flush(gw).await?,
                _ = poll.tick() => self.pull_facts(gw).await?,
                _ = renew.tick() => self.renew().await?,
                // Every record again, changed or not: what marks this replica alive.
                _ = rewrite.tick() => self.flushed.lock().clear(),
            }
        }
    }

    /// Applies one announcement from the channel.
    fn on_message(&self, gw: &Weak<Gateway>, m: &redis::Msg) {
        let Ok(payload) = m.get_payload::<String>() else {
            return self.garbage("an announcement that is not text");
        };
        let event: Event = match serde_json::from_str(&payload) {
            Ok(e) => e,
            Err(_) => return self.garbage("an announcement that does not parse"),
        };
        let now = now_ms();
        match event {
            Event::Facts { r, a, f } if r != self.replica => {
                let Some(gw) = gw.upgrade() else { return };
                let written = f.written_ms;
                if self.absorb(&gw, &r, &a, &f, now) {
                    let lag = now.saturating_sub(written);
                    self.metrics.state_lag(lag as f64 / 1000.0);
                    let mut h = self.health.lock();
                    h.lag_ms = Some(lag);
                    h.max_lag_ms = Some(h.max_lag_ms.unwrap_or(0).max(lag));
                }
            }
            Event::Ps { r, s, key, val, x, w } if r != self.replica => {
                if w > now.saturating_add(facts::MAX_SKEW_MS) {
                    return self.garbage("a plugin write from the future");
                }
                if self.plugin.apply(&PluginWrite { scope: s, key, value: val, expires_at: x, written: w }, now) {
                    self.health.lock().plugin_writes_applied += 1;
                }
            }
            _ => {}
        }
    }

    fn garbage(&self, what: &'static str) {
        self.metrics.state_ignored("garbage");
        self.fail("read", &what, false);
    }

    /// Merges replica `r`'s record `f` of account `id`; whether it was taken.
    fn absorb(&self, gw: &Gateway, r: &str, id: &str, f: &AccountFacts, now: u64) -> bool {
        {
            let mut seen = self.seen.lock();
            seen.insert(r.to_string(), now);
            seen.retain(|_, at| now.saturating_sub(*at) < SEEN_MS);
        }
        let Some(state) = gw.account_state(id) else { return false };
        let identity = state.identity();
        let absorbed = facts::absorb(&mut state.learned(), f, r, identity.as_deref(), now);
        tracing::trace!(account = id, replica = r, ?absorbed, "shared record merged");
        match absorbed {
            Absorbed::Merged(_) => {
                self.health.lock().records_merged += 1;
                true
            }
            Absorbed::OtherIdentity => {
                self.metrics.state_ignored("other_identity");
                self.health.lock().other_identity += 1;
                tracing::debug!(account = id, replica = r, "a shared record about another identity was ignored");
                false
            }
            Absorbed::Garbage(why) => {
                self.garbage(why);
                false
            }
        }
    }

    /// Reads every replica's record of every account this replica knows.
    async fn pull_facts(&self, gw: &Weak<Gateway>) -> Result<()> {
        let Some(g) = gw.upgrade() else { return Ok(()) };
        let ids = g.account_ids();
        if ids.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.hgetall(self.key(&format!("facts:{id}")));
        }
        let records: Vec<HashMap<String, String>> = self
            .run("read", async |c| pipe.query_async(c).await)
            .await
            .ok_or_else(|| anyhow!("reading records failed"))?;
        let now = now_ms();
        let mut gone = redis::pipe();
        let mut any_gone = false;
        for (id, record) in ids.iter().zip(records) {
            for (r, json) in record {
                if r == self.replica {
                    continue;
                }
                match serde_json::from_str::<AccountFacts>(&json) {
                    // A replica that has not rewritten its record for a day is
                    // gone; what it knew lives on in the others' records.
                    Ok(f) if now.saturating_sub(f.written_ms) > RECORD_STALE_MS => {
                        gone.hdel(self.key(&format!("facts:{id}")), &r).ignore();
                        any_gone = true;
                    }
                    Ok(f) => {
                        self.absorb(&g, &r, id, &f, now);
                    }
                    Err(_) => self.garbage("a record that does not parse"),
                }
            }
        }
        if any_gone {
            self.run("write", async |c| gone.query_async::<()>(c).await).await;
        }
        Ok(())
    }

    /// Reads every plugin entry (at connect: announcements missed while away).
    async fn pull_plugin_state(&self) -> Result<()> {
        let pattern = format!("{}ps:*", self.cfg.key_prefix);
        let mut cursor: u64 = 0;
        let now = now_ms();
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .run("read", async |c| {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(c)
                        .await
                })
                .await
                .ok_or_else(|| anyhow!("reading plugin state failed"))?;
            if !keys.is_empty() {
                let values: Vec<Option<String>> = self
                    .run("read", async |c| c.mget(&keys).await)
                    .await
                    .ok_or_else(|| anyhow!("reading plugin state failed"))?;
                for (k, v) in keys.iter().zip(values) {
                    let (Some((scope, key)), Some(v)) = (self.split_plugin_key(k), v) else { continue };
                    match serde_json::from_str::<Entry>(&v) {
                        Ok(e) if e.w <= now.saturating_add(facts::MAX_SKEW_MS) => {
                            let w = PluginWrite {
                                scope: scope.into(),
                                key: key.into(),
                                value: Some(e.v),
                                expires_at: e.x,
                                written: e.w,
                            };
                            if self.plugin.apply(&w, now) {
                                self.health.lock().plugin_writes_applied += 1;
                            }
                        }
                        _ => self.garbage("a plugin entry that does not parse"),
                    }
                }
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Writes what changed since the last flush: account records, plugin
    /// writes, lease releases — one pipeline.
    async fn flush(&self, gw: &Weak<Gateway>) -> Result<()> {
        let Some(g) = gw.upgrade() else { return Ok(()) };
        let now = now_ms();
        let mut pipe = redis::pipe();
        let mut versions = Vec::new();
        let events = self.key("events");
        for state in g.account_states() {
            let version = state.version();
            if self.flushed.lock().get(&state.id) == Some(&version) {
                continue;
            }
            let Some(identity) = state.identity() else { continue };
            let f = facts::export(&state.learned(), &identity, now);
            let key = self.key(&format!("facts:{}", state.id));
            let record = serde_json::to_string(&f)?;
            pipe.hset(&key, &self.replica, &record).ignore();
            pipe.pexpire(&key, FACTS_TTL_MS as i64).ignore();
            let event = Event::Facts { r: self.replica.clone(), a: state.id.clone(), f };
            pipe.publish(&events, serde_json::to_string(&event)?).ignore();
            versions.push((state.id.clone(), version));
        }
        let writes = self.outbox.take(WRITES_PER_FLUSH);
        for w in &writes {
            self.queue_plugin_write(&mut pipe, w, now)?;
        }
        let releases = std::mem::take(&mut *self.releases.lock());
        for l in &releases {
            pipe.zrem(self.key(&format!("lease:{}", l.account)), &l.member).ignore();
        }
        if versions.is_empty() && writes.is_empty() && releases.is_empty() {
            return Ok(());
        }
        let sent = self.run("write", async |c| pipe.query_async::<()>(c).await).await;
        if sent.is_none() {
            self.outbox.put_back(writes);
            self.releases.lock().extend(releases);
            bail!("writing to the shared state backend failed");
        }
        let mut flushed = self.flushed.lock();
        for (id, v) in versions {
            flushed.insert(id, v);
        }
        if !self.outbox.is_empty() {
            self.outbox.notify.notify_one();
        }
        Ok(())
    }

    fn queue_plugin_write(&self, pipe: &mut redis::Pipeline, w: &PluginWrite, now: u64) -> Result<()> {
        if w.expires_at.is_some_and(|x| x <= now) {
            return Ok(());
        }
        let key = self.plugin_key(&w.scope, &w.key);
        match &w.value {
            Some(v) => {
                let entry = serde_json::to_string(&Entry { v: v.clone(), w: w.written, x: w.expires_at })?;
                let expires = w.expires_at.map(|x| x.to_string()).unwrap_or_default();
                pipe.cmd("EVAL")
                    .arg(SET_IF_NEWER)
                    .arg(1)
                    .arg(&key)
                    .arg(entry)
                    .arg(w.written)
                    .arg(expires)
                    .arg(PLUGIN_TTL_MS)
                    .ignore();
            }
            None => {
                pipe.cmd("EVAL").arg(DEL_IF_OLDER).arg(1).arg(&key).arg(w.written).ignore();
            }
        }
        let event = Event::Ps {
            r: self.replica.clone(),
            s: w.scope.clone(),
            key: w.key.clone(),
            val: w.value.clone(),
            x: w.expires_at,
            w: w.written,
        };
        pipe.publish(self.key("events"), serde_json::to_string(&event)?).ignore();
        Ok(())
    }

    /// Extends every lease this replica holds.
    async fn renew(&self) -> Result<()> {
        let held: Vec<(String, Vec<String>)> = self
            .held
            .lock()
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(a, m)| (a.clone(), m.iter().cloned().collect()))
            .collect();
        for (account, members) in held {
            let key = self.key(&format!("lease:{account}"));
            let ttl = self.cfg.lease_ttl_ms;
            self.run("lease", async |c| {
                let mut inv = self.scripts.renew.key(&key);
                inv.arg(ttl);
                for m in &members {
                    inv.arg(m);
                }
                inv.invoke_async::<()>(c).await
            })
            .await
            .ok_or_else(|| anyhow!("renewing leases failed"))?;
        }
        Ok(())
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
            replicas_seen: self.seen.lock().values().filter(|at| now_ms().saturating_sub(**at) < SEEN_MS).count(),
            other_identity: h.other_identity,
            records_merged: h.records_merged,
            plugin_writes_applied: h.plugin_writes_applied,
            lag_ms: h.lag_ms,
            max_lag_ms: h.max_lag_ms,
        }
    }

    fn start(self: Arc<Self>, gateway: Weak<Gateway>) {
        tokio::spawn(async move {
            let mut backoff = FIRST_BACKOFF;
            loop {
                if gateway.strong_count() == 0 {
                    return;
                }
                let started = std::time::Instant::now();
                if let Err(e) = self.session(&gateway).await {
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
        if !self.connected.load(Ordering::Acquire) || self.lease_skip_until.load(Ordering::Acquire) > now_ms() {
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
            self.lease_skip_until.store(now_ms() + LEASE_PAUSE_MS, Ordering::Release);
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

#[async_trait]
impl CredentialShare for Redis {
    async fn lock(&self, account: &str) -> SharedLock {
        let key = self.key(&format!("oauth:{account}:lock"));
        let token =
            format!("{}:{}", self.replica, crate::random::random_hex(8).unwrap_or_else(|_| now_ms().to_string()));
        let ms = self.cfg.refresh_lock_ms;
        let set: Option<Option<String>> = self
            .run("oauth", async |c| {
                redis::cmd("SET").arg(&key).arg(&token).arg("NX").arg("PX").arg(ms).query_async(c).await
            })
            .await;
        match set {
            Some(Some(_)) => SharedLock::Acquired(token),
            Some(None) => SharedLock::Held,
            None => SharedLock::Unavailable,
        }
    }

    async fn unlock(&self, account: &str, token: &str) {
        let key = self.key(&format!("oauth:{account}:lock"));
        self.run("oauth", async |c| self.scripts.unlock.key(&key).arg(token).invoke_async::<i64>(c).await).await;
    }

    async fn load(&self, account: &str) -> Option<StoredCredential> {
        if !self.cfg.share_credentials {
            return None;
        }
        let key = self.key(&format!("oauth:{account}:cred"));
        let text: Option<String> = self.run("oauth", async |c| c.get(&key).await).await.flatten();
        match serde_json::from_str(&text?) {
            Ok(c) => Some(c),
            Err(_) => {
                self.garbage("shared credentials that do not parse");
                None
            }
        }
    }

    async fn store(&self, account: &str, credential: &StoredCredential) -> bool {
        if !self.cfg.share_credentials {
            // Shared through a credentials file, if at all: nothing to wait for.
            return true;
        }
        let key = self.key(&format!("oauth:{account}:cred"));
        let Ok(text) = serde_json::to_string(credential) else { return false };
        // Kept a day past the access token's expiry: its refresh token is
        // what the next refresh needs.
        let ttl = credential.expires_at_ms.saturating_sub(now_ms()).saturating_add(24 * 3600 * 1000);
        self.run("oauth", async |c| c.pset_ex::<_, _, ()>(&key, text, ttl).await).await.is_some()
    }

    fn lock_ms(&self) -> u64 {
        self.cfg.refresh_lock_ms
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
        let plugin = Arc::new(SharedPluginState::new(Arc::default(), outbox.clone()));
        Redis::new(&cfg, plugin, outbox, Arc::default()).unwrap()
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
