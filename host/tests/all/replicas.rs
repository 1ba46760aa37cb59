//! Replicas that share what they learn, through a real `redis-server`: two
//! `poolgate serve` processes against one Redis and one mock upstream. What
//! one replica learns (an exhausted account, a session's binding, a slot in
//! use, a refreshed seat) the other acts on without asking the upstream; a
//! Redis that dies mid-load costs no request, and when it returns the
//! replicas converge; a stale or foreign record never replaces a fresher
//! reading.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use poolgate_mock_upstream::{Identity, MockUpstream, Quota, Step};
use serde_json::{Value, json};
use support::redis::RedisServer;
use support::{Gateway, tempdir};

const ADMIN: &str = "replicas-admin";

fn now_s() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn now_ms() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// `[state]` for `redis`, under a prefix of the test's own.
fn state(redis: &RedisServer, prefix: &str) -> String {
    format!("[state]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}:\"\n", redis.url())
}

/// A config of API-key accounts `(id, env var, extra account keys)`.
fn config(base: &str, accounts: &[(&str, &str, &str)], extra: &str) -> String {
    let mut s = format!("[server]\nadmin_token_env = \"PG_ADMIN\"\n\n{extra}\n");
    for (id, var, more) in accounts {
        s.push_str(&format!("[[accounts]]\nid = \"{id}\"\napi_key_env = \"{var}\"\nbase_url = \"{base}\"\n{more}\n\n"));
    }
    s
}

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_X", "key-x"), ("KEY_Y", "key-y"), ("PG_ADMIN", ADMIN)]
}

async fn status(gw: &Gateway) -> Value {
    gw.admin_json("/status", ADMIN).await
}

fn account<'a>(st: &'a Value, id: &str) -> &'a Value {
    st["accounts"].as_array().and_then(|a| a.iter().find(|a| a["id"] == id)).unwrap_or(&Value::Null)
}

fn window(st: &Value, id: &str, name: &str) -> Option<f64> {
    account(st, id)["windows"].as_array()?.iter().find(|w| w["name"] == name)?["utilization"].as_f64()
}

fn served_by(r: &reqwest::Response) -> String {
    r.headers().get("x-poolgate-account").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// Both replicas report themselves in step with Redis.
async fn in_step(gws: &[&Gateway]) {
    for gw in gws {
        support::eventually("the replica is in step with Redis", Duration::from_secs(10), async || {
            status(gw).await["state_backend"]["connected"] == true
        })
        .await;
    }
}

/// Sends requests through `gw` until it has read both accounts' quota.
async fn read_both(gw: &Gateway) {
    support::eventually("the replica has read both accounts", Duration::from_secs(5), async || {
        let _ = send(gw).await;
        let st = status(gw).await;
        window(&st, "x", "5h").is_some() && window(&st, "y", "5h").is_some()
    })
    .await;
}

async fn send(gw: &Gateway) -> reqwest::Response {
    support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap()
}

/// A's request finds x spent (429, 5h window used up until a reset ahead)
/// and fails over to y; B, which never asked x, skips it from the first
/// request — within a second of A learning it (the figure printed is the
/// measured staleness).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_exhausted_on_one_replica_is_skipped_by_the_other_without_a_probe() {
    exhausted_on_a_skipped_by_b(Step::RateLimited { unified: true, retry_after: None }, "y").await;
}

/// The commoner way an account runs out: the answer that spends it is a 200
/// whose headers say the 5h window is used up. A serves it from x and rests
/// x; B skips x too (a 2xx must not lift the cooldown it set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_a_200_spent_on_one_replica_is_skipped_by_the_other() {
    exhausted_on_a_skipped_by_b(Step::Ok, "x").await;
}

async fn exhausted_on_a_skipped_by_b(spending: Step, served_on_a: &str) {
    let redis = RedisServer::start();
    let mock = MockUpstream::start().await;
    let x = mock.account("key-x");
    let y = mock.account("key-y");
    y.set_quota(Quota::unified_at(0.5, 0.5, now_s()));
    let cfg = config(&mock.base_url(), &[("x", "KEY_X", ""), ("y", "KEY_Y", "")], &state(&redis, "exhausted"));
    let a = Gateway::start(&cfg, &env());
    let b = Gateway::start(&cfg, &env());
    in_step(&[&a, &b]).await;

    x.set_quota(Quota::unified_at(1.0, 0.4, now_s()));
    x.set_default(spending);
    let r = send(&a).await;
    assert_eq!((r.status().as_u16(), served_by(&r)), (200, served_on_a.to_string()));
    let learned = poolgate::clock::machine_instant();
    assert_eq!(x.count(), 1);
    // A liveness guard: how soon B knew is printed (and measured where time
    // belongs, not asserted here, where a busy machine would break it).
    support::eventually("B knows x is cooling", Duration::from_secs(10), async || {
        !account(&status(&b).await, "x")["cooldown"].is_null()
    })
    .await;
    eprintln!("staleness: B knew of x's exhaustion {} ms after A's answer", learned.elapsed().as_millis());
    for _ in 0..3 {
        let r = send(&b).await;
        assert_eq!((r.status().as_u16(), served_by(&r)), (200, "y".to_string()));
    }
    // Past a poll on both, so every record was read again.
    for gw in [&a, &b] {
        let merged = |st: &Value| st["state_backend"]["records_merged"].as_u64().unwrap_or(0);
        let before = merged(&status(gw).await);
        support::eventually("a poll merged the records again", Duration::from_secs(3), async || {
            merged(&status(gw).await) > before
        })
        .await;
    }
    for gw in [&a, &b] {
        let r = send(gw).await;
        assert_eq!((r.status().as_u16(), served_by(&r)), (200, "y".to_string()), "x stays resting on both");
    }
    assert_eq!(x.count(), 1, "B never probed the account A saw exhausted");
    let st = status(&b).await;
    assert_eq!(account(&st, "x")["cooldown"]["reason"], "session_exhausted", "{st}");
    assert!(st["state_backend"]["replicas_seen"].as_u64() >= Some(1), "{}", st["state_backend"]);
}

/// A session's first turn is served on A (by x, the most headroom then);
/// headroom then moves to y. B serves the session's next turn on x — the
/// binding A made — while a new session on B goes to y.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_bound_on_one_replica_is_served_by_the_same_account_on_the_other() {
    let redis = RedisServer::start();
    let mock = MockUpstream::start().await;
    let (x, y) = (mock.account("key-x"), mock.account("key-y"));
    x.set_quota(Quota::unified_at(0.1, 0.1, now_s()));
    y.set_quota(Quota::unified_at(0.4, 0.1, now_s()));
    let cfg = config(&mock.base_url(), &[("x", "KEY_X", ""), ("y", "KEY_Y", "")], &state(&redis, "affinity"));
    let a = Gateway::start(&cfg, &env());
    let b = Gateway::start(&cfg, &env());
    in_step(&[&a, &b]).await;
    read_both(&a).await;
    read_both(&b).await;

    let r = support::turn(&a, "session-1", "claude-sonnet-4-5").await;
    assert_eq!(served_by(&r), "x");
    // A binds the session when it hears the answer ended; B hears of it.
    support::eventually("B has A's binding", Duration::from_secs(5), async || {
        status(&b).await["state_backend"]["plugin_writes_applied"].as_u64() >= Some(1)
    })
    .await;
    // x fills up, y empties; both replicas learn it from traffic.
    x.set_quota(Quota::unified_at(0.6, 0.1, now_s()));
    y.set_quota(Quota::unified_at(0.05, 0.05, now_s()));
    support::eventually("B reads x fuller than y", Duration::from_secs(5), async || {
        let _ = send(&b).await;
        let st = status(&b).await;
        window(&st, "x", "5h") == Some(0.6) && window(&st, "y", "5h") == Some(0.05)
    })
    .await;
    let fresh = support::turn(&b, "session-2", "claude-sonnet-4-5").await;
    assert_eq!(served_by(&fresh), "y", "headroom sends a new session to y");
    let bound = support::turn(&b, "session-1", "claude-sonnet-4-5").await;
    assert_eq!(
        served_by(&bound),
        "x",
        "B keeps the session on the account A bound it to (Redis holds {})",
        redis.cli(&["KEYS", "*"])
    );
}

/// x allows one request in flight and answers slowly; y has no limit. While
/// A's request holds x, B's goes to y; once A's ends, B gets x again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_holds_across_replicas() {
    let redis = RedisServer::start();
    let mock = MockUpstream::start().await;
    let (x, y) = (mock.account("key-x"), mock.account("key-y"));
    x.set_quota(Quota::unified_at(0.1, 0.1, now_s()));
    y.set_quota(Quota::unified_at(0.5, 0.5, now_s()));
    let cfg = config(
        &mock.base_url(),
        &[("x", "KEY_X", "max_in_flight = 1"), ("y", "KEY_Y", "")],
        &format!("{}lease_ttl_ms = 1000\n", state(&redis, "inflight")),
    );
    let a = Gateway::start(&cfg, &env());
    let b = Gateway::start(&cfg, &env());
    in_step(&[&a, &b]).await;
    // Both replicas read both accounts, and rank x first.
    for gw in [&a, &b] {
        read_both(gw).await;
        assert_eq!(served_by(&send(gw).await), "x");
    }

    x.push(Step::Delay { ms: 1_500, then: Box::new(Step::Ok) });
    let url = a.url.clone();
    let held = tokio::spawn(async move {
        let r = support::send_message(&Gateway::client(), &url, "claude-sonnet-4-5").await.unwrap();
        served_by(&r)
    });
    support::eventually("A's request holds x", Duration::from_secs(5), async || {
        account(&status(&a).await, "x")["in_flight"] == 1
    })
    .await;
    let during = send(&b).await;
    assert_eq!(served_by(&during), "y", "x's one slot is taken on A");
    assert_eq!(held.await.unwrap(), "x");
    support::eventually("B gets x again once A's request ended", Duration::from_secs(5), async || {
        served_by(&send(&b).await) == "x"
    })
    .await;

    // A replica that dies holding the slot gives it back when its lease
    // lapses (lease_ttl_ms = 1000 here).
    x.push(Step::Delay { ms: 30_000, then: Box::new(Step::Ok) });
    let url = a.url.clone();
    let _hung = tokio::spawn(async move { support::send_message(&Gateway::client(), &url, "claude-sonnet-4-5").await });
    support::eventually("A's request holds x", Duration::from_secs(5), async || {
        account(&status(&a).await, "x")["in_flight"] == 1
    })
    .await;
    assert_eq!(served_by(&send(&b).await), "y");
    let pid = a.pid().to_string();
    std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    let died = poolgate::clock::machine_instant();
    support::eventually("B gets x once the dead replica's lease lapsed", Duration::from_secs(5), async || {
        served_by(&send(&b).await) == "x"
    })
    .await;
    assert!(died.elapsed() >= Duration::from_millis(500), "the slot came back before the lease could lapse");
}

/// A Redis that asks for a password: the replica connects with the one in
/// `url`, and neither its log nor `/status` ever shows it; with a wrong one
/// the replica serves on its own and says why, still without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_password_never_shows_and_a_wrong_one_fails_open() {
    let redis = RedisServer::start_with(Some("hunter2-redis-secret"));
    let mock = MockUpstream::start().await;
    mock.account("key-x").set_quota(Quota::unified_at(0.1, 0.1, now_s()));
    let shared = |password: &str| {
        format!(
            "[state]\nbackend = \"redis\"\nurl = \"redis://:{password}@127.0.0.1:{}\"\nkey_prefix = \"pw:\"\n",
            redis.port
        )
    };
    let good =
        Gateway::start(&config(&mock.base_url(), &[("x", "KEY_X", "")], &shared("hunter2-redis-secret")), &env());
    let bad = Gateway::start(&config(&mock.base_url(), &[("x", "KEY_X", "")], &shared("wrong-secret-77")), &env());
    in_step(&[&good]).await;
    support::eventually("the wrong password is reported", Duration::from_secs(5), async || {
        status(&bad).await["state_backend"]["errors"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(send(&bad).await.status(), 200, "a replica Redis refuses still serves");
    assert_eq!(send(&good).await.status(), 200);
    for (gw, secret) in [(&good, "hunter2-redis-secret"), (&bad, "wrong-secret-77")] {
        let st = status(gw).await;
        assert_eq!(st["state_backend"]["url"], format!("redis://:***@127.0.0.1:{}", redis.port));
        assert!(
            !st.to_string().contains(secret) && !gw.log().contains(secret),
            "the password leaked:\n{st}\n{}",
            gw.log()
        );
    }
    assert_eq!(status(&bad).await["state_backend"]["connected"], false);
}

/// One seat, on two replicas with a copy each of its credentials (two
/// machines). Its token lives 3 s and is refreshed 1.5 s before expiry, so
/// both replicas want to refresh it at the same time, over and over. The
/// refresh token is single-use: a second refresh with it would be refused
/// and lose the seat. Each expiry is refreshed once, the other replica
/// adopts the new pair, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_both_replicas_serve_is_refreshed_once_per_expiry() {
    let redis = RedisServer::start();
    let mock = MockUpstream::start().await;
    let upstream = mock.account("acct-s");
    upstream.set_quota(Quota::unified(0.2, 0.1));
    let seat = mock.oauth().seat(&upstream, Identity::new("s"));
    seat.set_lifetime(Duration::from_secs(3));
    let tokens = seat.issue();
    let base = mock.base_url();
    let start = |tag: &str| {
        let dir = tempdir::Dir::new(tag);
        let creds = dir.0.join("seats/s.json");
        support::write_credentials(&creds, &tokens);
        let cfg = format!(
            "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[oauth]\ntoken_url = \"{base}/v1/oauth/token\"\nusage_poll_ms = 0\n\
             refresh_before_ms = 1500\ncheck_interval_ms = 100\n\n{}\n\
             [[accounts]]\nid = \"s\"\nkind = \"oauth\"\ncredentials = \"{}\"\nbase_url = \"{base}\"\n",
            state(&redis, "seat"),
            creds.display()
        );
        let path = dir.0.join("poolgate.toml");
        std::fs::write(&path, cfg).unwrap();
        Gateway::start_file(&path, &[("PG_ADMIN", ADMIN)], dir)
    };
    let a = start("replica-a");
    let b = start("replica-b");
    in_step(&[&a, &b]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let loads = [&a, &b].map(|gw| support::drive(gw, stop.clone(), Duration::from_millis(25)));
    let started = poolgate::clock::machine_instant();
    support::eventually("four refreshes", Duration::from_secs(20), async || mock.oauth().refreshes() >= 4).await;
    stop.store(true, Ordering::Release);
    let lifetimes = started.elapsed().as_secs_f64() / 1.5;
    let mut statuses = Vec::new();
    for l in loads {
        statuses.extend(l.await.unwrap());
    }
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert_eq!(failed, 0, "{failed} of {} requests failed:\nA:\n{}\nB:\n{}", statuses.len(), a.log(), b.log());
    let refused = mock.oauth().token_requests().iter().filter(|t| t.status.is_some_and(|s| s != 200)).count();
    assert_eq!(refused, 0, "a refresh token was used twice:\nA:\n{}\nB:\n{}", a.log(), b.log());
    assert!(
        (mock.oauth().refreshes() as f64) <= lifetimes + 2.0,
        "{} refreshes in {lifetimes:.1} half-lifetimes",
        mock.oauth().refreshes()
    );
    for gw in [&a, &b] {
        let st = status(gw).await;
        assert_eq!(account(&st, "s")["oauth"]["needs_login"], false, "{st}");
    }
    let adopted = [&a, &b].iter().any(|gw| gw.log().contains("adopted the OAuth credentials another replica obtained"));
    assert!(adopted, "one replica refreshed and the other adopted its pair");
}

/// Load on both replicas; Redis is killed: no client request fails, both
/// report the backend away (and stay ready). While it is gone, A learns x is
/// spent. Redis comes back empty: A writes back what it learned, and B —
/// which never asked x — skips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dying_mid_load_costs_no_request_and_the_replicas_converge_when_it_returns() {
    let mut redis = RedisServer::start();
    let mock = MockUpstream::start().await;
    let (x, y) = (mock.account("key-x"), mock.account("key-y"));
    x.set_quota(Quota::unified_at(0.2, 0.1, now_s()));
    y.set_quota(Quota::unified_at(0.5, 0.5, now_s()));
    let cfg = config(&mock.base_url(), &[("x", "KEY_X", ""), ("y", "KEY_Y", "")], &state(&redis, "outage"));
    let a = Gateway::start(&cfg, &env());
    let b = Gateway::start(&cfg, &env());
    in_step(&[&a, &b]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let loads = [&a, &b].map(|gw| support::drive(gw, stop.clone(), Duration::from_millis(5)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    for gw in [&a, &b] {
        support::eventually("the replica notices Redis is gone", Duration::from_secs(5), async || {
            status(gw).await["state_backend"]["connected"] == false
        })
        .await;
        let ready = Gateway::client().get(format!("{}/readyz", gw.url)).send().await.unwrap();
        assert_eq!(ready.status(), 200, "readiness does not depend on Redis");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Release);
    let mut statuses = Vec::new();
    for l in loads {
        statuses.extend(l.await.unwrap());
    }
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert!(statuses.len() >= 50, "only {} requests", statuses.len());
    assert_eq!(failed, 0, "{failed} of {} requests failed with Redis gone", statuses.len());
    let st = status(&a).await;
    assert!(st["state_backend"]["errors"].as_u64() >= Some(1), "{}", st["state_backend"]);
    let metrics = Gateway::client().get(format!("{}/metrics", a.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("poolgate_state_backend_up{} 0"), "{metrics}");
    assert!(metrics.contains("poolgate_state_backend_errors_total{op="), "{metrics}");

    // Learned while Redis is away.
    x.set_quota(Quota::unified_at(1.0, 0.4, now_s()));
    x.set_default(Step::RateLimited { unified: true, retry_after: None });
    let _ = send(&a).await;
    let spent = x.count();
    assert!(!account(&status(&a).await, "x")["cooldown"].is_null());

    redis.restart();
    in_step(&[&a, &b]).await;
    support::eventually("B learns what A learned while Redis was away", Duration::from_secs(5), async || {
        !account(&status(&b).await, "x")["cooldown"].is_null()
    })
    .await;
    let r = send(&b).await;
    assert_eq!(served_by(&r), "y");
    assert_eq!(x.count(), spent, "B skipped x without a probe");
}

/// The fingerprint poolgate binds an API key's records to.
fn key_identity(key: &str) -> String {
    use sha2::Digest as _;
    format!("key:{}", &hex::encode(sha2::Sha256::digest(key.as_bytes()))[..16])
}

fn record(identity: &str, utilization: f64, observed_ms: u64) -> String {
    json!({
        "v": 1,
        "identity": identity,
        "written_ms": now_ms(),
        "windows": [{ "name": "5h", "utilization": utilization, "resets_at_ms": now_ms() + 3_600_000,
                      "status": "allowed", "observed_at_ms": observed_ms }],
    })
    .to_string()
}

/// B holds a fresh reading of x (5h at 30%). Records written straight into
/// Redis by other "replicas": one stale (an hour old, 99%), one about
/// another key under the same id (fresh, 100%), one that is not a record.
/// None changes B's reading, B keeps serving, and it counts what it refused;
/// a fresh record of the same key is taken (so the path is live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_foreign_record_never_replaces_a_fresher_reading() {
    let redis = RedisServer::start();
    let mock = MockUpstream::start().await;
    let x = mock.account("key-x");
    x.set_quota(Quota::unified_at(0.3, 0.1, now_s()));
    let cfg = config(&mock.base_url(), &[("x", "KEY_X", "")], &state(&redis, "stale"));
    let b = Gateway::start(&cfg, &env());
    in_step(&[&b]).await;
    assert_eq!(send(&b).await.status(), 200);
    let st = status(&b).await;
    assert_eq!(window(&st, "x", "5h"), Some(0.3));

    let key = "stale:facts:x";
    let mine = key_identity("key-x");
    redis.cli(&["HSET", key, "stale-replica", &record(&mine, 0.99, now_ms() - 3_600_000)]);
    redis.cli(&["HSET", key, "other-key", &record(&key_identity("another-key"), 1.0, now_ms())]);
    redis.cli(&["HSET", key, "broken", "{\"v\":1,\"identity\":"]);
    let ignored = |st: &Value| st["state_backend"]["other_identity"].as_u64().unwrap_or(0);
    support::eventually("B polled the records", Duration::from_secs(5), async || {
        let st = status(&b).await;
        ignored(&st) >= 1 && st["state_backend"]["errors"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(window(&status(&b).await, "x", "5h"), Some(0.3), "no stale or foreign reading replaced the fresh one");
    assert_eq!(send(&b).await.status(), 200, "garbage in Redis does not cost a request");

    // Fresher than B's own reading, whose millisecond may be this one.
    let seen = account(&status(&b).await, "x")["windows"][0]["observed_at_ms"].as_u64().unwrap();
    redis.cli(&["HSET", key, "fresh-replica", &record(&mine, 0.77, now_ms().max(seen + 1))]);
    let took = async || window(&status(&b).await, "x", "5h") == Some(0.77);
    for _ in 0..500 {
        if took().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("B did not take a fresher reading of the same key: {}\n{}", status(&b).await, b.log());
}
