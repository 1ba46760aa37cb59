//! The task that keeps one replica in step: connect, read everything, write
//! everything, then follow the channel, flush, poll and renew until the
//! connection fails (`Redis::start` reconnects).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use futures_util::StreamExt;
use redis::AsyncCommands;

use super::scripts::{DEL_IF_OLDER, SET_IF_NEWER};
use super::*;
use crate::learned::facts::{self, Absorbed, AccountFacts};
use crate::shared::plugin::PluginWrite;

impl Redis {
    /// Connects, reads everything, writes everything, then follows the
    /// channel and flushes until the connection fails.
    pub(super) async fn session(self: &Arc<Self>, book: &Weak<AccountBook>) -> Result<()> {
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
        self.pull_facts(book).await?;
        self.pull_plugin_state().await?;
        // Everything this replica holds, again: Redis may have lost it (a
        // restart without persistence), or missed what happened while away.
        self.flushed.lock().clear();
        let everything = self.plugin.everything(self.clock.now_ms());
        self.outbox.take_overflowed();
        self.outbox.put_back(everything);
        self.flush(book).await?;
        {
            let mut h = self.health.lock();
            h.connects += 1;
            h.since_ms = Some(self.clock.now_ms());
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
                    Some(m) => self.on_message(book, &m),
                    None => bail!("the subscription ended"),
                },
                _ = flush.tick() => self.flush(book).await?,
                _ = self.outbox.notify.notified() => self.flush(book).await?,
                _ = poll.tick() => self.pull_facts(book).await?,
                _ = renew.tick() => self.renew().await?,
                // Every record again, changed or not: what marks this replica alive.
                _ = rewrite.tick() => self.flushed.lock().clear(),
            }
        }
    }

    /// Applies one announcement from the channel.
    fn on_message(&self, book: &Weak<AccountBook>, m: &redis::Msg) {
        let Ok(payload) = m.get_payload::<String>() else {
            return self.garbage("an announcement that is not text");
        };
        let event: Event = match serde_json::from_str(&payload) {
            Ok(e) => e,
            Err(_) => return self.garbage("an announcement that does not parse"),
        };
        let now = self.clock.now_ms();
        match event {
            Event::Facts { r, a, f } if r != self.replica => {
                let Some(book) = book.upgrade() else { return };
                let written = f.written_ms;
                if self.absorb(&book, &r, &a, &f, now) {
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

    pub(super) fn garbage(&self, what: &'static str) {
        self.metrics.state_ignored("garbage");
        self.fail("read", &what, false);
    }

    /// Merges replica `r`'s record `f` of account `id`; whether it was taken.
    fn absorb(&self, book: &AccountBook, r: &str, id: &str, f: &AccountFacts, now: u64) -> bool {
        {
            let mut seen = self.seen.lock();
            seen.insert(r.to_string(), now);
            seen.retain(|_, at| now.saturating_sub(*at) < SEEN_MS);
        }
        let Some(state) = book.get(id) else { return false };
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
    async fn pull_facts(&self, book: &Weak<AccountBook>) -> Result<()> {
        let Some(g) = book.upgrade() else { return Ok(()) };
        let ids = g.ids();
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
        let now = self.clock.now_ms();
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
        let now = self.clock.now_ms();
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
    async fn flush(&self, book: &Weak<AccountBook>) -> Result<()> {
        let Some(g) = book.upgrade() else { return Ok(()) };
        let now = self.clock.now_ms();
        let mut pipe = redis::pipe();
        let mut versions = Vec::new();
        let events = self.key("events");
        for state in g.all() {
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
