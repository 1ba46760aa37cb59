//! Seats that come back after a crash or an outage: a kill during a refresh
//! loses nothing, a rotated pair left in the temporary file is recovered, and
//! a seat whose token expired while its token endpoint was down is demoted
//! until a refresh succeeds.

use super::*;

/// Killed (SIGKILL) in the middle of a refresh: the credentials file is whole
/// and still holds the pair that was in use, so the restarted gateway
/// refreshes with it and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_refresh_loses_nothing() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-crash");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    let before = stored(&dir.0.join("seats/a.json"));
    let cfg = config(&mock, &dir.0, &["a"], "check_interval_ms = 86400000");
    let gw = start(&cfg, &dir.0);
    // The next request meets a 401 and refreshes, slowly; kill it mid-way.
    mock.oauth().set_mode(TokenMode::Slow(Duration::from_secs(3)));
    a.expire_access_tokens();
    let url = gw.url.clone();
    let pending =
        tokio::spawn(async move { support::send_message(&Gateway::client(), &url, "claude-sonnet-4-5").await });
    support::eventually("the refresh is under way", Duration::from_secs(5), async || {
        mock.oauth().token_requests().iter().any(|r| r.grant_type == "refresh_token")
    })
    .await;
    let _ = Command::new("kill").arg("-9").arg(gw.pid().to_string()).status();
    let _ = pending.await;
    drop(gw);
    assert_eq!(stored(&dir.0.join("seats/a.json")), before, "the file is whole and unchanged");
    // Restarted, it refreshes with the pair it had and serves.
    mock.oauth().set_mode(TokenMode::Normal);
    let gw = start(&cfg, &dir.0);
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200, "{}", gw.log());
    assert_ne!(stored(&dir.0.join("seats/a.json"))["refresh_token"], before["refresh_token"], "rotated and stored");
}
/// Kill -9 between writing the rotated pair to the temporary file and the
/// rename: the old file's refresh token is spent upstream, the new pair is
/// only in `.a.json.<pid>.tmp`. At start the gateway recovers it and serves;
/// a leftover cut short, or older than the file, is not recovered (and is
/// removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_pair_left_in_the_temporary_file_by_a_killed_gateway_is_recovered_at_start() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-leftover");
    let (a, b) =
        (seat(&mock, "acct-a", "a", Duration::from_secs(3600)), seat(&mock, "acct-b", "b", Duration::from_secs(3600)));
    let (file_a, file_b) = (dir.0.join("seats/a.json"), dir.0.join("seats/b.json"));
    support::write_credentials(&file_a, &a.issue());
    support::write_credentials(&file_b, &b.issue());
    let cfg = config(&mock, &dir.0, &["a", "b"], "check_interval_ms = 86400000");
    let gw = start(&cfg, &dir.0);
    let killed = gw.pid();
    // The refresh a's gateway did just before it died: the old refresh token
    // is spent at the token endpoint ...
    let old = stored(&file_a);
    let form = format!(
        "grant_type=refresh_token&refresh_token={}&client_id=9d1c250a-e61b-44d9-88ed-5944d1962f5e",
        old["refresh_token"].as_str().unwrap()
    );
    let answer: Value = Gateway::client()
        .post(format!("{}/v1/oauth/token", mock.base_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // ... and the new pair written to the temporary file, the way the store
    // writes it, when kill -9 came.
    let _ = Command::new("kill").arg("-9").arg(killed.to_string()).status();
    drop(gw);
    let rotated = json!({
        "access_token": answer["access_token"], "refresh_token": answer["refresh_token"],
        "expires_at_ms": now_ms() + answer["expires_in"].as_u64().unwrap() * 1000,
        "scopes": ["user:inference"], "identity": {}, "obtained_at_ms": now_ms(),
    });
    let leftover_a = dir.0.join(format!("seats/.a.json.{killed}.tmp"));
    std::fs::write(&leftover_a, serde_json::to_vec_pretty(&rotated).unwrap()).unwrap();
    // The main file says the old token has expired, so a gateway that missed
    // the leftover would refresh with the spent token at start.
    let mut expired = old.clone();
    expired["expires_at_ms"] = json!(1);
    std::fs::write(&file_a, expired.to_string()).unwrap();
    // b: a leftover cut short mid-write, and one older than the file.
    let b_before = stored(&file_b);
    let mut whole = b_before.clone();
    whole["refresh_token"] = json!("sk-ant-ort01-older");
    whole["obtained_at_ms"] = json!(1);
    let text = serde_json::to_vec_pretty(&whole).unwrap();
    let mut newer_b = b_before.clone();
    newer_b["obtained_at_ms"] = json!(now_ms());
    std::fs::write(&file_b, newer_b.to_string()).unwrap();
    let b_before = stored(&file_b);
    let cut = dir.0.join(format!("seats/.b.json.{killed}.tmp"));
    std::fs::write(&cut, &text[..text.len() / 2]).unwrap();
    let older = dir.0.join("seats/.b.json.999999999.tmp");
    std::fs::write(&older, &text).unwrap();
    let refreshes = mock.oauth().refreshes();

    let gw = start(&cfg, &dir.0);
    assert_eq!(stored(&file_a), rotated, "the rotated pair is the credentials file now");
    assert!(!leftover_a.exists() && !cut.exists() && !older.exists(), "no leftover remains");
    assert_eq!(stored(&file_b), b_before, "b's file is untouched");
    assert_eq!(mock.oauth().refreshes(), refreshes, "nothing needed a refresh at start");
    assert_eq!(refresh_answers(&mock, 400), 0, "the spent refresh token was never sent");
    let log = gw.log();
    assert!(log.contains("recovered") && log.contains(".a.json."), "{log}");
    assert!(!log.contains(answer["refresh_token"].as_str().unwrap()), "a token reached the log");
    mock.account("acct-b").set_quota(Quota::unified(0.9, 0.9));
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "a"), "{log}");
    assert_eq!(
        mock.requests().last().and_then(|r| r.bearer.clone()),
        answer["access_token"].as_str().map(String::from)
    );
}

/// The token endpoint is down while the head seat's access token expires:
/// the seat is taken out of the order at once (no request is sent with the
/// dead token to meet a 401), `/status` says why, and it serves again by
/// itself once the endpoint is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_whose_token_expired_while_its_token_endpoint_is_down_is_demoted_until_a_refresh_succeeds() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-demote");
    let (a, b) =
        (seat(&mock, "acct-a", "a", Duration::from_secs(2)), seat(&mock, "acct-b", "b", Duration::from_secs(3600)));
    mock.account("acct-b").set_quota(Quota::unified(0.9, 0.9));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::write_credentials(&dir.0.join("seats/b.json"), &b.issue());
    mock.oauth().set_mode(TokenMode::Failing(503));
    let cfg =
        config(&mock, &dir.0, &["a", "b"], "refresh_before_ms = 1000\ncheck_interval_ms = 100\nmax_backoff_ms = 1000");
    let gw = start(&cfg, &dir.0);
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.headers()["x-poolgate-account"], "a", "a heads the order while its token lives");
    support::eventually("a's token expired", Duration::from_secs(10), async || {
        let st = status(&gw).await;
        let exp = account(&st, "a")["oauth"]["token_expires_at_ms"].as_u64().unwrap_or(u64::MAX);
        st["now_ms"].as_u64().unwrap_or(0) > exp
    })
    .await;
    mock.clear_requests();
    for _ in 0..5 {
        let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
        assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "b"));
    }
    let dead = mock.requests().iter().filter(|r| r.credential.is_empty()).count();
    assert_eq!(dead, 0, "a request went out with the expired token:\n{}", gw.log());
    let st = status(&gw).await;
    let a_status = account(&st, "a");
    assert_eq!(a_status["cooldown"]["reason"], "upstream_error", "{a_status}");
    let why = a_status["oauth"]["blocked"].as_str().unwrap_or_default();
    assert!(why.contains("expired") && why.contains("503"), "{a_status}");
    mock.oauth().set_mode(TokenMode::Normal);
    support::eventually("a refreshes and serves again", Duration::from_secs(20), async || {
        let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
        r.headers()["x-poolgate-account"] == "a"
    })
    .await;
    let a_status = account(&status(&gw).await, "a").clone();
    assert!(a_status["cooldown"].is_null() && a_status["oauth"]["blocked"].is_null(), "{a_status}");
}

/// A token endpoint that takes seconds: the request that met the seat's 401
/// waits `request_wait_ms` for the refresh, then fails over to the other
/// seat; the refresh goes on without it, lands, and the seat serves again
/// with its new pair — a request leaving never cuts a refresh short (its
/// refresh token is single-use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_request_wait_ms_for_a_slow_refresh_then_fails_over_while_it_lands() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-wait");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    let b = seat(&mock, "acct-b", "b", Duration::from_secs(3600));
    // b has less left: every request goes to a while a can serve.
    mock.account("acct-b").set_quota(Quota::unified(0.8, 0.7));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::write_credentials(&dir.0.join("seats/b.json"), &b.issue());
    let oauth = "check_interval_ms = 86400000\nrequest_wait_ms = 300";
    let gw = start(&config(&mock, &dir.0, &["a", "b"], oauth), &dir.0);
    let served = async || {
        let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
        (r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap().to_string())
    };
    // Once the gateway has read both seats' quota (an unread seat is tried
    // to read it), a serves.
    support::eventually("both are read and a serves", Duration::from_secs(5), async || {
        let both = served().await.1 != served().await.1;
        both && served().await == (200, "a".to_string()) && served().await == (200, "a".to_string())
    })
    .await;
    let before = stored(&dir.0.join("seats/a.json"))["refresh_token"].clone();
    mock.oauth().set_mode(TokenMode::Slow(Duration::from_secs(3)));
    a.expire_access_tokens();
    let sent = poolgate::clock::machine_instant();
    assert_eq!(served().await, (200, "b".to_string()), "failed over to the other seat");
    let waited = sent.elapsed();
    assert!(waited < Duration::from_millis(2_500), "waited {waited:?}, not the 3 s refresh");
    assert_eq!(refresh_answers(&mock, 200), 0, "the refresh was still under way");
    support::eventually("the refresh lands without the request", Duration::from_secs(10), async || {
        refresh_answers(&mock, 200) == 1
    })
    .await;
    mock.oauth().set_mode(TokenMode::Normal);
    let st = status(&gw).await;
    assert_eq!(account(&st, "a")["oauth"]["needs_login"], false, "{st}");
    support::eventually("the new pair is stored", Duration::from_secs(5), async || {
        stored(&dir.0.join("seats/a.json"))["refresh_token"] != before
    })
    .await;
    support::eventually("the refreshed seat serves again", Duration::from_secs(5), async || {
        served().await == (200, "a".to_string())
    })
    .await;
    assert_eq!(refresh_answers(&mock, 200), 1, "one refresh, kept");
}
