//! The shared store: a PostgreSQL database, for replicas (`[ledger] url`).
//!
//! Why PostgreSQL besides SQLite: replicas on several machines cannot share
//! one SQLite file, and a budget held by each replica alone lets a key spend
//! it once per replica. Here every replica appends to one `usage` table and
//! adds to one `spend` table, so each reads the totals all of them wrote.
//!
//! The schema and the answers are SQLite's ([`super::sqlite`]): the same
//! tables, columns and report rows. What differs is for a server shared over
//! a network:
//!
//! - an append is one transaction of two statements, each one round trip
//!   whatever the batch's size: the entries as arrays (`UNNEST`), and the
//!   spend rows added in the server (`ON CONFLICT … DO UPDATE SET x =
//!   spend.x + excluded.x`). Two replicas adding to one row are serialised by
//!   its row lock, and nothing is read and written back from here, so no
//!   addition is lost; rows come sorted ([`super::spend_rows`]), so two
//!   appends lock them in one order and never deadlock;
//! - the client is the synchronous rust-postgres one: the store runs on the
//!   ledger's writer thread, which has no async runtime to share;
//! - a connection that fails is dropped and made again at the next call (the
//!   writer retries with a doubling pause), so a server that comes back is
//!   used again, with what was queued meanwhile;
//! - the URL's password is never shown: [`Postgres::describe`] is
//!   `postgres://user@host:port/db`.

use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result};
use postgres::{Client, NoTls};

use super::calendar::Period;
use super::limits::Spent;
use super::report::{Dim, Query, Row};
use super::{Entry, KeyRecord, SpendRow, Store};

/// The tables, created when missing (by the first replica to connect; the
/// others wait on [`SCHEMA_LOCK`]).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage (
    at_ms BIGINT NOT NULL,
    request BIGINT NOT NULL,
    replica TEXT NOT NULL,
    key TEXT NOT NULL,
    team TEXT NOT NULL,
    api TEXT NOT NULL,
    model TEXT NOT NULL,
    account TEXT NOT NULL,
    status BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cache_read_tokens BIGINT NOT NULL,
    cache_creation_tokens BIGINT NOT NULL,
    usage_known BOOLEAN NOT NULL,
    cost_nano BIGINT
);
CREATE INDEX IF NOT EXISTS usage_by_time ON usage (at_ms);
CREATE TABLE IF NOT EXISTS spend (
    key TEXT NOT NULL,
    period TEXT NOT NULL,
    from_ms BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cache_read_tokens BIGINT NOT NULL,
    cache_creation_tokens BIGINT NOT NULL,
    cost_nano BIGINT NOT NULL,
    PRIMARY KEY (key, period, from_ms)
);
CREATE INDEX IF NOT EXISTS spend_by_start ON spend (from_ms);
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    record TEXT NOT NULL
);
";

/// An advisory lock held while the schema is created: two replicas starting
/// at once would otherwise race in `CREATE TABLE IF NOT EXISTS` (which is
/// not atomic in PostgreSQL) and one would fail.
const SCHEMA_LOCK: i64 = 0x706f_6f6c_6761_7465; // "poolgate"

const INSERT_USAGE: &str = "INSERT INTO usage (at_ms, request, replica, key, team, api, model, account, status, \
     outcome, input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, usage_known, cost_nano) \
     SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
     $8::text[], $9::bigint[], $10::text[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], \
     $15::boolean[], $16::bigint[])";

const ADD_SPEND: &str = "INSERT INTO spend (key, period, from_ms, requests, input_tokens, output_tokens, \
     cache_read_tokens, cache_creation_tokens, cost_nano) \
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], \
     $7::bigint[], $8::bigint[], $9::bigint[]) \
     ON CONFLICT (key, period, from_ms) DO UPDATE SET requests = spend.requests + excluded.requests, \
     input_tokens = spend.input_tokens + excluded.input_tokens, \
     output_tokens = spend.output_tokens + excluded.output_tokens, \
     cache_read_tokens = spend.cache_read_tokens + excluded.cache_read_tokens, \
     cache_creation_tokens = spend.cache_creation_tokens + excluded.cache_creation_tokens, \
     cost_nano = spend.cost_nano + excluded.cost_nano";

/// Longest a connection attempt waits when the URL does not say
/// (`connect_timeout`): a server that is down costs the writer this, per try.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The PostgreSQL store.
pub struct Postgres {
    config: postgres::Config,
    client: Option<Client>,
    described: String,
}

/// Whether `url` is one this store takes: `postgres://` or `postgresql://`,
/// as [`postgres::Config`] parses it; the reason when not (never repeating
/// the password).
pub fn check_url(url: &str) -> Result<postgres::Config, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err("is not a PostgreSQL URL (postgres://user:password@host:port/database)".into());
    }
    // The URL is not repeated: it may hold a password.
    postgres::Config::from_str(url).map_err(|e| format!("does not parse as a PostgreSQL URL: {e}"))
}

/// `postgres://user@host:port/db`: the store named without its password.
pub fn describe(config: &postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db}")
}

impl Postgres {
    /// Connects to `url` and creates the tables when missing: an error (the
    /// store named, without its password) when the server cannot be reached.
    ///
    /// Connects on a thread of its own: the synchronous client runs a
    /// runtime of its own, which must not start on an async runtime's thread
    /// (the gateway's start).
    pub fn open(url: &str) -> Result<Postgres> {
        let mut config = check_url(url).map_err(anyhow::Error::msg)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let described = describe(&config);
        let connected = std::thread::scope(|s| s.spawn(|| connect(&config)).join());
        let client = connected.map_err(|_| anyhow::anyhow!("connecting to {described} panicked"))??;
        Ok(Postgres { config, client: Some(client), described })
    }

    /// Runs `f` on the connection, connecting first when there is none; a
    /// connection that failed (not a statement the server refused) is
    /// dropped, to be made again next time.
    fn with<T>(&mut self, what: &str, f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>) -> Result<T> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
        }
        if self.client.is_none() {
            self.client = Some(connect(&self.config)?);
        }
        let client = self.client.as_mut().expect("connected above");
        match f(client) {
            Ok(v) => Ok(v),
            Err(e) => {
                if e.as_db_error().is_none() || client.is_closed() {
                    self.client = None;
                }
                Err(anyhow::Error::new(e).context(format!("{what} ({})", self.described)))
            }
        }
    }
}

/// A connection to `config`'s server, with the tables in place.
fn connect(config: &postgres::Config) -> Result<Client> {
    let described = describe(config);
    let mut client = config.connect(NoTls).with_context(|| format!("cannot connect to {described}"))?;
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
    tx.batch_execute(SCHEMA).with_context(|| format!("cannot set up the ledger in {described}"))?;
    tx.commit()?;
    Ok(client)
}

/// `n` as PostgreSQL's BIGINT (values past it saturate).
fn big(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

/// The entries as one array per column, in `INSERT_USAGE`'s order.
struct Columns {
    ints: [Vec<i64>; 7],
    texts: [Vec<String>; 7],
    known: Vec<bool>,
    cost: Vec<Option<i64>>,
}

impl Columns {
    fn of(entries: &[Entry]) -> Columns {
        let mut c =
            Columns { ints: Default::default(), texts: Default::default(), known: Vec::new(), cost: Vec::new() };
        for e in entries {
            let u = &e.usage;
            let ints = [
                e.at_ms,
                e.request,
                e.status.into(),
                u.input_tokens,
                u.output_tokens,
                u.cache_read_input_tokens,
                u.cache_creation_input_tokens,
            ];
            for (col, v) in c.ints.iter_mut().zip(ints) {
                col.push(big(v));
            }
            let texts = [&*e.replica, &e.key, &e.team, e.api, &e.model, &e.account, e.outcome];
            for (col, v) in c.texts.iter_mut().zip(texts) {
                col.push(v.to_string());
            }
            c.known.push(e.usage_known);
            c.cost.push(e.cost_nano.map(big));
        }
        c
    }
}

/// The spend rows as one array per column, in `ADD_SPEND`'s order.
fn spend_columns(rows: &[SpendRow]) -> ([Vec<String>; 2], [Vec<i64>; 7]) {
    let mut texts: [Vec<String>; 2] = Default::default();
    let mut ints: [Vec<i64>; 7] = Default::default();
    for r in rows {
        let (s, u) = (&r.spent, &r.spent.usage);
        texts[0].push(r.key.clone());
        texts[1].push(r.period.name().to_string());
        let values = [
            r.from_ms,
            s.requests,
            u.input_tokens,
            u.output_tokens,
            u.cache_read_input_tokens,
            u.cache_creation_input_tokens,
            s.nano_usd,
        ];
        for (col, v) in ints.iter_mut().zip(values) {
            col.push(big(v));
        }
    }
    (texts, ints)
}

fn column(d: Dim) -> &'static str {
    match d {
        Dim::Key => "key",
        Dim::Team => "team",
        Dim::Model => "model",
        Dim::Account => "account",
        Dim::Day => "to_char(to_timestamp(at_ms / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    }
}

/// The report's SQL: the groups, then the totals SQLite's report has, in
/// its order; `$1`..`$2` the range, `$3` the key when one is asked.
fn report_sql(q: &Query) -> String {
    let groups: Vec<&str> = q.by.iter().map(|d| column(*d)).collect();
    let select = groups.iter().map(|g| format!("{g}, ")).collect::<String>();
    let group_by = if groups.is_empty() { String::new() } else { format!(" GROUP BY {}", groups.join(", ")) };
    let key = if q.key.is_some() { "key = $3 AND " } else { "" };
    let sum = |c: &str| format!("COALESCE(SUM({c}), 0)::bigint");
    format!(
        "SELECT {select}COUNT(*), {}, {}, {}, {}, {}, \
         COUNT(*) FILTER (WHERE cost_nano IS NULL AND usage_known), COUNT(*) FILTER (WHERE NOT usage_known) \
         FROM usage WHERE {key}at_ms >= $1 AND at_ms < $2{group_by}",
        sum("input_tokens"),
        sum("output_tokens"),
        sum("cache_read_tokens"),
        sum("cache_creation_tokens"),
        sum("cost_nano"),
    )
}

impl Store for Postgres {
    fn append(&mut self, entries: &[Entry]) -> Result<()> {
        let c = Columns::of(entries);
        let (spend_texts, spend_ints) = spend_columns(&super::spend_rows(entries));
        self.with("cannot append to the ledger", |client| {
            let mut tx = client.transaction()?;
            let [at, request, status, input, output, cache_read, cache_creation] = &c.ints;
            let [replica, key, team, api, model, account, outcome] = &c.texts;
            tx.execute(
                INSERT_USAGE,
                &[
                    at,
                    request,
                    replica,
                    key,
                    team,
                    api,
                    model,
                    account,
                    status,
                    outcome,
                    input,
                    output,
                    cache_read,
                    cache_creation,
                    &c.known,
                    &c.cost,
                ],
            )?;
            let [k, p] = &spend_texts;
            let [from, requests, input, output, cache_read, cache_creation, nano] = &spend_ints;
            tx.execute(ADD_SPEND, &[k, p, from, requests, input, output, cache_read, cache_creation, nano])?;
            tx.commit()
        })
    }

    fn report(&mut self, q: &Query) -> Result<Vec<Row>> {
        let sql = report_sql(q);
        let (from, to) = (big(q.from_ms), big(q.to_ms));
        let rows = self.with("cannot read the ledger", |client| match &q.key {
            Some(k) => client.query(&sql, &[&from, &to, k]),
            None => client.query(&sql, &[&from, &to]),
        })?;
        let n = q.by.len();
        let mut out = Vec::new();
        for r in rows {
            let mut row = Row::default();
            for (i, d) in q.by.iter().enumerate() {
                row.group.insert(d.name(), r.try_get::<_, String>(i)?);
            }
            let int = |i: usize| r.try_get::<_, i64>(i).map(|v| v.max(0) as u64);
            row.requests = int(n)?;
            row.input_tokens = int(n + 1)?;
            row.output_tokens = int(n + 2)?;
            row.cache_read_input_tokens = int(n + 3)?;
            row.cache_creation_input_tokens = int(n + 4)?;
            row.cost_nano_usd = int(n + 5)?;
            row.unpriced = int(n + 6)?;
            row.usage_unknown = int(n + 7)?;
            out.push(row);
        }
        // No entry at all: no row (a total over nothing is not a group).
        out.retain(|r| r.requests > 0);
        // Byte order, as SQLite sorts (not the database's collation).
        let order = |r: &Row| q.by.iter().map(|d| r.group[d.name()].clone()).collect::<Vec<_>>();
        out.sort_by_key(order);
        Ok(out)
    }

    fn describe(&self) -> String {
        self.described.clone()
    }

    fn spend(&mut self, since_ms: u64) -> Result<Vec<SpendRow>> {
        let rows = self.with("cannot read the spend totals", |client| {
            client.query(
                "SELECT key, period, from_ms, requests, input_tokens, output_tokens, cache_read_tokens, \
                 cache_creation_tokens, cost_nano FROM spend WHERE from_ms >= $1",
                &[&big(since_ms)],
            )
        })?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let int = |i: usize| r.try_get::<_, i64>(i).map(|v| v.max(0) as u64);
            let (key, period): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let from_ms = int(2)?;
            let usage = poolgate_wire::usage::Usage {
                input_tokens: int(4)?,
                output_tokens: int(5)?,
                cache_read_input_tokens: int(6)?,
                cache_creation_input_tokens: int(7)?,
            };
            let period =
                Period::named(&period).with_context(|| format!("a spend row of `{key}` names period `{period}`"))?;
            let spent = Spent { from_ms, requests: int(3)?, usage, nano_usd: int(8)? };
            out.push(SpendRow { key, period, from_ms, spent });
        }
        Ok(out)
    }

    fn keys(&mut self) -> Result<Vec<KeyRecord>> {
        let rows = self.with("cannot read the keys", |client| client.query("SELECT name, record FROM keys", &[]))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let (name, record): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let key: KeyRecord =
                serde_json::from_str(&record).with_context(|| format!("key `{name}` in the store is unreadable"))?;
            out.push(key);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn put_key(&mut self, key: &KeyRecord) -> Result<()> {
        let record = serde_json::to_string(key)?;
        self.with(&format!("cannot store key `{}`", key.name), |client| {
            client.execute(
                "INSERT INTO keys (name, sha256, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, record = excluded.record",
                &[&key.name, &key.sha256, &record],
            )
        })?;
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use poolgate_wire::usage::Usage;

    use super::*;

    #[test]
    fn the_store_is_named_without_its_password_and_only_postgres_urls_are_taken() {
        let c = check_url("postgres://ledger:hunter2@db.internal:6543/usage").unwrap();
        assert_eq!(describe(&c), "postgres://ledger@db.internal:6543/usage");
        let c = check_url("postgresql://poolgate@127.0.0.1/").unwrap();
        assert_eq!(describe(&c), "postgres://poolgate@127.0.0.1:5432/poolgate", "the database defaults to the user");
        for bad in ["mysql://u:hunter2@h/db", "host=h user=u password=hunter2", "postgres://u:hunter2@h:notaport/db"] {
            let why = check_url(bad).unwrap_err();
            assert!(!why.contains("hunter2"), "{why}");
        }
    }

    #[test]
    fn entries_become_one_array_per_column_with_no_cost_for_an_unpriced_model() {
        let e = |request, cost_nano| Entry {
            at_ms: 1_000,
            request,
            replica: "r1".into(),
            key: "k".into(),
            api: "messages",
            status: 200,
            outcome: "complete",
            usage: Usage { input_tokens: 3, output_tokens: 4, ..Usage::default() },
            usage_known: true,
            cost_nano,
            ..Entry::default()
        };
        let c = Columns::of(&[e(1, Some(70)), e(2, None)]);
        assert_eq!(c.ints[1], [1, 2]);
        assert_eq!(c.ints[2], [200, 200]);
        assert_eq!((c.ints[3].as_slice(), c.ints[4].as_slice()), ([3, 3].as_slice(), [4, 4].as_slice()));
        assert_eq!(c.texts[0], ["r1", "r1"]);
        assert_eq!(c.cost, [Some(70), None], "NULL, as SQLite keeps it, not 0");
        assert!(c.ints.iter().all(|col| col.len() == 2) && c.texts.iter().all(|col| col.len() == 2));
        let (texts, ints) = spend_columns(&super::super::spend_rows(&[e(1, Some(70)), e(2, None)]));
        assert_eq!(texts[1], ["day", "week", "month"], "one row a period, summed");
        assert_eq!(ints[1], [2, 2, 2]);
        assert_eq!(ints[6], [70, 70, 70], "an unpriced entry adds no cost");
    }

    #[test]
    fn a_report_groups_by_what_is_asked_and_filters_the_key_by_parameter() {
        let q = Query { from_ms: 0, to_ms: 1, key: Some("o'brien".into()), by: vec![Dim::Key, Dim::Day] };
        let sql = report_sql(&q);
        assert!(sql.contains("WHERE key = $3 AND at_ms >= $1 AND at_ms < $2 GROUP BY key, to_char("), "{sql}");
        assert!(!sql.contains("o'brien"), "the key is a parameter: {sql}");
        let sql = report_sql(&Query::default());
        assert!(!sql.contains("GROUP BY") && !sql.contains("$3"), "{sql}");
    }
}
