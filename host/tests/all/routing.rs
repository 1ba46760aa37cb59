//! Routing that keeps caches warm and never strands capacity, through the real
//! binary with the default chain (`skip-exhausted → headroom → affinity`) in
//! front of the mock upstream: sessions stay on the account that served them,
//! a spent per-model bucket gates only its family, API keys are ranked by
//! their per-minute limits and spent after subscription seats, and answers cut
//! mid-way count against their account.

use crate::support;

use std::time::Duration;

use poolgate_mock_upstream::{Account, MockUpstream, Quota, Step, Window};
use serde_json::{Value, json};
use support::Gateway;

const ADMIN: &str = "routing-admin";

fn now_s() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// A config of `accounts` (id, kind, env var) with no chain: the default one.
fn config(base: &str, accounts: &[(&str, &str, &str)], extra: &str) -> String {
    let mut s = format!("[server]\nadmin_token_env = \"PG_ADMIN\"\n\n{extra}\n");
    for (id, kind, var) in accounts {
        s.push_str(&format!(
            "[[accounts]]\nid = \"{id}\"\nkind = \"{kind}\"\napi_key_env = \"{var}\"\nbase_url = \"{base}\"\n\n"
        ));
    }
    s
}

fn quota(five_hour: f64, seven_day: f64) -> Quota {
    Quota::unified_at(five_hour, seven_day, now_s())
}

fn account_of(r: &reqwest::Response) -> String {
    r.headers().get("x-poolgate-account").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

async fn status(gw: &Gateway) -> Value {
    gw.admin_json("/status", ADMIN).await
}

/// Waits until the chain's affinity stage has observed `n` answers: it binds a
/// session when it hears how its request ended, just after the response.
async fn observed(gw: &Gateway, n: u64) {
    support::eventually("affinity observed the answer", Duration::from_secs(5), async || {
        let st = status(gw).await;
        let affinity = st["chain"].as_array().and_then(|c| c.iter().find(|s| s["plugin"] == "builtin:affinity"));
        affinity.is_some_and(|s| s["observe"]["calls"].as_u64() >= Some(n))
    })
    .await;
}

fn account_status<'a>(st: &'a Value, id: &str) -> &'a Value {
    st["accounts"].as_array().and_then(|a| a.iter().find(|a| a["id"] == id)).unwrap_or(&Value::Null)
}

/// The headroom-best account moves every turn (as it does when the seat a
/// session uses fills up); the session stays put while its account is usable
/// and unsaturated, and moves once it is saturated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_session_stays_on_its_account_with_the_default_chain() {
    let mock = MockUpstream::start().await;
    let accounts: Vec<Account> = ["key-a", "key-b", "key-c"].iter().map(|k| mock.account(k)).collect();
    for (a, used) in accounts.iter().zip([0.1, 0.3, 0.5]) {
        a.set_quota(quota(used, 0.1));
    }
    let cfg = config(
        &mock.base_url(),
        &[("a", "api-key", "KEY_A"), ("b", "api-key", "KEY_B"), ("c", "api-key", "KEY_C")],
        "",
    );
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("KEY_C", "key-c"), ("PG_ADMIN", ADMIN)]);
    let st = status(&gw).await;
    let stages: Vec<&str> = st["chain"].as_array().unwrap().iter().map(|s| s["plugin"].as_str().unwrap()).collect();
    assert_eq!(stages, ["builtin:skip-exhausted", "builtin:headroom", "builtin:affinity"]);

    let mut served = Vec::new();
    for turn_no in 0..6u64 {
        let r = support::turn(&gw, "session-1", "claude-sonnet-4-5").await;
        assert_eq!(r.status(), 200);
        served.push(account_of(&r));
        observed(&gw, turn_no + 1).await;
        // The served seat fills up; another one now has the most headroom.
        let i = ["a", "b", "c"].iter().position(|id| *id == served[0]).unwrap();
        accounts[i].set_quota(quota(0.5 + 0.05 * turn_no as f64, 0.1));
        accounts[(i + 1 + turn_no as usize % 2) % 3].set_quota(quota(0.05, 0.05));
    }
    assert_eq!(served, vec![served[0].clone(); 6], "every turn of the session on one account");
    assert_eq!(served[0], "a", "the first turn goes where headroom says");
    let decisions = gw.admin_json("/admin/decisions?limit=5", ADMIN).await;
    assert!(decisions.to_string().contains("session_affinity"), "{decisions}");

    // Saturated (5h ≥ 97%): the session moves to the account headroom picks.
    accounts[0].set_quota(quota(0.98, 0.1));
    let _ = support::turn(&gw, "session-1", "claude-sonnet-4-5").await; // learns the saturation
    observed(&gw, 7).await;
    let r = support::turn(&gw, "session-1", "claude-sonnet-4-5").await;
    assert_ne!(account_of(&r), "a", "a saturated account no longer holds the session");
}

/// A 200 whose unified status is `rejected` with the representative claim
/// `seven_day_opus`: Opus requests go elsewhere, Sonnet stays on the account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_opus_bucket_leaves_sonnet_traffic_on_its_account() {
    let mock = MockUpstream::start().await;
    let (a, b) = (mock.account("key-a"), mock.account("key-b"));
    let reset = now_s() + 3 * 86_400;
    let mut spent = quota(0.1, 0.1);
    spent.status = Some("rejected".into());
    spent.reset_s = Some(reset);
    spent.representative_claim = Some("seven_day_opus".into());
    spent.buckets = vec![("opus".into(), Window::new(1.0, "rejected", reset))];
    a.set_quota(quota(0.1, 0.1));
    b.set_quota(quota(0.6, 0.6));
    let cfg = config(&mock.base_url(), &[("a", "oauth", "KEY_A"), ("b", "oauth", "KEY_B")], "");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)]);
    // Both report once (an account that never reported ranks as unused).
    let warm: Vec<String> =
        [support::turn(&gw, "", "claude-haiku-4-5").await, support::turn(&gw, "", "claude-haiku-4-5").await]
            .iter()
            .map(account_of)
            .collect();
    assert_eq!(warm, ["a", "b"]);
    a.set_quota(spent);

    let first = support::turn(&gw, "s-sonnet", "claude-sonnet-4-5").await;
    assert_eq!((first.status().as_u16(), account_of(&first)), (200, "a".into()));
    let st = status(&gw).await;
    let a_st = account_status(&st, "a");
    assert!(a_st["cooldown"].is_null(), "the account as a whole is not parked: {a_st}");
    assert!(a_st.to_string().contains("\"opus\""), "opus is gated: {a_st}");
    for i in 0..4 {
        let r = support::turn(&gw, &format!("s-sonnet-{i}"), "claude-sonnet-4-5").await;
        assert_eq!(account_of(&r), "a", "sonnet keeps using the seat with the most headroom");
        let r = support::turn(&gw, &format!("s-opus-{i}"), "claude-opus-4-1").await;
        assert_eq!((r.status().as_u16(), account_of(&r)), (200, "b".into()), "opus goes elsewhere");
    }
    let opus_on_a =
        mock.requests().iter().filter(|r| r.credential == "key-a" && r.json()["model"] == "claude-opus-4-1").count();
    assert_eq!(opus_on_a, 0, "no opus request was spent on the gated seat");
}

/// API keys report per-minute limits, which rank them; in a pool with
/// subscription seats they are overflow, spent after every usable seat,
/// unless `overflow = false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_rank_by_their_limits_and_come_after_subscription_seats() {
    let mock = MockUpstream::start().await;
    let (seat, key1, key2) = (mock.account("seat-token"), mock.account("key-1"), mock.account("key-2"));
    seat.set_quota(quota(0.6, 0.5));
    let reset = now_s() + 30;
    key1.set_quota(Quota::default().with_api_limit("requests", 100, 5, reset));
    key2.set_quota(
        Quota::default().with_api_limit("requests", 100, 80, reset).with_api_limit("tokens", 100_000, 90_000, reset),
    );
    let env = [("SEAT", "seat-token"), ("KEY_1", "key-1"), ("KEY_2", "key-2"), ("PG_ADMIN", ADMIN)];

    // Keys only: the one with room first once both have reported.
    let keys = config(&mock.base_url(), &[("k1", "api-key", "KEY_1"), ("k2", "api-key", "KEY_2")], "");
    let gw = Gateway::start(&keys, &env);
    for _ in 0..2 {
        support::turn(&gw, "", "claude-sonnet-4-5").await;
    }
    let r = support::turn(&gw, "", "claude-sonnet-4-5").await;
    assert_eq!(account_of(&r), "k2", "k1 has 5 of 100 requests left this minute");
    drop(gw);

    // A seat with 40% headroom beside a key with 90%: the seat serves.
    let mixed = config(&mock.base_url(), &[("seat", "oauth", "SEAT"), ("k2", "api-key", "KEY_2")], "");
    let gw = Gateway::start(&mixed, &env);
    for _ in 0..3 {
        let r = support::turn(&gw, "", "claude-sonnet-4-5").await;
        assert_eq!(account_of(&r), "seat", "prepaid seats before pay-as-you-go keys");
    }
    // The seat parked: the key serves rather than a 429.
    seat.push(Step::RateLimited { unified: true, retry_after: None });
    let r = support::turn(&gw, "", "claude-sonnet-4-5").await;
    assert_eq!((r.status().as_u16(), account_of(&r)), (200, "k2".into()));
    drop(gw);

    // `overflow = false`: the key ranks with the seats, by headroom.
    let equal = config(&mock.base_url(), &[("seat", "oauth", "SEAT"), ("k2", "api-key", "KEY_2")], "")
        .replace("id = \"k2\"\n", "id = \"k2\"\noverflow = false\n");
    seat.set_quota(quota(0.6, 0.5));
    let gw = Gateway::start(&equal, &env);
    for _ in 0..2 {
        support::turn(&gw, "", "claude-sonnet-4-5").await;
    }
    let r = support::turn(&gw, "", "claude-sonnet-4-5").await;
    assert_eq!(account_of(&r), "k2", "a key that is not overflow competes on headroom");
}

/// Answers cut after their first byte count against their account: three in a
/// row cool it, visible in `/status` and the metrics; the next request goes
/// elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_cut_mid_way_cool_their_account_after_three() {
    let mock = MockUpstream::start().await;
    let (a, b) = (mock.account("key-a"), mock.account("key-b"));
    a.set_quota(quota(0.1, 0.1));
    b.set_quota(quota(0.5, 0.5));
    let cfg = config(&mock.base_url(), &[("a", "api-key", "KEY_A"), ("b", "api-key", "KEY_B")], "");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)]);
    // Both report once (an account that never reported ranks as unused).
    for _ in 0..2 {
        support::turn(&gw, "", "claude-sonnet-4-5").await;
    }
    for _ in 0..3 {
        a.push(Step::ResetMidStream { after_events: 2 });
    }
    let stream = json!({ "model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
                         "messages": [{ "role": "user", "content": "hello" }] });
    for cut in 1..=3u64 {
        let r = Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("anthropic-version", "2023-06-01")
            .json(&stream)
            .send()
            .await
            .unwrap();
        let (served, decisions) = (account_of(&r), gw.admin_json("/admin/decisions?limit=1", ADMIN).await);
        assert_eq!(served, "a", "{decisions}");
        assert!(r.text().await.unwrap().contains("event: error"));
        support::eventually("the cut is counted", Duration::from_secs(5), async || {
            account_status(&status(&gw).await, "a")["streaks"]["stream_cuts"].as_u64() == Some(cut)
        })
        .await;
    }
    let st = status(&gw).await;
    assert_eq!(account_status(&st, "a")["cooldown"]["reason"], "upstream_error", "{st}");
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    let text = metrics.text().await.unwrap();
    assert!(text.contains("poolgate_stream_cuts_total{account=\"a\"} 3"), "{text}");
    let r = support::turn(&gw, "", "claude-sonnet-4-5").await;
    assert_eq!((r.status().as_u16(), account_of(&r)), (200, "b".into()));
}

/// A 7-day window spent: the unified headers of a seat that is out for the week.
fn spent_for_the_week() -> Quota {
    let reset = now_s() + 3 * 24 * 3600;
    let spent = Window { utilization: 1.0, status: "rejected".into(), reset_s: reset };
    let ok = Window { utilization: 0.2, status: "allowed".into(), reset_s: reset };
    Quota {
        status: Some("rejected".into()),
        reset_s: Some(reset),
        five_hour: Some(ok),
        seven_day: Some(spent),
        ..Default::default()
    }
}

/// A restart (SIGTERM, then the same config) keeps what the gateway learned:
/// a seat out for the week is not probed again, and a session stays on the
/// account that served it rather than moving to the one headroom prefers. A
/// state file that cannot be read is set aside and the gateway starts anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_a_spent_seat_parked_and_sessions_on_their_accounts() {
    let mock = MockUpstream::start().await;
    let (c, a, b) = (mock.account("key-c"), mock.account("key-a"), mock.account("key-b"));
    c.set_quota(spent_for_the_week());
    c.push(Step::RateLimited { unified: true, retry_after: None });
    a.set_quota(quota(0.6, 0.2));
    b.set_quota(quota(0.1, 0.1));
    let state = support::tempdir::Dir::new("state");
    let file = state.0.join("learned.json");
    let cfg = config(
        &mock.base_url(),
        &[("c", "api-key", "KEY_C"), ("a", "api-key", "KEY_A"), ("b", "api-key", "KEY_B")],
        &format!("[state]\nfile = \"{}\"\n", file.display()),
    );
    let env = [("KEY_A", "key-a"), ("KEY_B", "key-b"), ("KEY_C", "key-c"), ("PG_ADMIN", ADMIN)];

    // Nothing known yet: c (first in the pool) answers 429 for the week, and
    // a serves the session's first turn.
    let mut gw = Gateway::start(&cfg, &env);
    let r = support::turn(&gw, "session-1", "claude-sonnet-4-5").await;
    assert_eq!((r.status().as_u16(), account_of(&r)), (200, "a".into()));
    observed(&gw, 1).await;
    assert_eq!(account_status(&status(&gw).await, "c")["cooldown"]["reason"], "weekly_exhausted");
    assert_eq!(mock.served_by(), ["key-c", "key-a"]);
    gw.terminate();
    assert!(gw.wait(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", gw.log());
    drop(gw);

    mock.clear_requests();
    let gw = Gateway::start(&cfg, &env);
    let st = status(&gw).await;
    assert_eq!(account_status(&st, "c")["cooldown"]["reason"], "weekly_exhausted", "{}", gw.log());
    assert_eq!(st["state_file"]["restored"]["cooling"], 1, "{}", st["state_file"]);
    // The session stays on a; a new one goes where headroom says (b, never
    // tried, ranks before a at 60 %) — and c is not asked at all.
    let r = support::turn(&gw, "session-1", "claude-sonnet-4-5").await;
    assert_eq!(account_of(&r), "a", "{}", gw.log());
    let r = support::turn(&gw, "session-2", "claude-sonnet-4-5").await;
    assert_eq!(account_of(&r), "b");
    assert_eq!(mock.served_by(), ["key-a", "key-b"], "the spent seat was not probed");
    drop(gw);

    // A file that is not a state file: set aside, and the gateway serves.
    std::fs::write(&file, "{\"v\":1,\"written_ms\":").unwrap();
    let gw = Gateway::start(&cfg, &env);
    assert_eq!(support::turn(&gw, "session-3", "claude-sonnet-4-5").await.status(), 200);
    let st = status(&gw).await;
    assert!(st["state_file"]["restore_error"].as_str().is_some_and(|e| e.contains("not a state file")), "{st}");
    assert!(state.0.join("learned.json.corrupt").exists());
}
