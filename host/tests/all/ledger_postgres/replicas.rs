//! Two replicas on one PostgreSQL and one Redis hold a key to one budget
//! together: sequentially, neither lets the key past it by more than the one
//! request that crossed it; under concurrent load, by no more than what was
//! in flight plus what each replica answered in the time the other takes to
//! learn it (two flush intervals: one to write, one to read). The ledger on
//! either replica is the sum of what the mock reported to both.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use poolgate_mock_upstream::MockUpstream;

use super::{MODEL, by_key, env, ledger_keys, row};
use crate::support::postgres::PostgresServer;
use crate::support::redis::RedisServer;
use crate::support::{self, Gateway, config, messages, spent_tokens, sum_usage, usage_of};

const FLUSH_MS: u64 = 100;

/// Replica `name` on `pg` and `redis`: the one config but for its name.
fn replica(mock: &MockUpstream, pg: &PostgresServer, redis: &RedisServer, name: &str, budgets: (u64, u64)) -> Gateway {
    let state = format!(
        "[state]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"pgledger:\"\nreplica = \"{name}\"\n\n",
        redis.url()
    );
    let extra = state + &ledger_keys(pg, FLUSH_MS, budgets.0, budgets.1);
    Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &extra), &env())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_postgres_and_one_redis_hold_a_key_to_one_budget() {
    let (pg, redis) = (PostgresServer::start(), RedisServer::start());
    // Answers that take a while, so concurrent requests overlap.
    let slow = poolgate_mock_upstream::Config { latency_ms: 30, ..Default::default() };
    let mock = MockUpstream::start_with(slow).await;
    mock.account("key-a");
    let budgets = (300, 6_000);
    let (a, b) = (replica(&mock, &pg, &redis, "a", budgets), replica(&mock, &pg, &redis, "b", budgets));

    let carol = sequential(&mock, [&a, &b], budgets.0).await;
    let dave = concurrent(&mock, [&a, &b], budgets.1, carol.len()).await;

    // The ledger, on either replica: what the mock reported to both.
    for gw in [&a, &b] {
        support::eventually("both replicas' entries written", Duration::from_secs(10), async || {
            let rows = by_key(gw).await;
            rows.len() == 2
                && usage_of(row(&rows, "carol")) == sum_usage(&carol)
                && usage_of(row(&rows, "dave")) == sum_usage(&dave)
        })
        .await;
        let rows = by_key(gw).await;
        assert_eq!(row(&rows, "carol")["requests"].as_u64(), Some(carol.len() as u64));
        assert_eq!(row(&rows, "dave")["requests"].as_u64(), Some(dave.len() as u64));
    }
}

/// Carol's requests, one at a time, to A and B in turn; after each answer
/// both replicas' meters agree with the mock before the next. Once refused,
/// both refuse; spent is at most the budget and the request that crossed it.
/// What the mock reported for carol.
async fn sequential(mock: &MockUpstream, gws: [&Gateway; 2], budget: u64) -> Vec<poolgate_wire::usage::Usage> {
    let mut learned = Duration::ZERO;
    let mut sent = 0;
    let other = loop {
        let gw = gws[sent % 2];
        let r = messages(gw, "carol-key", MODEL, sent % 3 == 0).await;
        sent += 1;
        if r.status() == 429 {
            assert_eq!(r.headers()["x-poolgate-key-limit"], "budget_day_tokens");
            break sent % 2;
        }
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        let truth = sum_usage(&mock.reported_usage()).total();
        let started = poolgate::clock::machine_instant();
        for other in gws {
            support::eventually("both replicas know carol's spend", Duration::from_secs(10), async || {
                spent_tokens(other, "carol-key").await == truth
            })
            .await;
        }
        learned = learned.max(started.elapsed());
        assert!(sent < 200, "the budget never ran out");
    };
    let r = messages(gws[other], "carol-key", MODEL, false).await;
    assert_eq!(
        (r.status().as_u16(), r.headers()["x-poolgate-key-limit"].to_str().unwrap()),
        (429, "budget_day_tokens"),
        "the other"
    );
    let reported = mock.reported_usage();
    let (spent, last) = (sum_usage(&reported).total(), reported.last().unwrap().total());
    eprintln!(
        "sequential: budget {budget} tokens, spent {spent} in {} requests (the other replica learned within {learned:?})",
        reported.len()
    );
    assert!(budget <= spent && spent <= budget + last, "spent {spent}, budget {budget}, one request {last}");
    reported
}

/// When each replica answered dave (machine time).
type Answers = Arc<Mutex<[Vec<Duration>; 2]>>;

/// Dave's requests from `CLIENTS` clients at once, half on each replica,
/// until refused. Overspend (requests past the ones the budget needed) is at
/// most the clients plus what each replica answered in any two flush
/// intervals. What the mock reported for dave.
async fn concurrent(
    mock: &MockUpstream,
    gws: [&Gateway; 2],
    budget: u64,
    before: usize,
) -> Vec<poolgate_wire::usage::Usage> {
    const CLIENTS: usize = 8;
    let answers: Answers = Arc::default();
    let start = poolgate::clock::machine_instant();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (url, answers) = (gws[i % 2].url.clone(), answers.clone());
            tokio::spawn(async move {
                loop {
                    let r = Gateway::client()
                        .post(format!("{url}/v1/messages"))
                        .header("x-api-key", "dave-key")
                        .json(&support::message(MODEL, i % 4 < 2))
                        .send()
                        .await
                        .unwrap();
                    match r.status().as_u16() {
                        200 => r.bytes().await.map(drop).unwrap(),
                        429 if r.headers()["x-poolgate-key-limit"] == "budget_day_tokens" => return,
                        s => panic!("status {s}"),
                    }
                    let mut answers = answers.lock();
                    answers[i % 2].push(start.elapsed());
                    assert!(answers.iter().map(Vec::len).sum::<usize>() < 1_000, "the budget never ran out");
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    for gw in gws {
        assert_eq!(messages(gw, "dave-key", MODEL, false).await.status(), 429, "both refuse once spent");
    }
    let dave = mock.reported_usage()[before..].to_vec();
    let spent = sum_usage(&dave).total();
    // The requests the budget needed: the first whose running total reaches it.
    let needed = dave.iter().scan(0, |t, u| Some(*t + u.total()).inspect(|n| *t = *n)).position(|t| t >= budget);
    let needed = needed.map_or(dave.len(), |i| i + 1);
    let over = dave.len() - needed;
    let window = Duration::from_millis(2 * FLUSH_MS);
    let learning: Vec<usize> = answers.lock().iter().map(|a| most_in_any(a, window)).collect();
    let bound = CLIENTS + learning.iter().sum::<usize>();
    eprintln!(
        "concurrent: {CLIENTS} clients on 2 replicas, flush_ms {FLUSH_MS}: budget {budget} tokens, spent {spent} \
         in {} requests; overspend {over} requests, {} tokens (bound {bound}: {CLIENTS} in flight + {learning:?} \
         answered per replica in {window:?})",
        dave.len(),
        spent.saturating_sub(budget)
    );
    assert!(spent >= budget, "refused before the budget was spent: {spent}");
    assert!(over <= bound, "overspent {over} requests > {bound}");
    dave
}

/// The most of `times` (sorted) in any span of `window`.
fn most_in_any(times: &[Duration], window: Duration) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort();
    (0..sorted.len()).map(|i| sorted[i..].iter().take_while(|t| **t - sorted[i] <= window).count()).max().unwrap_or(0)
}
