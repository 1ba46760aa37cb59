//! Which subscription a seat is: a re-login to another identity drops the old
//! one's readings, two ids of one subscription share their quota, idle seats
//! are polled for usage, and a seat forwards the client's own identity
//! headers, adding none.

use super::*;

/// A re-login to another subscription under the same account id: what was
/// learned about the old identity (its windows, its Opus gate) is dropped
/// once the new identity answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_to_another_identity_does_not_inherit_the_old_ones_readings() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-identity");
    let old = seat(&mock, "acct-old", "old", Duration::from_secs(3600));
    let mut spent = Quota::unified(0.9, 0.5);
    spent.buckets = vec![(
        "opus".into(),
        poolgate_mock_upstream::Window::new(1.0, "rejected", poolgate_mock_upstream::now_s() + 86_400),
    )];
    mock.account("acct-old").set_quota(spent);
    let new = seat(&mock, "acct-new", "new", Duration::from_secs(3600));
    support::write_credentials(&dir.0.join("seats/a.json"), &old.issue());
    let gw = start(&config(&mock, &dir.0, &["a"], "check_interval_ms = 100"), &dir.0);
    support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    let st = status(&gw).await;
    assert_eq!(account(&st, "a")["organization_id"], json!(old.identity().organization_uuid));
    assert!(account(&st, "a")["model_gates"].to_string().contains("opus"), "{st}");
    // The operator logs in to another subscription under the same id.
    support::write_credentials(&dir.0.join("seats/a.json"), &new.issue());
    support::eventually("the new login is adopted", Duration::from_secs(10), async || {
        support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.is_ok_and(|r| r.status() == 200)
            && account(&status(&gw).await, "a")["organization_id"] == json!(new.identity().organization_uuid)
    })
    .await;
    let a = account(&status(&gw).await, "a").clone();
    assert_eq!(a["model_gates"], json!([]), "the old identity's gate is not the new one's: {a}");
    let five = a["windows"].as_array().unwrap().iter().find(|w| w["name"] == "5h").unwrap().clone();
    assert_eq!(five["utilization"], json!(0.2), "the new identity's reading: {a}");
}

/// Two account ids that are one subscription (one organization): `/status`
/// says so, and one account's reading applies to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ids_of_one_subscription_share_their_quota() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-shared");
    let account = mock.account("acct-shared");
    account.set_quota(Quota::unified(0.7, 0.3));
    let (a, b) = (mock.oauth().seat(&account, Identity::new("one")), mock.oauth().seat(&account, Identity::new("one")));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::write_credentials(&dir.0.join("seats/b.json"), &b.issue());
    let gw = start(&config(&mock, &dir.0, &["a", "b"], ""), &dir.0);
    // One request each, so both have told their organization.
    for _ in 0..2 {
        support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    }
    account.set_quota(Quota::unified(0.95, 0.3));
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    let served = r.headers()["x-poolgate-account"].to_str().unwrap().to_string();
    let other = if served == "a" { "b" } else { "a" };
    let st = status(&gw).await;
    assert_eq!(account_of(&st, &served)["same_subscription_as"], json!([other]), "{st}");
    let five = |id: &str| {
        account_of(&st, id)["windows"].as_array().unwrap().iter().find(|w| w["name"] == "5h").unwrap()["utilization"]
            .clone()
    };
    assert_eq!(five(other), json!(0.95), "the reading {served} got applies to {other} too");
}

fn account_of<'a>(st: &'a Value, id: &str) -> &'a Value {
    account(st, id)
}

/// An idle seat is polled at `/api/oauth/usage` (at start, before it served),
/// so it is ranked on real data; an answer billed as extra usage rests the
/// seat (`overage = "avoid"`) and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_seats_are_polled_for_usage_and_overage_answers_rest_the_seat() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-usage");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    mock.account("acct-a").set_quota(Quota::unified(0.64, 0.3));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    let cfg = config(&mock, &dir.0, &["a"], "").replace("usage_poll_ms = 0", "usage_poll_ms = 60000");
    let gw = start(&cfg, &dir.0);
    let st = status(&gw).await;
    let five = account(&st, "a")["windows"].as_array().and_then(|w| w.iter().find(|w| w["name"] == "5h")).cloned();
    assert_eq!(five.map(|w| w["utilization"].clone()), Some(json!(0.64)), "polled before serving: {st}");
    assert_eq!(mock.oauth().usage_requests(), 1);
    assert_eq!(mock.requests().len(), 0, "no message was spent to learn it");
    // An answer billed as extra usage.
    let mut overage = Quota::unified(0.5, 0.3);
    overage.representative_claim = Some("overage".into());
    mock.account("acct-a").set_quota(overage);
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    let st = status(&gw).await;
    assert_eq!(account(&st, "a")["cooldown"]["reason"], "overage", "{st}");
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert!(metrics.text().await.unwrap().contains("poolgate_overage_answers_total{account=\"a\",result=\"avoid\"} 1"));
}

/// poolgate never dresses one client as another: through a subscription seat,
/// the client's `user-agent` arrives as sent, and no `x-app`, `user-agent`
/// or `x-stainless-*` header is added for a client that sent none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_forwards_the_clients_own_identity_and_adds_none() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-identity-headers");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    let gw = start(&config(&mock, &dir.0, &["a"], ""), &dir.0);
    let client = Gateway::client();
    let send = |ua: Option<&'static str>| {
        let mut r = client
            .post(format!("{}/v1/messages", gw.url))
            .header("anthropic-version", "2023-06-01")
            .json(&support::message("claude-sonnet-4-5", false));
        if let Some(ua) = ua {
            r = r.header("user-agent", ua);
        }
        r.send()
    };
    assert_eq!(send(Some("my-tool/2.1")).await.unwrap().status(), 200);
    assert_eq!(send(None).await.unwrap().status(), 200);
    let seen = mock.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("user-agent"), Some("my-tool/2.1"));
    for r in &seen {
        assert_eq!(r.credential, "acct-a", "served by the seat");
        assert!(r.header("x-app").is_none(), "{:?}", r.headers);
        assert!(!r.headers.iter().any(|(n, _)| n.starts_with("x-stainless")), "{:?}", r.headers);
        assert!(!String::from_utf8_lossy(&r.body).contains("Claude Code"), "a system prompt was added");
    }
    assert_eq!(seen[1].header("user-agent"), None, "no user-agent was made up: {:?}", seen[1].headers);
}
