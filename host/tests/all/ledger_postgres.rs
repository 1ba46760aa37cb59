//! The usage ledger on a real PostgreSQL server (`[ledger] url`): the store
//! itself (entries, totals added to by two writers at once, keys), then the
//! real binary on it — usage to the token across a restart, a server that
//! goes down and comes back without a request waiting or an entry lost, a
//! server that cannot be reached refusing the start — and two replicas on one
//! PostgreSQL and one Redis holding one key to one budget.

use std::process::Command;
use std::time::Duration;

use poolgate::ledger::calendar::Period;
use poolgate::ledger::postgres::Postgres;
use poolgate::ledger::report::{Dim, Query};
use poolgate::ledger::{Entry, Store as _};
use poolgate_mock_upstream::MockUpstream;
use poolgate_wire::usage::Usage;
use serde_json::Value;

use crate::bounded::OutputWithin as _;
use crate::support::postgres::PostgresServer;
use crate::support::{self, Gateway, config, messages, spent_tokens, sum_usage, usage_of};

mod replicas;

const ADMIN: &str = "pg-ledger-admin";
const MODEL: &str = "claude-sonnet-4-5";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("ALICE", "alice-key"), ("CAROL", "carol-key"), ("DAVE", "dave-key"), ("PG_ADMIN", ADMIN)]
}

/// Client keys alice (no limit), carol and dave (daily token budgets), and
/// `[ledger]` on `pg`, written every `flush_ms`.
fn ledger_keys(pg: &PostgresServer, flush_ms: u64, carol_budget: u64, dave_budget: u64) -> String {
    format!(
        "[[server.client_keys]]\nname = \"alice\"\nkey_env = \"ALICE\"\nteam = \"core\"\n\n\
         [[server.client_keys]]\nname = \"carol\"\nkey_env = \"CAROL\"\nbudget_tokens_day = {carol_budget}\n\n\
         [[server.client_keys]]\nname = \"dave\"\nkey_env = \"DAVE\"\nbudget_tokens_day = {dave_budget}\n\n\
         [ledger]\nurl = \"{}\"\nflush_ms = {flush_ms}\n",
        pg.url()
    )
}

fn gateway_on(mock: &MockUpstream, pg: &PostgresServer, carol_budget: u64) -> Gateway {
    let extra = ledger_keys(pg, 100, carol_budget, 1_000_000);
    Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &extra), &env())
}

/// `/admin/usage?by=key` on `gw`: each key's row.
async fn by_key(gw: &Gateway) -> Vec<Value> {
    support::admin_json(&gw.url, "/admin/usage?by=key", ADMIN).await["rows"].as_array().cloned().unwrap_or_default()
}

fn row<'a>(rows: &'a [Value], key: &str) -> &'a Value {
    rows.iter().find(|r| r["key"] == key).unwrap_or_else(|| panic!("no row for {key} in {rows:?}"))
}

/// Sends `n` requests as alice, JSON and streamed in turn, each answered 200.
async fn send_alice(gw: &Gateway, n: usize) {
    for i in 0..n {
        let started = poolgate::clock::machine_instant();
        let r = messages(gw, "alice-key", MODEL, i % 2 == 1).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "answered without waiting on the ledger");
    }
}

async fn status(gw: &Gateway) -> Value {
    support::admin_json(&gw.url, "/status", ADMIN).await
}

/// The ledger's gauge `name` in `/metrics` (`poolgate_ledger_up`, …).
async fn gauge(gw: &Gateway, name: &str) -> f64 {
    let text = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.split(['{', ' ']).next() == Some(name));
    let value = line.and_then(|l| l.rsplit(' ').next()?.parse().ok());
    value.unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn entry(request: u64, replica: &str, output: u64, cost_nano: Option<u64>) -> Entry {
    Entry {
        at_ms: 1_764_547_200_000 + request * 60_000, // 2025-12-01T00:00Z, a minute apart
        request,
        replica: replica.into(),
        key: "k".into(),
        team: "t".into(),
        api: "messages",
        model: "m".into(),
        account: "a1".into(),
        status: 200,
        outcome: "complete",
        usage: Usage { input_tokens: 10, output_tokens: output, ..Usage::default() },
        usage_known: true,
        cost_nano,
    }
}

/// Two stores (two replicas' writers) adding to the same totals at once lose
/// no addition; reports group and count as SQLite's do (an unpriced entry's
/// cost is none, not zero); keys are kept by name.
#[test]
fn two_writers_adding_to_one_total_at_once_lose_nothing_and_reports_match_sqlites() {
    let pg = PostgresServer::start();
    let writers: Vec<_> = ["r1", "r2"]
        .into_iter()
        .map(|replica| {
            let url = pg.url();
            std::thread::spawn(move || {
                let mut store = Postgres::open(&url).unwrap();
                for i in 0..40 {
                    let batch: Vec<Entry> = (0..5).map(|j| entry(i * 5 + j, replica, 1 + j, Some(1_000))).collect();
                    store.append(&batch).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let mut store = Postgres::open(&pg.url()).unwrap();
    assert_eq!(store.describe(), format!("postgres://poolgate@127.0.0.1:{}/postgres", pg.port));
    store.append(&[entry(1_000, "r1", 7, None)]).unwrap();
    let per_writer: u64 = (0..40u64).map(|_| (1..=5u64).map(|o| 10 + o).sum::<u64>()).sum();
    let month = store.spend(0).unwrap().into_iter().find(|r| r.period == Period::Month).unwrap();
    assert_eq!((month.spent.requests, month.spent.tokens()), (401, 2 * per_writer + 17), "every addition kept");
    assert_eq!(month.spent.nano_usd, 400 * 1_000, "an unpriced entry adds no cost");

    let all = Query { from_ms: 0, to_ms: u64::MAX, key: None, by: vec![Dim::Key, Dim::Day] };
    let rows = store.report(&all).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].group["day"].as_str(), rows[0].requests, rows[0].unpriced), ("2025-12-01", 401, 1));
    assert_eq!(rows[0].output_tokens + rows[0].input_tokens, month.spent.tokens());
    let none = Query { from_ms: 0, to_ms: 1, key: None, by: vec![] };
    assert!(store.report(&none).unwrap().is_empty(), "no entry, no row");

    let mut key = poolgate::ledger::KeyRecord {
        name: "ci".into(),
        sha256: "aa".into(),
        team: None,
        owner: None,
        expires_ms: None,
        revoked_ms: None,
        created_ms: 1,
        limits: Default::default(),
    };
    store.put_key(&key).unwrap();
    key.revoked_ms = Some(2);
    store.put_key(&key).unwrap();
    assert!(store.put_key(&poolgate::ledger::KeyRecord { name: "bot".into(), ..key.clone() }).is_err());
    assert_eq!(store.keys().unwrap(), [key], "replaced whole; the same hash twice refused");
}

/// Usage through a gateway on PostgreSQL is what the mock reported, to the
/// token; a restart keeps it, and a budget spent before it stays spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_on_postgres_is_what_the_mock_reported_and_a_budget_holds_across_a_restart() {
    let pg = PostgresServer::start();
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let budget = 150;
    let gw = gateway_on(&mock, &pg, budget);
    send_alice(&gw, 6).await;
    let alice = sum_usage(&mock.reported_usage());
    let mut carol_served = 0;
    loop {
        let r = messages(&gw, "carol-key", MODEL, carol_served % 2 == 0).await;
        if r.status() == 429 {
            assert_eq!(r.headers()["x-poolgate-key-limit"], "budget_day_tokens");
            break;
        }
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        carol_served += 1;
        assert!(carol_served < 100, "the budget never ran out");
    }
    let carol = sum_usage(&mock.reported_usage()[6..]);
    assert!(carol.total() >= budget, "{carol:?}");

    let check = async |gw: &Gateway| {
        let rows = by_key(gw).await;
        assert_eq!((usage_of(row(&rows, "alice")), row(&rows, "alice")["requests"].as_u64()), (alice, Some(6)));
        assert_eq!(usage_of(row(&rows, "carol")), carol, "{rows:?}");
    };
    check(&gw).await;
    let st = status(&gw).await;
    assert_eq!(st["ledger"]["store"], format!("postgres://poolgate@127.0.0.1:{}/postgres", pg.port), "{st}");
    assert!(!st.to_string().contains("pg-secret-pw") && !gw.log().contains("pg-secret-pw"), "the password shown");

    drop(gw);
    let gw = gateway_on(&mock, &pg, budget);
    check(&gw).await;
    assert_eq!(spent_tokens(&gw, "alice-key").await, alice.total(), "the meter read back from the database");
    let r = messages(&gw, "carol-key", MODEL, false).await;
    assert_eq!(
        (r.status().as_u16(), r.headers()["x-poolgate-key-limit"].to_str().unwrap()),
        (429, "budget_day_tokens")
    );
    assert_eq!(mock.reported_usage().len(), 6 + carol_served, "nothing refused reached the upstream");
}

/// The database stopped while the gateway serves: every request is still
/// answered at once, `/status` and `/metrics` say the store is down and how
/// many entries wait; started again, the waiting entries are written (the
/// totals exact) and the store is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_down_costs_no_request_and_gets_what_waited_when_back() {
    let mut pg = PostgresServer::start();
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = gateway_on(&mock, &pg, 1_000_000);
    send_alice(&gw, 3).await;
    support::eventually("three entries written", Duration::from_secs(10), async || {
        status(&gw).await["ledger"]["written"] == 3
    })
    .await;

    pg.stop();
    // Idle, the replica still reads the totals every flush: it sees the
    // store down before any entry fails to be written.
    support::eventually("an idle replica sees the store down", Duration::from_secs(20), async || {
        let l = status(&gw).await["ledger"].clone();
        l["down"].is_string() && l["queued"] == 0
    })
    .await;
    send_alice(&gw, 5).await;
    support::eventually("the store seen down, five entries waiting", Duration::from_secs(20), async || {
        let l = status(&gw).await["ledger"].clone();
        l["down"].is_string() && l["queued"] == 5
    })
    .await;
    assert_eq!((gauge(&gw, "poolgate_ledger_up").await, gauge(&gw, "poolgate_ledger_queued").await), (0.0, 5.0));
    let down = status(&gw).await["ledger"]["down"].as_str().unwrap().to_string();
    assert!(down.contains(&format!("127.0.0.1:{}", pg.port)) && !down.contains("pg-secret-pw"), "{down}");

    pg.start_again();
    // The writer retries with a doubling pause (at most 30 s).
    support::eventually("the waiting entries written", Duration::from_secs(60), async || {
        let l = status(&gw).await["ledger"].clone();
        l.get("down").is_none() && l["queued"] == 0 && l["written"] == 8
    })
    .await;
    assert_eq!(gauge(&gw, "poolgate_ledger_up").await, 1.0);
    let rows = by_key(&gw).await;
    assert_eq!(usage_of(row(&rows, "alice")), sum_usage(&mock.reported_usage()), "to the token");
    assert_eq!(
        (row(&rows, "alice")["requests"].as_u64(), status(&gw).await["ledger"]["dropped"].as_u64()),
        (Some(8), Some(0))
    );
}

/// A database that cannot be reached at start: the gateway refuses to start
/// (budgets would reset), naming `ledger.url` and why, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_out_of_reach_at_start_refuses_the_start_naming_ledger_url() {
    let mock = MockUpstream::start().await;
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = support::tempdir::Dir::new("pg-refused");
    let path = dir.0.join("poolgate.toml");
    let url = format!("postgres://poolgate:pg-secret-pw@127.0.0.1:{nobody}/postgres");
    let extra = format!("[ledger]\nurl = \"{url}\"\n");
    std::fs::write(&path, config(&mock.base_url(), &[("a", "KEY_A")], &extra)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .envs(env())
        .env("XDG_STATE_HOME", dir.0.join("state"))
        .output_within(Duration::from_secs(60));
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("ledger.url") && said.contains("cannot connect"), "{said}");
    assert!(said.contains(&format!("127.0.0.1:{nobody}")) && !said.contains("pg-secret-pw"), "{said}");
}
