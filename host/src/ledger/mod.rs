//! The usage ledger: one entry per answered request — who asked (the client
//! key), which model, which account served, the tokens the answer reported
//! and what they cost — kept durably, off the request path.
//!
//! Why a ledger and not only counters: budgets and reports must survive a
//! restart (a budget kept in memory resets with the process — the complaint
//! every gateway with in-memory spend hears), and an operator asks questions
//! after the fact (by key, team, model or account, over any range) that no
//! pre-aggregated counter answers.
//!
//! How it stays off the request path: a request's end pushes its [`Entry`]
//! onto a bounded in-memory queue (a lock held for a `push_back`) and goes
//! on. One writer thread takes whatever is queued at most `flush_ms` after the
//! previous write and writes it in one transaction. A store that fails keeps
//! its entries queued and is retried with a doubling pause; past `queue_max`
//! a new entry is dropped **and counted** — in [`Health`], `/status` and
//! `/metrics` — never silently. A report first writes what is queued, then
//! asks the store, so it counts every request answered before it.
//!
//! - [`calendar`]: UTC days, weeks and months;
//! - [`keys`]: client keys managed at run time, kept in the store;
//! - [`limits`]: what one key may do, and the meter holding it to that;
//! - [`prices`]: what a request's usage cost, by model;
//! - [`sqlite`]: the embedded store (a file, WAL), which keeps each batch as
//!   one [`segment`];
//! - [`postgres`]: the shared store, for replicas (a PostgreSQL database);
//! - [`report`]: the questions a report asks and its rows.

pub mod calendar;
pub mod keys;
pub mod limits;
pub mod postgres;
pub mod prices;
pub mod report;
pub mod segment;
pub mod sqlite;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use poolgate_wire::usage::Usage;
use serde::Serialize;

pub use report::{Query, Row};

pub use keys::KeyRecord;

use calendar::Period;
use limits::{Meters, Spent};

use crate::clock::Clock;

/// One answered request, as the ledger keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entry {
    /// When the request arrived, ms since the Unix epoch.
    pub at_ms: u64,
    /// The gateway's request id (with `replica`, unique).
    pub request: u64,
    /// The replica that answered (shared by every entry of the process).
    pub replica: Arc<str>,
    /// The client key's name (`-` for a gateway without keys).
    pub key: String,
    /// The key's team tag (empty: none).
    pub team: String,
    /// `messages`, `count_tokens`, `chat_completions`, `models`.
    pub api: &'static str,
    /// The model asked for.
    pub model: String,
    /// The account that served, or the fallback (`fallback:<name>/<model>`);
    /// empty for an answer the gateway wrote itself.
    pub account: String,
    /// The status the client got.
    pub status: u16,
    /// How the request ended (`complete`, `parked`, `client_gone`, …).
    pub outcome: &'static str,
    /// The tokens the answer reported (zero when it reported none).
    pub usage: Usage,
    /// Whether the answer reported its usage (a cut stream may not have).
    pub usage_known: bool,
    /// What it cost, nano-USD; `None` for a model with no price.
    pub cost_nano: Option<u64>,
}

/// What a store does: append entries, answer reports. Called on the
/// ledger's writer thread only, one call at a time.
pub trait Store: Send {
    /// Appends `entries`, all or none.
    fn append(&mut self, entries: &[Entry]) -> anyhow::Result<()>;
    /// Answers `query`.
    fn report(&mut self, query: &Query) -> anyhow::Result<Vec<Row>>;
    /// Every key managed at run time (revoked ones included).
    fn keys(&mut self) -> anyhow::Result<Vec<KeyRecord>>;
    /// Adds `key`, or replaces the one of its name.
    fn put_key(&mut self, key: &KeyRecord) -> anyhow::Result<()>;
    /// What the store is, for `/status` (never a password).
    fn describe(&self) -> String;
    /// What every key spent in each period that began at or after
    /// `since_ms`, summed over every entry written (by any replica): the
    /// totals budgets are held to. `append` keeps them in step with the
    /// entries, in the same transaction ([`spend_rows`]).
    fn spend(&mut self, since_ms: u64) -> anyhow::Result<Vec<SpendRow>>;
    /// Whether other replicas write to it too (then its totals are read
    /// every flush, not only after this replica wrote).
    fn shared(&self) -> bool {
        false
    }
}

/// The store `[ledger]` names — its PostgreSQL database (`url`), else its
/// SQLite file (`file`) — opened (and its tables created) now; `None`
/// without a ledger. An error names `setting` (`ledger.url`, `ledger.file`)
/// and why, never a password.
pub fn open(
    url: Option<&str>,
    file: Option<&std::path::Path>,
    setting: &str,
) -> anyhow::Result<Option<Box<dyn Store>>> {
    let store: Box<dyn Store> = match (url, file) {
        (Some(url), _) => Box::new(postgres::Postgres::open(url).map_err(|e| anyhow::anyhow!("{setting}: {e:#}"))?),
        (None, Some(path)) => Box::new(sqlite::Sqlite::open(path).map_err(|e| anyhow::anyhow!("{setting}: {e:#}"))?),
        (None, None) => return Ok(None),
    };
    Ok(Some(store))
}

/// What one key spent in one calendar period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendRow {
    /// The client key.
    pub key: String,
    /// The period.
    pub period: Period,
    /// When it began, ms since the epoch.
    pub from_ms: u64,
    /// What was spent in it (`spent.from_ms` is `from_ms`).
    pub spent: Spent,
}

/// `entries` summed by key, period and the period's start (each entry in the
/// day, week and month it arrived in): what an append adds to the totals.
pub fn spend_rows(entries: &[Entry]) -> Vec<SpendRow> {
    let mut sums: std::collections::BTreeMap<(&str, u8, u64), Spent> = std::collections::BTreeMap::new();
    for e in entries {
        for (i, period) in calendar::PERIODS.iter().enumerate() {
            let from_ms = period.around(e.at_ms).0;
            let s = sums.entry((e.key.as_str(), i as u8, from_ms)).or_insert(Spent { from_ms, ..Spent::default() });
            s.add(&e.usage, e.cost_nano.unwrap_or(0));
        }
    }
    sums.into_iter()
        .map(|((key, i, from_ms), spent)| SpendRow {
            key: key.to_string(),
            period: calendar::PERIODS[i as usize],
            from_ms,
            spent,
        })
        .collect()
}

/// How the ledger is doing, for `/status` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Health {
    /// The store, described.
    pub store: String,
    /// Entries waiting to be written.
    pub queued: usize,
    /// Entries written since the start.
    pub written: u64,
    /// Entries dropped because the queue was full (the store was down too
    /// long): counted here, never silently.
    pub dropped: u64,
    /// The store's last error while it is failing; `None` when it is up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down: Option<String>,
}

/// How the writer is tuned.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Longest an answered request's entry waits before it is written.
    pub flush: Duration,
    /// Most entries kept waiting (a store down meanwhile).
    pub queue_max: usize,
}

type Reply<T> = tokio::sync::oneshot::Sender<anyhow::Result<T>>;

/// What the writer is asked besides writing entries (after writing them).
enum Ask {
    Report(Query, Reply<Vec<Row>>),
    Spend(Reply<()>),
    Keys(Reply<Vec<KeyRecord>>),
    PutKey(Box<KeyRecord>, Reply<()>),
}

impl Ask {
    /// Answers it from `store`, or with `down` when the store is failing.
    fn answer(self, store: &mut dyn Store, down: Option<&str>) {
        let refused = || anyhow::anyhow!("the ledger's store is down: {}", down.unwrap_or_default());
        match self {
            // Answered by the writer, which holds the meters.
            Ask::Spend(reply) => drop(reply.send(down.map_or(Ok(()), |d| Err(anyhow::anyhow!("{d}"))))),
            Ask::Report(q, reply) => drop(reply.send(if down.is_some() { Err(refused()) } else { store.report(&q) })),
            Ask::Keys(reply) => drop(reply.send(if down.is_some() { Err(refused()) } else { store.keys() })),
            Ask::PutKey(k, reply) => drop(reply.send(if down.is_some() { Err(refused()) } else { store.put_key(&k) })),
        }
    }
}

#[derive(Default)]
struct Shared {
    queue: VecDeque<Entry>,
    asks: Vec<Ask>,
    health: Health,
    stop: bool,
}

/// The ledger: a bounded queue and the thread that writes it.
pub struct Ledger {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    queue_max: usize,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Ledger {
    /// Starts the writer thread over `store`; it keeps `meters` in step with
    /// the store's totals ([`Meters::written`]), reading the time from
    /// `clock`.
    pub fn start(store: Box<dyn Store>, tuning: Tuning, meters: Arc<Meters>, clock: Clock) -> Arc<Ledger> {
        let health = Health { store: store.describe(), ..Health::default() };
        let shared = Arc::new((Mutex::new(Shared { health, ..Shared::default() }), Condvar::new()));
        let for_writer = shared.clone();
        let totals = Totals { meters, clock, unread: Vec::new(), failing: false };
        let writer = std::thread::Builder::new()
            .name("poolgate-ledger".into())
            .spawn(move || write_loop(store, &for_writer, tuning, totals))
            .expect("a thread can be started");
        Arc::new(Ledger { shared, queue_max: tuning.queue_max.max(1), writer: Mutex::new(Some(writer)) })
    }

    /// Queues `entry` (the request path: a lock for a push, no I/O).
    pub fn push(&self, entry: Entry) {
        let mut s = self.shared.0.lock();
        if s.stop {
            // A request that ended after the last write at shutdown.
            s.health.dropped += 1;
            tracing::warn!(request = entry.request, key = %entry.key, "usage ledger: an entry came after the ledger stopped; dropped");
            return;
        }
        if s.queue.len() >= self.queue_max {
            s.health.dropped += 1;
            return;
        }
        s.queue.push_back(entry);
    }

    /// How it is doing.
    pub fn health(&self) -> Health {
        let s = self.shared.0.lock();
        Health { queued: s.queue.len(), ..s.health.clone() }
    }

    /// Answers `query` after writing what is queued (an error when the
    /// store cannot).
    pub async fn report(&self, query: Query) -> anyhow::Result<Vec<Row>> {
        self.ask(|tx| Ask::Report(query, tx)).await
    }

    /// Writes what is queued and reads the store's totals into the meters
    /// now (at start, before the first request is admitted); an error when
    /// the store cannot be read.
    pub async fn read_totals(&self) -> anyhow::Result<()> {
        self.ask(Ask::Spend).await
    }

    /// Every key managed at run time.
    pub async fn keys(&self) -> anyhow::Result<Vec<KeyRecord>> {
        self.ask(Ask::Keys).await
    }

    /// Adds a key managed at run time, or replaces the one of its name.
    pub async fn put_key(&self, key: KeyRecord) -> anyhow::Result<()> {
        self.ask(|tx| Ask::PutKey(Box::new(key), tx)).await
    }

    async fn ask<T>(&self, ask: impl FnOnce(Reply<T>) -> Ask) -> anyhow::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut s = self.shared.0.lock();
            if s.stop {
                anyhow::bail!("the ledger is stopped");
            }
            s.asks.push(ask(tx));
        }
        self.shared.1.notify_one();
        rx.await.map_err(|_| anyhow::anyhow!("the ledger's writer stopped"))?
    }

    /// Writes what is queued and stops the writer (at shutdown); what the
    /// store refuses then is reported in the log, with its count.
    pub fn stop(&self) {
        self.shared.0.lock().stop = true;
        self.shared.1.notify_one();
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the writer keeps the meters in step with.
struct Totals {
    meters: Arc<Meters>,
    clock: Clock,
    /// What this replica wrote since the store's totals were last read.
    unread: Vec<SpendRow>,
    /// Whether the last read failed (said once, not at every flush).
    failing: bool,
}

impl Totals {
    /// Reads the store's totals for the periods in force into the meters;
    /// the error when the store could not answer (the meters keep counting
    /// what was written as pending until a read succeeds).
    fn read(&mut self, store: &mut dyn Store) -> Result<(), String> {
        let now = self.clock.now_ms();
        let since = calendar::PERIODS.iter().map(|p| p.around(now).0).min().unwrap_or(0);
        match store.spend(since) {
            Ok(totals) => {
                self.meters.written(&std::mem::take(&mut self.unread), &totals, now);
                if std::mem::take(&mut self.failing) {
                    tracing::info!("usage ledger: the spend totals are read again");
                }
                Ok(())
            }
            Err(e) => {
                let why = format!("cannot read the spend totals: {e:#}");
                // Once, not at every flush while a shared store is down.
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(error = %why, "usage ledger: budgets count this replica's own spend meanwhile");
                }
                Err(why)
            }
        }
    }
}

/// The writer: waits until `flush` after its last write (machine time: the
/// flush interval bounds what a crash loses, which is real time) (or for a report,
/// or the stop), writes everything queued in one append, reads the totals
/// budgets are held to, answers what it was asked (reports, keys).
fn write_loop(mut store: Box<dyn Store>, shared: &(Mutex<Shared>, Condvar), tuning: Tuning, mut totals: Totals) {
    let (flush, queue_max) = (tuning.flush, tuning.queue_max.max(1));
    let (lock, wake) = shared;
    let mut next_write = crate::clock::machine_instant() + flush;
    let mut backoff = flush;
    loop {
        let (batch, asks, stop) = {
            let mut s = lock.lock();
            while !s.stop && s.asks.is_empty() && crate::clock::machine_instant() < next_write {
                wake.wait_until(&mut s, next_write);
            }
            let batch: Vec<Entry> = s.queue.drain(..).collect();
            (batch, std::mem::take(&mut s.asks), s.stop)
        };
        let written = batch.is_empty() || append(&mut *store, &batch, lock);
        let mut down = None;
        if written {
            backoff = flush;
            next_write = crate::clock::machine_instant() + flush;
            totals.unread.extend(spend_rows(&batch));
            let asked = asks.iter().any(|a| matches!(a, Ask::Spend(_)));
            if !batch.is_empty() || asked || store.shared() {
                let read = totals.read(&mut *store);
                // An idle replica learns its shared store is down from this
                // read: /status and /metrics say so as for a failed write.
                let mut s = lock.lock();
                match &read {
                    Err(why) => s.health.down = Some(why.clone()),
                    Ok(()) if batch.is_empty() => s.health.down = None,
                    Ok(()) => {}
                }
                drop(s);
                if asked {
                    down = read.err();
                }
            }
        } else {
            requeue(lock, batch, queue_max);
            backoff = (backoff * 2).min(Duration::from_secs(30));
            next_write = crate::clock::machine_instant() + backoff;
            down = Some(lock.lock().health.down.clone().unwrap_or_default());
        }
        for ask in asks {
            ask.answer(&mut *store, down.as_deref());
        }
        if stop {
            let left = lock.lock().queue.len();
            if left > 0 {
                tracing::error!(entries = left, "usage ledger: entries not written at shutdown (the store is down)");
            }
            return;
        }
    }
}

/// Puts a batch the store refused back at the front of the queue, in order;
/// the newest entries beyond `queue_max` are dropped, and counted.
fn requeue(lock: &Mutex<Shared>, batch: Vec<Entry>, queue_max: usize) {
    let mut s = lock.lock();
    for e in batch.into_iter().rev() {
        s.queue.push_front(e);
    }
    let over = s.queue.len().saturating_sub(queue_max);
    s.queue.truncate(queue_max);
    s.health.dropped += over as u64;
}

/// One append; the health says how it went.
fn append(store: &mut dyn Store, batch: &[Entry], lock: &Mutex<Shared>) -> bool {
    match store.append(batch) {
        Ok(()) => {
            let mut s = lock.lock();
            s.health.written += batch.len() as u64;
            if s.health.down.take().is_some() {
                tracing::info!(store = %s.health.store, "usage ledger: the store is back; queued entries written");
            }
            true
        }
        Err(e) => {
            let why = format!("{e:#}");
            let mut s = lock.lock();
            if s.health.down.is_none() {
                tracing::error!(store = %s.health.store, error = %why, entries = batch.len(), "usage ledger: the store refused a write; entries stay queued");
            }
            s.health.down = Some(why);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that keeps entries in memory and refuses while `down`.
    struct Memory {
        kept: Arc<Mutex<Vec<Entry>>>,
        down: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Store for Memory {
        fn append(&mut self, entries: &[Entry]) -> anyhow::Result<()> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                anyhow::bail!("connection refused");
            }
            self.kept.lock().extend_from_slice(entries);
            Ok(())
        }
        fn report(&mut self, _: &Query) -> anyhow::Result<Vec<Row>> {
            Ok(vec![Row { requests: self.kept.lock().len() as u64, ..Row::default() }])
        }
        fn describe(&self) -> String {
            "memory".into()
        }
        fn keys(&mut self) -> anyhow::Result<Vec<KeyRecord>> {
            Ok(Vec::new())
        }
        fn put_key(&mut self, _: &KeyRecord) -> anyhow::Result<()> {
            Ok(())
        }
        fn spend(&mut self, _: u64) -> anyhow::Result<Vec<SpendRow>> {
            Ok(spend_rows(&self.kept.lock()))
        }
    }

    fn start(store: Memory, tuning: Tuning) -> Arc<Ledger> {
        Ledger::start(Box::new(store), tuning, Arc::default(), Clock::manual(0))
    }

    fn entry(request: u64) -> Entry {
        Entry { request, ..Entry::default() }
    }

    #[tokio::test]
    async fn a_report_counts_every_entry_pushed_before_it() {
        let (kept, down) = (Arc::default(), Arc::default());
        let tuning = Tuning { flush: Duration::from_secs(3600), queue_max: 100 };
        let ledger = start(Memory { kept, down }, tuning);
        for i in 0..7 {
            ledger.push(entry(i));
        }
        assert_eq!(ledger.report(Query::default()).await.unwrap()[0].requests, 7, "written before the report");
        assert_eq!(ledger.health().written, 7);
    }

    #[tokio::test]
    async fn a_store_that_is_down_keeps_entries_queued_and_counts_what_it_drops() {
        let (kept, down): (Arc<Mutex<Vec<Entry>>>, Arc<std::sync::atomic::AtomicBool>) =
            (Arc::default(), Arc::default());
        down.store(true, std::sync::atomic::Ordering::SeqCst);
        // A flush interval longer than the test: the writer tries the store
        // only when the report asks, and not again until the stop.
        let tuning = Tuning { flush: Duration::from_secs(3600), queue_max: 5 };
        let ledger = start(Memory { kept: kept.clone(), down: down.clone() }, tuning);
        for i in 0..8 {
            ledger.push(entry(i));
        }
        let refused = ledger.report(Query::default()).await.unwrap_err();
        assert!(format!("{refused}").contains("connection refused"), "{refused}");
        let health = ledger.health();
        assert_eq!((health.queued, health.dropped), (5, 3), "{health:?}");
        assert!(health.down.is_some());
        down.store(false, std::sync::atomic::Ordering::SeqCst);
        ledger.stop();
        let order: Vec<u64> = kept.lock().iter().map(|e| e.request).collect();
        assert_eq!(order, [0, 1, 2, 3, 4], "written in order once the store is back");
        assert_eq!(ledger.health().down, None);
    }

    #[tokio::test]
    async fn the_meters_count_each_entry_once_whether_pending_written_or_another_replicas() {
        let (kept, down): (Arc<Mutex<Vec<Entry>>>, _) = (Arc::default(), Arc::default());
        let t = 1_764_547_200_000; // 2025-12-01T00:00Z
        let meters: Arc<Meters> = Arc::default();
        let tuning = Tuning { flush: Duration::from_secs(3600), queue_max: 100 };
        let store = Memory { kept: kept.clone(), down };
        let ledger = Ledger::start(Box::new(store), tuning, meters.clone(), Clock::manual(t));
        let spent = |e: &Entry| (e.usage, e.cost_nano.unwrap_or(0), e.at_ms);
        let ours = |request, output_tokens| Entry {
            request,
            at_ms: t,
            key: "k".into(),
            usage: Usage { output_tokens, ..Usage::default() },
            cost_nano: Some(output_tokens * 10),
            ..Entry::default()
        };
        for (i, tokens) in [(1, 5), (2, 7)] {
            let e = ours(i, tokens);
            let (usage, nano, at) = spent(&e);
            meters.spend(&e.key, &usage, nano, at);
            ledger.push(e);
        }
        assert_eq!(meters.meter("k").spent(Period::Day, t).tokens(), 12, "pending before the write");
        // Another replica's entry, written to the shared store.
        kept.lock().push(Entry { replica: "other".into(), ..ours(9, 100) });
        ledger.read_totals().await.unwrap();
        let day = meters.meter("k").spent(Period::Day, t);
        assert_eq!((day.tokens(), day.requests, day.nano_usd), (112, 3, 1_120), "written once, with the other's");
        let e = ours(3, 1);
        meters.spend(&e.key, &e.usage, 10, t);
        ledger.push(e);
        assert_eq!(meters.meter("k").spent(Period::Month, t).tokens(), 113, "pending on top of the totals");
        ledger.read_totals().await.unwrap();
        assert_eq!(meters.meter("k").spent(Period::Week, t).tokens(), 113);
    }
}
