//! The embedded store: one SQLite file, in WAL mode.
//!
//! WAL with `synchronous = NORMAL`: a committed batch survives the process
//! being killed (SIGKILL included); only a power loss may take the last
//! commits.
//!
//! Written for the cost of a write: each batch the writer hands over is one
//! row of `usage_log`, its entries encoded as a [`segment`]
//! (a row per entry cost some 11,000 instructions a request; see
//! docs/benchmarks.md), with the batch's first and last arrival times, so a
//! report reads the batches that overlap its range and sums them in Rust.
//! Budgets read `spend`, each key's totals per day, week and month, added to
//! in the transaction that appends the batch (so the two never disagree).
//! A ledger from an earlier version kept a row per entry in `usage`: it is
//! read as it is, and summed into `spend` once, when it is opened.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rusqlite::{Connection, params};

use super::calendar::Period;
use super::limits::Spent;
use super::report::{self, Query, Row};
use super::segment::{self, Filed};
use super::{Entry, KeyRecord, SpendRow, Store};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage (
    at_ms INTEGER NOT NULL,
    request INTEGER NOT NULL,
    replica TEXT NOT NULL,
    key TEXT NOT NULL,
    team TEXT NOT NULL,
    api TEXT NOT NULL,
    model TEXT NOT NULL,
    account TEXT NOT NULL,
    status INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    cache_creation_tokens INTEGER NOT NULL,
    usage_known INTEGER NOT NULL,
    cost_nano INTEGER
);
CREATE INDEX IF NOT EXISTS usage_by_time ON usage (at_ms);
CREATE TABLE IF NOT EXISTS usage_log (
    first_at_ms INTEGER NOT NULL,
    last_at_ms INTEGER NOT NULL,
    entries INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_log_by_time ON usage_log (last_at_ms);
CREATE TABLE IF NOT EXISTS spend (
    key TEXT NOT NULL,
    period TEXT NOT NULL,
    from_ms INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    cache_creation_tokens INTEGER NOT NULL,
    cost_nano INTEGER NOT NULL,
    PRIMARY KEY (key, period, from_ms)
);
CREATE INDEX IF NOT EXISTS spend_by_start ON spend (from_ms);
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    record TEXT NOT NULL
);
";

/// The SQLite store.
pub struct Sqlite {
    conn: Connection,
    path: PathBuf,
}

impl Sqlite {
    /// Opens (or creates) the database at `path`, with its directory.
    pub fn open(path: &Path) -> Result<Sqlite> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let conn = Connection::open(path).with_context(|| format!("cannot open the ledger {}", path.display()))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA).with_context(|| format!("cannot set up the ledger {}", path.display()))?;
        let mut store = Sqlite { conn, path: path.to_path_buf() };
        store.sum_older_entries().with_context(|| format!("cannot sum the ledger {}", path.display()))?;
        Ok(store)
    }

    /// Fills `spend` from `usage` when only the entries are there (a ledger
    /// from before `spend`).
    fn sum_older_entries(&mut self) -> Result<()> {
        let count = |table: &str| -> Result<i64> {
            Ok(self
                .conn
                .query_row(&format!("SELECT COUNT(*) FROM (SELECT 1 FROM {table} LIMIT 1)"), [], |r| r.get(0))?)
        };
        if count("spend")? > 0 || count("usage")? == 0 {
            return Ok(());
        }
        let mut stmt = self.conn.prepare(
            "SELECT at_ms, key, input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, cost_nano FROM usage",
        )?;
        let entries = stmt
            .query_map([], |r| {
                Ok(Entry {
                    at_ms: r.get::<_, i64>(0)? as u64,
                    key: r.get(1)?,
                    usage: poolgate_wire::usage::Usage {
                        input_tokens: r.get::<_, i64>(2)? as u64,
                        output_tokens: r.get::<_, i64>(3)? as u64,
                        cache_read_input_tokens: r.get::<_, i64>(4)? as u64,
                        cache_creation_input_tokens: r.get::<_, i64>(5)? as u64,
                    },
                    cost_nano: r.get::<_, Option<i64>>(6)?.map(|c| c as u64),
                    ..Entry::default()
                })
            })?
            .collect::<rusqlite::Result<Vec<Entry>>>()?;
        drop(stmt);
        let tx = self.conn.transaction()?;
        add_spend(&tx, &super::spend_rows(&entries))?;
        tx.commit()?;
        Ok(())
    }
}

impl Sqlite {
    /// The entries an earlier version kept a row each for, arrived in
    /// `[from, to)`.
    fn older_entries(&self, from: i64, to: i64) -> Result<Vec<Filed>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT at_ms, key, team, model, account, input_tokens, output_tokens, cache_read_tokens, \
             cache_creation_tokens, usage_known, cost_nano FROM usage WHERE at_ms >= ?1 AND at_ms < ?2",
        )?;
        let rows = stmt.query_map(params![from, to], |r| {
            let int = |i: usize| r.get::<_, i64>(i).map(|v| v as u64);
            Ok(Filed {
                at_ms: int(0)?,
                key: r.get(1)?,
                team: r.get(2)?,
                model: r.get(3)?,
                account: r.get(4)?,
                usage: poolgate_wire::usage::Usage {
                    input_tokens: int(5)?,
                    output_tokens: int(6)?,
                    cache_read_input_tokens: int(7)?,
                    cache_creation_input_tokens: int(8)?,
                },
                usage_known: r.get(9)?,
                cost_nano: r.get::<_, Option<i64>>(10)?.map(|c| c as u64),
                ..Filed::default()
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// Adds `rows` to the totals in `spend`.
fn add_spend(tx: &rusqlite::Transaction<'_>, rows: &[SpendRow]) -> Result<()> {
    let mut upsert = tx.prepare_cached(
        "INSERT INTO spend VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (key, period, from_ms) DO UPDATE SET requests = requests + excluded.requests, \
         input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens, \
         cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens, \
         cache_creation_tokens = cache_creation_tokens + excluded.cache_creation_tokens, \
         cost_nano = cost_nano + excluded.cost_nano",
    )?;
    for row in rows {
        let (s, u) = (&row.spent, &row.spent.usage);
        upsert.execute(params![
            row.key,
            row.period.name(),
            row.from_ms as i64,
            s.requests as i64,
            u.input_tokens as i64,
            u.output_tokens as i64,
            u.cache_read_input_tokens as i64,
            u.cache_creation_input_tokens as i64,
            s.nano_usd as i64,
        ])?;
    }
    Ok(())
}

impl Store for Sqlite {
    fn append(&mut self, entries: &[Entry]) -> Result<()> {
        let (Some(first), Some(last)) = (entries.iter().map(|e| e.at_ms).min(), entries.iter().map(|e| e.at_ms).max())
        else {
            return Ok(());
        };
        let tx = self.conn.transaction()?;
        tx.prepare_cached("INSERT INTO usage_log VALUES (?1, ?2, ?3, ?4)")?.execute(params![
            first as i64,
            last as i64,
            entries.len() as i64,
            segment::encode(entries),
        ])?;
        add_spend(&tx, &super::spend_rows(entries))?;
        tx.commit()?;
        Ok(())
    }

    fn report(&mut self, q: &Query) -> Result<Vec<Row>> {
        let (from, to) = (q.from_ms.min(i64::MAX as u64) as i64, q.to_ms.min(i64::MAX as u64) as i64);
        let mut entries = self.older_entries(from, to)?;
        let mut stmt =
            self.conn.prepare_cached("SELECT body FROM usage_log WHERE last_at_ms >= ?1 AND first_at_ms < ?2")?;
        let mut rows = stmt.query(params![from, to])?;
        while let Some(row) = rows.next()? {
            let body = row.get_ref(0)?.as_blob()?;
            entries.extend(segment::decode(body).context("a batch in the ledger is unreadable")?);
        }
        Ok(report::summarize(entries, q))
    }

    fn describe(&self) -> String {
        format!("sqlite {}", self.path.display())
    }

    fn spend(&mut self, since_ms: u64) -> Result<Vec<SpendRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT key, period, from_ms, requests, input_tokens, output_tokens, cache_read_tokens, \
             cache_creation_tokens, cost_nano FROM spend WHERE from_ms >= ?1",
        )?;
        let rows = stmt.query_map([since_ms.min(i64::MAX as u64) as i64], |r| {
            let int = |i: usize| r.get::<_, i64>(i).map(|v| v as u64);
            let from_ms = int(2)?;
            let usage = poolgate_wire::usage::Usage {
                input_tokens: int(4)?,
                output_tokens: int(5)?,
                cache_read_input_tokens: int(6)?,
                cache_creation_input_tokens: int(7)?,
            };
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                Spent { from_ms, requests: int(3)?, usage, nano_usd: int(8)? },
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (key, period, spent) = row?;
            let period =
                Period::named(&period).with_context(|| format!("a spend row of `{key}` names period `{period}`"))?;
            out.push(SpendRow { key, period, from_ms: spent.from_ms, spent });
        }
        Ok(out)
    }

    fn keys(&mut self) -> Result<Vec<KeyRecord>> {
        let mut stmt = self.conn.prepare_cached("SELECT name, record FROM keys ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, record) = row?;
            out.push(
                serde_json::from_str(&record).with_context(|| format!("key `{name}` in the store is unreadable"))?,
            );
        }
        Ok(out)
    }

    fn put_key(&mut self, key: &KeyRecord) -> Result<()> {
        let record = serde_json::to_string(key)?;
        self.conn
            .prepare_cached(
                "INSERT INTO keys (name, sha256, record) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, record = excluded.record",
            )?
            .execute(params![key.name, key.sha256, record])
            .with_context(|| format!("cannot store key `{}`", key.name))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use poolgate_wire::usage::Usage;

    use super::*;
    use crate::ledger::report::Dim;

    fn entry(request: u64, key: &str, model: &str, output: u64) -> Entry {
        Entry {
            at_ms: 1_764_547_200_000 + request * 3_600_000, // 2025-12-01T00:00Z, an hour apart
            request,
            replica: "r".into(),
            key: key.into(),
            team: "core".into(),
            api: "messages",
            model: model.into(),
            account: "a1".into(),
            status: 200,
            outcome: "complete",
            usage: Usage { input_tokens: 10, output_tokens: output, ..Usage::default() },
            usage_known: true,
            cost_nano: (model != "unpriced").then_some(output * 1_000),
        }
    }

    #[test]
    fn entries_are_kept_across_an_open_and_summed_by_group() {
        let dir = tempdir("entries");
        let path = dir.join("ledger.sqlite");
        let mut store = Sqlite::open(&path).unwrap();
        let batch: Vec<Entry> = (0..30).map(|i| entry(i, ["alice", "bob"][i as usize % 2], "m", i)).collect();
        store.append(&batch).unwrap();
        store.append(&[entry(100, "alice", "unpriced", 7)]).unwrap();
        drop(store);
        let mut store = Sqlite::open(&path).unwrap();
        let all = Query { from_ms: 0, to_ms: u64::MAX, key: None, by: vec![Dim::Key] };
        let rows = store.report(&all).unwrap();
        assert_eq!(rows.len(), 2);
        let (alice, bob) = (&rows[0], &rows[1]);
        assert_eq!((alice.group["key"].as_str(), alice.requests, alice.unpriced), ("alice", 16, 1));
        assert_eq!(alice.output_tokens, (0..30).step_by(2).sum::<u64>() + 7);
        assert_eq!(bob.output_tokens, (1..30).step_by(2).sum::<u64>());
        assert_eq!(bob.cost_nano_usd, bob.output_tokens * 1_000);
        let day = Query { from_ms: 0, to_ms: u64::MAX, key: Some("bob".into()), by: vec![Dim::Day] };
        let days: Vec<String> = store.report(&day).unwrap().iter().map(|r| r.group["day"].clone()).collect();
        assert_eq!(days, ["2025-12-01", "2025-12-02"]);
        let none = Query { from_ms: 0, to_ms: 1, key: None, by: vec![] };
        assert!(store.report(&none).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn spend_totals_follow_the_entries_by_period() {
        let dir = tempdir("spend");
        let path = dir.join("ledger.sqlite");
        let mut store = Sqlite::open(&path).unwrap();
        store.append(&(0..30).map(|i| entry(i, "alice", "m", 1)).collect::<Vec<_>>()).unwrap();
        let totals = |store: &mut Sqlite| {
            let mut rows: Vec<(Period, u64, u64, u64)> = (store.spend(0).unwrap().into_iter())
                .map(|r| (r.period, r.from_ms, r.spent.requests, r.spent.tokens()))
                .collect();
            rows.sort_by_key(|r| (r.0.name(), r.1));
            rows
        };
        let day = 24 * 3_600_000;
        let want = vec![
            (Period::Day, 1_764_547_200_000, 24, 24 * 11),
            (Period::Day, 1_764_547_200_000 + day, 6, 6 * 11),
            (Period::Month, 1_764_547_200_000, 30, 30 * 11),
            (Period::Week, 1_764_547_200_000, 30, 30 * 11), // 2025-12-01 was a Monday
        ];
        assert_eq!(totals(&mut store), want);
        assert!(store.spend(1_764_547_200_000 + 1).unwrap().iter().all(|r| r.from_ms > 1_764_547_200_000));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ledger_of_a_row_per_entry_is_reported_and_summed_once_beside_new_batches() {
        let dir = tempdir("older");
        let path = dir.join("ledger.sqlite");
        {
            // The earlier version's only table: a row per entry.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&SCHEMA[..SCHEMA.find("CREATE INDEX").unwrap()]).unwrap();
            for (i, key) in ["alice", "bob", "alice"].iter().enumerate() {
                conn.execute(
                    "INSERT INTO usage VALUES (?1, ?2, 'r', ?3, 'core', 'messages', 'm', 'a1', 200, 'complete', \
                     10, 5, 0, 0, 1, 1000)",
                    params![1_764_547_200_000i64 + i as i64, i as i64, key],
                )
                .unwrap();
            }
        }
        let mut store = Sqlite::open(&path).unwrap();
        store.append(&[entry(1, "alice", "m", 1)]).unwrap();
        let month: Vec<(String, u64, u64)> = (store.spend(0).unwrap().into_iter())
            .filter(|r| r.period == Period::Month)
            .map(|r| (r.key, r.spent.requests, r.spent.tokens()))
            .collect();
        assert_eq!(month, [("alice".to_string(), 3, 15 + 15 + 11), ("bob".to_string(), 1, 15)]);
        let all = Query { from_ms: 0, to_ms: u64::MAX, key: Some("alice".into()), by: vec![Dim::Model] };
        let rows = store.report(&all).unwrap();
        assert_eq!((rows.len(), rows[0].requests, rows[0].tokens()), (1, 3, 41), "{rows:?}");
        drop(store);
        let mut store = Sqlite::open(&path).unwrap();
        let again: u64 =
            store.spend(0).unwrap().iter().filter(|r| r.period == Period::Month).map(|r| r.spent.requests).sum();
        assert_eq!(again, 4, "summed once");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_are_kept_by_name_and_replaced_whole() {
        let dir = tempdir("keys");
        let mut store = Sqlite::open(&dir.join("keys.sqlite")).unwrap();
        let mut key = KeyRecord {
            name: "ci".into(),
            sha256: "aa".into(),
            team: Some("build".into()),
            owner: None,
            expires_ms: None,
            revoked_ms: None,
            created_ms: 1,
            limits: crate::ledger::keys::KeyLimits { budget_usd_day: Some(5.0), ..Default::default() },
        };
        store.put_key(&key).unwrap();
        key.revoked_ms = Some(2);
        store.put_key(&key).unwrap();
        let mut other = key.clone();
        other.name = "bot".into();
        assert!(store.put_key(&other).is_err(), "a second key with the same hash");
        assert_eq!(store.keys().unwrap(), [key]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("poolgate-ledger-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
