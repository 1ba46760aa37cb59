//! The embedded store: one SQLite file, in WAL mode.
//!
//! WAL with `synchronous = NORMAL`: a committed batch survives the process
//! being killed (SIGKILL included); only a power loss may take the last
//! commits.
//!
//! Written for the cost of a write: a rowid table (rows append at the
//! B-tree's right edge) with one index, on time — reports ask a range of
//! time. Budgets read `spend`, each key's totals per day, week and month,
//! added to in the transaction that appends the entries (so the two never
//! disagree); a ledger written before `spend` existed is summed into it
//! once, when it is opened.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rusqlite::{Connection, params};

use super::calendar::Period;
use super::limits::Spent;
use super::report::{Dim, Query, Row};
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

fn column(d: Dim) -> &'static str {
    match d {
        Dim::Key => "key",
        Dim::Team => "team",
        Dim::Model => "model",
        Dim::Account => "account",
        Dim::Day => "strftime('%Y-%m-%d', at_ms / 1000, 'unixepoch')",
    }
}

impl Store for Sqlite {
    fn append(&mut self, entries: &[Entry]) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO usage VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?;
            for e in entries {
                let u = &e.usage;
                insert.execute(params![
                    e.at_ms as i64,
                    e.request as i64,
                    &*e.replica,
                    e.key,
                    e.team,
                    e.api,
                    e.model,
                    e.account,
                    e.status,
                    e.outcome,
                    u.input_tokens as i64,
                    u.output_tokens as i64,
                    u.cache_read_input_tokens as i64,
                    u.cache_creation_input_tokens as i64,
                    e.usage_known,
                    e.cost_nano.map(|c| c as i64),
                ])?;
            }
        }
        add_spend(&tx, &super::spend_rows(entries))?;
        tx.commit()?;
        Ok(())
    }

    fn report(&mut self, q: &Query) -> Result<Vec<Row>> {
        let groups: Vec<String> = q.by.iter().map(|d| column(*d).to_string()).collect();
        let select = groups.iter().map(|g| format!("{g}, ")).collect::<String>();
        let group_by = match groups.is_empty() {
            true => String::new(),
            false => format!(" GROUP BY {0} ORDER BY {0}", groups.join(", ")),
        };
        let key = if q.key.is_some() { "key = ?3 AND " } else { "" };
        let sql = format!(
            "SELECT {select}COUNT(*), TOTAL(input_tokens), TOTAL(output_tokens), TOTAL(cache_read_tokens), \
             TOTAL(cache_creation_tokens), TOTAL(COALESCE(cost_nano, 0)), \
             TOTAL(cost_nano IS NULL AND usage_known), TOTAL(NOT usage_known) \
             FROM usage WHERE {key}at_ms >= ?1 AND at_ms < ?2{group_by}"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let n = q.by.len();
        let (from, to) = (q.from_ms.min(i64::MAX as u64) as i64, q.to_ms.min(i64::MAX as u64) as i64);
        let bound: Vec<&dyn rusqlite::ToSql> = match &q.key {
            Some(k) => vec![&from, &to, k],
            None => vec![&from, &to],
        };
        let rows = stmt.query_map(bound.as_slice(), |r| {
            let mut row = Row::default();
            for (i, d) in q.by.iter().enumerate() {
                row.group.insert(d.name(), r.get::<_, String>(i)?);
            }
            // TOTAL() is a float: exact for integers below 2^53.
            let int = |i: usize| r.get::<_, f64>(i).map(|v| v as u64);
            row.requests = r.get::<_, i64>(n)? as u64;
            row.input_tokens = int(n + 1)?;
            row.output_tokens = int(n + 2)?;
            row.cache_read_input_tokens = int(n + 3)?;
            row.cache_creation_input_tokens = int(n + 4)?;
            row.cost_nano_usd = int(n + 5)?;
            row.unpriced = int(n + 6)?;
            row.usage_unknown = int(n + 7)?;
            Ok(row)
        })?;
        let mut out: Vec<Row> = rows.collect::<rusqlite::Result<_>>()?;
        // No entry at all: no row (a total over nothing is not a group).
        out.retain(|r| r.requests > 0);
        Ok(out)
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
    fn spend_totals_follow_the_entries_and_an_older_ledger_is_summed_once() {
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
        // A ledger from before `spend`: summed when opened, and only once.
        store.conn.execute_batch("DELETE FROM spend").unwrap();
        drop(store);
        let mut store = Sqlite::open(&path).unwrap();
        assert_eq!(totals(&mut store), want);
        drop(store);
        assert_eq!(totals(&mut Sqlite::open(&path).unwrap()), want);
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
