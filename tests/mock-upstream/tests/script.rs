//! Scripting and bookkeeping: step order, defaults, quota and organization headers, and
//! the record of who served what.

mod common;

use std::time::Duration;

use common::{client, header, message_body, post_messages};
use poolgate_mock_upstream::{Config, MockUpstream, Quota, Step, Window};

#[tokio::test]
async fn steps_play_in_fifo_order_then_the_default() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    a.push(Step::Overloaded);
    a.push(Step::ServerError(500));
    a.push(Step::RateLimited { unified: false, retry_after: None });
    assert_eq!(a.pending(), 3);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(post_messages(&up, "k1", &message_body(false)).await.status().as_u16());
    }
    assert_eq!(statuses, [529, 500, 429, 200, 200]);
    assert_eq!(a.count(), 5);
    assert_eq!(a.pending(), 0);
}

#[tokio::test]
async fn set_default_applies_once_the_queue_is_empty() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    a.set_default(Step::ServerError(502));
    a.push(Step::Ok);
    let statuses = [
        post_messages(&up, "k1", &message_body(false)).await.status(),
        post_messages(&up, "k1", &message_body(false)).await.status(),
        post_messages(&up, "k1", &message_body(true)).await.status(),
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [200, 502, 502]);
}

#[tokio::test]
async fn scripts_are_per_account() {
    let up = MockUpstream::start().await;
    let a = up.account("a");
    let b = up.account("b");
    a.push(Step::Overloaded);
    assert_eq!(post_messages(&up, "b", &message_body(false)).await.status(), 200);
    assert_eq!(post_messages(&up, "a", &message_body(false)).await.status(), 529);
    assert_eq!((a.count(), b.count()), (1, 1));
    // `account` on a known credential returns the same account.
    assert_eq!(up.account("a").count(), 1);
}

#[tokio::test]
async fn quota_headers_come_on_every_response_of_the_account() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    let quota = Quota {
        status: Some("allowed_warning".into()),
        reset_s: Some(1_800_000_000),
        representative_claim: Some("seven_day".into()),
        five_hour: Some(Window::allowed(0.03, 1_800_000_100)),
        seven_day: Some(Window::new(0.91, "allowed_warning", 1_800_000_000)),
        buckets: vec![("oi".into(), Window::new(1.0, "rejected", 1_800_000_200))],
        overage_status: Some("rejected".into()),
        overage_disabled_reason: Some("org_level_disabled".into()),
        extra: vec![],
    }
    .with_fallback_percentage(0.5)
    .with_api_limit("requests", 4000, 3999, 1_800_000_000);
    a.set_quota(quota.clone());
    a.push(Step::Overloaded);
    let expected = quota.headers();
    assert_eq!(expected.len(), 18);
    for stream in [false, true, false] {
        let r = post_messages(&up, "k1", &message_body(stream)).await;
        for (name, value) in &expected {
            assert_eq!(header(&r, name), Some(value.as_str()), "{name} on {}", r.status());
        }
    }
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(header(&r, "anthropic-ratelimit-unified-5h-utilization"), Some("0.03"));
    assert_eq!(header(&r, "anthropic-ratelimit-unified-7d_oi-status"), Some("rejected"));
    assert_eq!(header(&r, "anthropic-ratelimit-requests-reset"), Some("2027-01-15T08:00:00Z"));
}

#[tokio::test]
async fn organization_id_defaults_per_credential_and_can_be_set() {
    let up = MockUpstream::start().await;
    let a = up.account("a");
    up.account("b");
    let org = |key: &'static str| {
        let up = &up;
        async move {
            header(&post_messages(up, key, &message_body(false)).await, "anthropic-organization-id").map(str::to_owned)
        }
    };
    let (org_a, org_b) = (org("a").await.unwrap(), org("b").await.unwrap());
    assert!(org_a.starts_with("org-") && org_a != org_b);
    assert_eq!(org("a").await.unwrap(), org_a, "stable per credential");
    a.set_org("org-shared");
    assert_eq!(org("a").await.unwrap(), "org-shared");
}

#[tokio::test]
async fn requests_and_served_by_record_arrival_order() {
    let up = MockUpstream::start().await;
    up.account("a");
    up.account("b");
    post_messages(&up, "b", &message_body(false)).await;
    post_messages(&up, "nobody", &message_body(false)).await;
    let r = client()
        .post(format!("{}/v1/messages?beta=true", up.base_url()))
        .header("authorization", "Bearer a")
        .header("x-claude-code-session-id", "s-1")
        .json(&message_body(true))
        .send()
        .await
        .unwrap();
    r.text().await.unwrap();
    assert_eq!(up.served_by(), ["b", "", "a"]);
    let recorded = up.requests();
    assert_eq!(recorded.len(), 3);
    assert_eq!(recorded[1].credential, "");
    assert_eq!(recorded[1].header("x-api-key"), Some("nobody"));
    let last = &recorded[2];
    assert_eq!((last.method.as_str(), last.path.as_str()), ("POST", "/v1/messages?beta=true"));
    assert_eq!(last.header("x-claude-code-session-id"), Some("s-1"));
    assert!(last.headers.iter().all(|(n, _)| *n == n.to_ascii_lowercase()));
    assert_eq!(last.json()["stream"], true);
    up.clear_requests();
    assert!(up.requests().is_empty() && up.served_by().is_empty());
}

#[tokio::test]
async fn a_request_is_recorded_on_arrival_before_its_delay() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::Delay { ms: 2_000, then: Box::new(Step::Ok) });
    let url = format!("{}/v1/messages", up.base_url());
    let pending = tokio::spawn(async move {
        let _ = client().post(url).header("x-api-key", "k1").json(&message_body(false)).send().await;
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while up.served_by().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "not recorded within 1 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.served_by(), ["k1"]);
    assert!(!pending.is_finished());
    pending.abort();
}

#[tokio::test]
async fn accept_any_makes_every_credential_an_account_with_the_default_quota() {
    let up = MockUpstream::start_with(Config {
        accept_any: true,
        default_quota: Some(Quota::unified(0.2, 0.1)),
        ..Config::default()
    })
    .await;
    let r = post_messages(&up, "never-registered", &message_body(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "anthropic-ratelimit-unified-5h-utilization"), Some("0.2"));
    assert_eq!(up.served_by(), ["never-registered"]);
    assert_eq!(up.account("never-registered").count(), 1);
    let r = client().post(format!("{}/v1/messages", up.base_url())).json(&message_body(false)).send().await.unwrap();
    assert_eq!(r.status(), 401, "a missing credential is still refused");
}

#[tokio::test]
async fn concurrent_requests_each_take_a_distinct_step() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    for status in [500, 502, 503, 504] {
        a.push(Step::ServerError(status));
    }
    let body = message_body(false);
    let replies = futures_util::future::join_all((0..6).map(|_| post_messages(&up, "k1", &body))).await;
    let mut statuses: Vec<u16> = replies.iter().map(|r| r.status().as_u16()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 500, 502, 503, 504]);
}
