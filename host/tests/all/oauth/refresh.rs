//! Tokens that stay alive: a pool served across several token lifetimes,
//! concurrent 401s that cause one refresh, a refused refresh token that asks
//! for a login, an outage of the token endpoint, a restart after the tokens
//! expired.

use super::*;

/// Two seats whose tokens live 2 s, refreshed 1 s before expiry: traffic
/// across five refreshes of each, every refresh token used once, and no
/// client request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_seats_lives_through_several_token_lifetimes_without_a_failed_request() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-pool");
    let seats =
        [seat(&mock, "acct-a", "a", Duration::from_secs(2)), seat(&mock, "acct-b", "b", Duration::from_secs(2))];
    for (id, s) in ["a", "b"].iter().zip(&seats) {
        support::write_credentials(&dir.0.join("seats").join(format!("{id}.json")), &s.issue());
    }
    let first_refresh = stored(&dir.0.join("seats/a.json"))["refresh_token"].clone();
    let cfg = config(&mock, &dir.0, &["a", "b"], "refresh_before_ms = 1000\ncheck_interval_ms = 100");
    let gw = start(&cfg, &dir.0);
    let stop = Arc::new(AtomicBool::new(false));
    let load = support::drive(&gw, stop.clone(), Duration::from_millis(20));
    support::eventually("five refreshes of each seat", Duration::from_secs(30), async || {
        mock.oauth().refreshes() >= 10
    })
    .await;
    stop.store(true, Ordering::Release);
    let statuses = load.await.unwrap();
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert!(statuses.len() >= 50, "only {} requests", statuses.len());
    assert_eq!(failed, 0, "{failed} of {} requests failed:\n{}", statuses.len(), gw.log());
    // Rotated on disk, and the seat's state shows it.
    let now = stored(&dir.0.join("seats/a.json"));
    assert_ne!(now["refresh_token"], first_refresh, "the rotated refresh token is stored");
    let st = status(&gw).await;
    let a = &account(&st, "a")["oauth"];
    assert!(a["refreshes"].as_u64() >= Some(2) && a["needs_login"] == false, "{a}");
    assert!(!gw.log().contains(now["access_token"].as_str().unwrap()), "a token reached the log");
    // Refreshes ran ahead of expiry: no answer was a 401.
    let unauthorized = mock.requests().iter().filter(|r| r.credential.is_empty()).count();
    assert_eq!(unauthorized, 0, "requests went out with an expired token");
}

/// The keeper never runs (a day between checks): the token expires under
/// traffic, eight concurrent requests meet the 401, one refresh serves them
/// all, and each is sent again on the same seat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_401s_cause_one_refresh_and_every_request_is_served() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-401");
    let s = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    support::write_credentials(&dir.0.join("seats/a.json"), &s.issue());
    let gw = start(&config(&mock, &dir.0, &["a"], "check_interval_ms = 86400000"), &dir.0);
    s.expire_access_tokens();
    let client = Gateway::client();
    let sends = (0..8).map(|_| support::send_message(&client, &gw.url, "claude-sonnet-4-5"));
    let answers = futures_util::future::join_all(sends).await;
    for r in answers {
        let r = r.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    assert_eq!(mock.oauth().refreshes(), 1, "one refresh for every request that met the 401");
    let metrics = client.get(format!("{}/metrics", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    let text = metrics.text().await.unwrap();
    assert!(text.contains("poolgate_oauth_refreshes_total{account=\"a\",result=\"renewed\"} 1"), "{text}");
}

/// A refresh token the endpoint refuses (`invalid_grant`) marks the seat
/// `needs_login`: the request fails over to the other seat, `/status` says
/// what to run, and a new login written to the file brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_refresh_token_asks_for_a_login_and_a_login_brings_the_seat_back() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-login");
    let (a, b) =
        (seat(&mock, "acct-a", "a", Duration::from_secs(3600)), seat(&mock, "acct-b", "b", Duration::from_secs(3600)));
    mock.account("acct-b").set_quota(Quota::unified(0.9, 0.9));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::write_credentials(&dir.0.join("seats/b.json"), &b.issue());
    let gw = start(&config(&mock, &dir.0, &["a", "b"], "check_interval_ms = 200"), &dir.0);
    a.revoke();
    a.expire_access_tokens();
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-account"], "b", "failed over to the other seat");
    let st = status(&gw).await;
    let oauth = &account(&st, "a")["oauth"];
    assert_eq!(oauth["needs_login"], true, "{oauth}");
    assert!(oauth["fix"].as_str().unwrap_or("").contains("poolgate login a"), "{oauth}");
    // It is not tried again while it needs a login.
    let before = mock.oauth().token_requests().len();
    for _ in 0..3 {
        let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
        assert_eq!(r.headers()["x-poolgate-account"], "b");
    }
    assert_eq!(mock.oauth().token_requests().len(), before, "no refresh loop on a refused token");
    // What an alert on a seat that needs a login, and on a shrinking pool, reads.
    let text = metrics(&gw).await;
    for line in [
        "poolgate_seat_needs_login{account=\"a\"} 1.0",
        "poolgate_seat_needs_login{account=\"b\"} 0.0",
        "poolgate_seats_needing_login{} 1.0",
        "poolgate_pool_usable_accounts{} 1.0",
        "poolgate_cooldowns_active{cause=\"disabled\"} 1.0",
        "poolgate_oauth_refreshes_total{account=\"a\",result=\"needs_login\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    // The operator logs in again: the keeper adopts the new file.
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::eventually("the new login is adopted", Duration::from_secs(10), async || {
        account(&status(&gw).await, "a")["oauth"]["needs_login"] == false
    })
    .await;
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "a"));
    let text = metrics(&gw).await;
    assert!(text.contains("poolgate_seat_needs_login{account=\"a\"} 0.0\n"), "{text}");
}

/// The token endpoint is down while a seat's token runs out: requests keep
/// being served by the other seat, the failing seat backs off instead of
/// hammering the endpoint, and it recovers once the endpoint is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_endpoint_outage_never_costs_a_request_while_another_seat_serves() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-outage");
    let (a, b) =
        (seat(&mock, "acct-a", "a", Duration::from_secs(2)), seat(&mock, "acct-b", "b", Duration::from_secs(3600)));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::write_credentials(&dir.0.join("seats/b.json"), &b.issue());
    mock.oauth().set_mode(TokenMode::Failing(503));
    let cfg = config(&mock, &dir.0, &["a", "b"], "refresh_before_ms = 1000\ncheck_interval_ms = 100");
    let gw = start(&cfg, &dir.0);
    let stop = Arc::new(AtomicBool::new(false));
    let load = support::drive(&gw, stop.clone(), Duration::from_millis(20));
    // Past a's expiry, with the endpoint failing all along.
    support::eventually("a's token expired", Duration::from_secs(10), async || {
        let st = status(&gw).await;
        let exp = account(&st, "a")["oauth"]["token_expires_at_ms"].as_u64().unwrap_or(u64::MAX);
        st["now_ms"].as_u64().unwrap_or(0) > exp + 1000
    })
    .await;
    let attempts = mock.oauth().token_requests().len();
    assert!(attempts <= 6, "{attempts} refresh attempts in ~3 s: no backoff");
    let st = status(&gw).await;
    assert!(account(&st, "a")["oauth"]["last_error"].as_str().is_some_and(|e| e.contains("503")), "{st}");
    mock.oauth().set_mode(TokenMode::Normal);
    support::eventually("a refreshes once the endpoint is back", Duration::from_secs(20), async || {
        mock.oauth().refreshes() >= 1
    })
    .await;
    stop.store(true, Ordering::Release);
    let statuses = load.await.unwrap();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "{:?}\n{}",
        statuses.iter().filter(|s| **s != 200).collect::<Vec<_>>(),
        gw.log()
    );
}

/// Stopped while its tokens expired: at start the gateway refreshes them
/// before it serves, so the first request after a restart is served without
/// meeting a 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_the_tokens_expired_heals_the_seats_before_serving() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-restart");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    let cfg = config(&mock, &dir.0, &["a"], "check_interval_ms = 86400000");
    let gw = start(&cfg, &dir.0);
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    drop(gw);
    // While it was down the token expired (and the file says so).
    a.expire_access_tokens();
    let mut c = stored(&dir.0.join("seats/a.json"));
    c["expires_at_ms"] = json!(1);
    std::fs::write(dir.0.join("seats/a.json"), c.to_string()).unwrap();
    mock.clear_requests();
    let gw = start(&cfg, &dir.0);
    assert_eq!(mock.oauth().refreshes(), 1, "healed before serving");
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(mock.requests().iter().all(|r| !r.credential.is_empty()), "a request met an expired token");
}
