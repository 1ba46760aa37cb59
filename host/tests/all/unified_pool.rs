//! What a client is told about quota behind a pool, through the real binary:
//! the `anthropic-ratelimit-unified-*` headers of an account's answer
//! describe the pool's seats together (`[gateway] unified_headers = "pool"`,
//! the default), the members not pooled are relayed as the seat sent them,
//! and `"account"` relays the serving seat's own.

use poolgate_mock_upstream::{MockUpstream, Quota};

use crate::support::{self, Gateway, config};

const ADMIN: &str = "unified-admin";
const U: &str = "anthropic-ratelimit-unified-";

fn now_s() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Three seats: 5h at 90 %, 30 % and 0 %; 7d at 50 %, 20 % and 10 %; their
/// 5h windows resetting 100 s, 200 s and 300 s apart.
fn pool(mock: &MockUpstream, now: u64) {
    for (i, (key, five, seven)) in [("key-a", 0.9, 0.5), ("key-b", 0.3, 0.2), ("key-c", 0.0, 0.1)].iter().enumerate() {
        let q = Quota::unified_at(*five, *seven, now + 100 * (i as u64 + 1)).with_fallback_percentage(0.5);
        mock.account(key).set_quota(q);
    }
}

async fn post(gw: &Gateway, path: &str) {
    let r = Gateway::client().post(format!("{}{path}", gw.url)).bearer_auth(ADMIN).body("{}").send().await.unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
}

/// A request served by `id` alone (the others disabled meanwhile): the
/// gateway reads that seat's quota from its answer.
async fn served_by(gw: &Gateway, ids: &[&str], id: &str) {
    for other in ids.iter().filter(|o| **o != id) {
        post(gw, &format!("/admin/accounts/{other}/disable")).await;
    }
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, id));
    for other in ids.iter().filter(|o| **o != id) {
        post(gw, &format!("/admin/accounts/{other}/enable")).await;
    }
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).map(|v| v.to_str().unwrap().to_string())
}

async fn gateway(mock: &MockUpstream, extra: &str) -> Gateway {
    let ids = [("a", "KEY_A"), ("b", "KEY_B"), ("c", "KEY_C")];
    let env = [("KEY_A", "key-a"), ("KEY_B", "key-b"), ("KEY_C", "key-c"), ("PG_ADMIN", ADMIN)];
    let gw = Gateway::start(&config(&mock.base_url(), &ids, extra), &env);
    for id in ["a", "b", "c"] {
        served_by(&gw, &["a", "b", "c"], id).await;
    }
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_tells_the_client_the_pools_quota_not_one_seats() {
    let mock = MockUpstream::start().await;
    let now = now_s();
    pool(&mock, now);
    let gw = gateway(&mock, "").await;
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    let h = |suffix: &str| header(&r, &format!("{U}{suffix}"));
    assert_eq!(header(&r, "x-poolgate-unified").as_deref(), Some("pool; accounts=3"));
    assert_eq!(h("5h-utilization").as_deref(), Some("0.4"), "the mean of 0.9, 0.3 and 0");
    assert_eq!(h("7d-utilization").as_deref(), Some("0.2667"));
    // The soonest 5h reset of a seat that used some: a's.
    assert_eq!(h("5h-reset"), Some((now + 100 + 5 * 3600).to_string()));
    assert_eq!(h("reset"), h("5h-reset"), "the binding window's");
    assert_eq!(h("representative-claim").as_deref(), Some("five_hour"));
    assert_eq!((h("status").as_deref(), h("5h-status").as_deref()), (Some("allowed"), Some("allowed")));
    assert_eq!(h("fallback-percentage").as_deref(), Some("0.5"), "a member not pooled is relayed");

    // `/v1/usage` answers the same pool, and the status line shows it.
    let usage: serde_json::Value =
        Gateway::client().get(format!("{}/v1/usage", gw.url)).send().await.unwrap().json().await.unwrap();
    let pool = &usage["pool"];
    assert_eq!((pool["accounts"].as_u64(), pool["binding"].as_str()), (Some(3), Some("five_hour")), "{usage}");
    assert_eq!(pool["windows"][0]["utilization"].as_f64(), Some(0.4), "{usage}");
    let line = crate::key_limits::status_line(&gw.url, "");
    assert!(line.ends_with(" · pool 5h 40% 7d 27%"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_mode_relays_the_serving_seats_own_headers() {
    let mock = MockUpstream::start().await;
    let now = now_s();
    pool(&mock, now);
    let gw = gateway(&mock, "[gateway]\nunified_headers = \"account\"\n").await;
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    let seat = header(&r, "x-poolgate-account").unwrap();
    let own = match seat.as_str() {
        "a" => "0.9",
        "b" => "0.3",
        _ => "0.0",
    };
    assert_eq!(header(&r, &format!("{U}5h-utilization")).as_deref(), Some(own), "served by {seat}");
    assert_eq!(header(&r, "x-poolgate-unified"), None);
}
