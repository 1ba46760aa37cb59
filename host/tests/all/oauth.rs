//! Subscription seats that stay alive, through the real binary and the mock's
//! OAuth authority (its token endpoint rotates single-use refresh tokens, its
//! API answers 401 to an expired access token): a pool served across several
//! token lifetimes on a compressed clock, concurrent 401s that cause one
//! refresh, a refused refresh token that asks for a login (and a login that
//! brings the seat back), an outage of the token endpoint, a restart after
//! the tokens expired, `poolgate login` and `poolgate accounts import`; and
//! seats that come back: a rotated pair a killed gateway left in its
//! temporary file, a seat demoted while its token is dead and its token
//! endpoint down, a Claude Code login imported after its access token
//! expired, refusals counted once; and a seat that forwards the client's own
//! identity headers, adding none.

use crate::bounded;
use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bounded::OutputWithin;
use poolgate_mock_upstream::{Identity, MockUpstream, Quota, Seat, TokenMode};
use serde_json::{Value, json};
use support::{Gateway, tempdir};

const ADMIN: &str = "oauth-admin";

fn stored(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A config of OAuth seats `ids` (credentials in `seats/<id>.json` of `dir`)
/// with the mock as API and token endpoint; `oauth` adds `[oauth]` keys.
fn config(mock: &MockUpstream, dir: &Path, ids: &[&str], oauth: &str) -> String {
    let base = mock.base_url();
    let mut s = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[oauth]\ntoken_url = \"{base}/v1/oauth/token\"\nusage_poll_ms = 0\n{oauth}\n\n"
    );
    for id in ids {
        let path = dir.join("seats").join(format!("{id}.json"));
        s.push_str(&format!(
            "[[accounts]]\nid = \"{id}\"\nkind = \"oauth\"\ncredentials = \"{}\"\nbase_url = \"{base}\"\n\n",
            path.display()
        ));
    }
    s
}

fn seat(mock: &MockUpstream, credential: &str, name: &str, lifetime: Duration) -> Seat {
    let account = mock.account(credential);
    account.set_quota(Quota::unified(0.2, 0.1));
    let seat = mock.oauth().seat(&account, Identity::new(name));
    seat.set_lifetime(lifetime);
    seat
}

async fn status(gw: &Gateway) -> Value {
    gw.admin_json("/status", ADMIN).await
}

fn account<'a>(st: &'a Value, id: &str) -> &'a Value {
    st["accounts"].as_array().and_then(|a| a.iter().find(|a| a["id"] == id)).unwrap_or(&Value::Null)
}

fn start(cfg: &str, dir: &Path) -> Gateway {
    let run = tempdir::Dir::new("oauth-run");
    let path = run.0.join("poolgate.toml");
    std::fs::write(&path, cfg).unwrap();
    let _ = dir;
    Gateway::start_file(&path, &[("PG_ADMIN", ADMIN)], run)
}

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
    // The operator logs in again: the keeper adopts the new file.
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::eventually("the new login is adopted", Duration::from_secs(10), async || {
        account(&status(&gw).await, "a")["oauth"]["needs_login"] == false
    })
    .await;
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "a"));
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

/// `poolgate login`: the authorize URL carries a PKCE challenge; the code
/// the page shows (`code#state`) is exchanged; the file is private and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poolgate_login_stores_a_seat_that_serves() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-cli");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    let cfg_path = dir.0.join("poolgate.toml");
    std::fs::write(&cfg_path, config(&mock, &dir.0, &["a"], "")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["login", "a", "--config"])
        .arg(&cfg_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    while !url.contains("code_challenge=") {
        url.clear();
        assert!(out.read_line(&mut url).unwrap() > 0, "no authorize URL printed");
    }
    let param = |name: &str| -> String {
        let start = url.find(&format!("{name}=")).unwrap() + name.len() + 1;
        url[start..].split(['&', '\n', ' ']).next().unwrap().to_string()
    };
    let code = a.code_for(&param("code_challenge"));
    writeln!(child.stdin.take().unwrap(), "{code}#{}", param("state")).unwrap();
    let pid = child.id();
    let waited =
        tokio::time::timeout(Duration::from_secs(30), tokio::task::spawn_blocking(move || child.wait_with_output()));
    let Ok(Ok(Ok(rest))) = waited.await else {
        // SAFETY-free cleanup: the child is ours; kill it so it cannot linger.
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        panic!("poolgate login did not finish within 30 s");
    };
    assert!(rest.status.success(), "{}", String::from_utf8_lossy(&rest.stderr));
    let file = dir.0.join("seats/a.json");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(stored(&file)["identity"]["organization"], json!(a.identity().organization_uuid));
    let gw = Gateway::start_file(&cfg_path, &[("PG_ADMIN", ADMIN)], tempdir::Dir::new("oauth-cli-run"));
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
}

/// `poolgate accounts import` takes Claude Code's own credentials file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_claude_code_login_serves() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-import");
    let a = seat(&mock, "acct-a", "a", Duration::from_secs(3600));
    let t = a.issue();
    let claude: PathBuf = dir.0.join("claude-credentials.json");
    let cc = json!({ "claudeAiOauth": { "accessToken": t.access_token, "refreshToken": t.refresh_token,
                     "expiresAt": t.expires_at_ms, "scopes": t.scopes, "subscriptionType": "max" } });
    std::fs::write(&claude, cc.to_string()).unwrap();
    let cfg_path = dir.0.join("poolgate.toml");
    std::fs::write(&cfg_path, config(&mock, &dir.0, &["a"], "")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["accounts", "import", "a", "--from"])
        .arg(&claude)
        .arg("--config")
        .arg(&cfg_path)
        .output_within(Duration::from_secs(30));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("stored the credentials of account `a`") && !printed.contains(&t.access_token),
        "{printed}"
    );
    let gw = Gateway::start_file(&cfg_path, &[("PG_ADMIN", ADMIN)], tempdir::Dir::new("oauth-import-run"));
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
}

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

/// Refresh-token grants the token endpoint answered with `status`.
fn refresh_answers(mock: &MockUpstream, status: u16) -> usize {
    mock.oauth().token_requests().iter().filter(|r| r.grant_type == "refresh_token" && r.status == Some(status)).count()
}

fn now_ms() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
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

/// `/metrics` (admin token).
async fn metrics(gw: &Gateway) -> String {
    let r = Gateway::client().get(format!("{}/metrics", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    r.text().await.unwrap()
}

/// The value of counter line `series` (`name{labels}`) in `text`, 0 if absent.
fn counter(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0)
}

/// Writes `tokens` as Claude Code's own credentials file, its access token
/// expiring at `expires_at_ms`.
fn write_claude_code(path: &Path, t: &poolgate_mock_upstream::Tokens, expires_at_ms: u64) {
    let cc = json!({ "claudeAiOauth": { "accessToken": t.access_token, "refreshToken": t.refresh_token,
                     "expiresAt": expires_at_ms, "scopes": t.scopes, "subscriptionType": "max" } });
    std::fs::write(path, cc.to_string()).unwrap();
}

/// `poolgate accounts import <account> --from <from> --config <config>`; its stdout.
fn import(account: &str, from: &Path, config: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["accounts", "import", account, "--from"])
        .arg(from)
        .arg("--config")
        .arg(config)
        .output_within(Duration::from_secs(30));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The morning after: a seat that needs a login is brought back, without a
/// restart, by `poolgate accounts import` of a Claude Code file whose access
/// token expired but whose refresh token is good. The running gateway trades
/// that refresh token once; an imported refresh token that is refused too is
/// tried once and never again; and the `needs_login` counter counts
/// refusals, not the 250 ms checks that find the seat still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_login_whose_access_token_expired_brings_a_seat_back_without_a_restart() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("oauth-revive");
    let (a, b) =
        (seat(&mock, "acct-a", "a", Duration::from_secs(3600)), seat(&mock, "acct-b", "b", Duration::from_secs(3600)));
    // b has less headroom: a is the head of the order whenever it can serve.
    mock.account("acct-b").set_quota(Quota::unified(0.9, 0.9));
    support::write_credentials(&dir.0.join("seats/a.json"), &a.issue());
    support::write_credentials(&dir.0.join("seats/b.json"), &b.issue());
    let cfg_path = dir.0.join("poolgate.toml");
    std::fs::write(&cfg_path, config(&mock, &dir.0, &["a", "b"], "check_interval_ms = 250")).unwrap();
    let gw = Gateway::start_file(&cfg_path, &[("PG_ADMIN", ADMIN)], tempdir::Dir::new("oauth-revive-run"));
    // Overnight: a's login is gone upstream and its access token expired.
    a.revoke();
    a.expire_access_tokens();
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "b"));
    let st = status(&gw).await;
    assert_eq!(account(&st, "a")["oauth"]["needs_login"], true, "{st}");
    assert!(account(&st, "a")["oauth"]["blocked"].as_str().is_some_and(|b| b.contains("login")), "{st}");
    // Six or so keeper checks (250 ms apart) find it still waiting: one
    // refusal, counted once, and nothing sent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let needs_login = "poolgate_oauth_refreshes_total{account=\"a\",result=\"needs_login\"}";
    assert_eq!(counter(&metrics(&gw).await, needs_login), 1, "one refusal, whatever the number of checks");
    assert_eq!(refresh_answers(&mock, 400), 1);

    // The operator imports a stale Claude Code file: its refresh token is
    // refused too. Tried once, counted once, never sent again.
    let stale = a.issue();
    a.revoke();
    let claude = dir.0.join("claude-credentials.json");
    write_claude_code(&claude, &stale, now_ms() - 8 * 3_600_000);
    import("a", &claude, &cfg_path);
    support::eventually("the stale import is tried", Duration::from_secs(10), async || {
        refresh_answers(&mock, 400) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(refresh_answers(&mock, 400), 2, "a refused refresh token is never sent twice");
    assert_eq!(counter(&metrics(&gw).await, needs_login), 2);
    assert_eq!(account(&status(&gw).await, "a")["oauth"]["needs_login"], true);

    // Then Claude Code's fresh login, the morning after: the access token
    // expired hours ago, the refresh token is good.
    let overnight = a.issue();
    a.expire_access_tokens();
    write_claude_code(&claude, &overnight, now_ms() - 8 * 3_600_000);
    let said = import("a", &claude, &cfg_path);
    assert!(said.contains("access token expired") && said.contains("at its next check"), "{said}");
    assert!(said.contains("must log in again"), "the import says the login is taken over: {said}");
    support::eventually("the imported pair is refreshed and the seat is back", Duration::from_secs(10), async || {
        account(&status(&gw).await, "a")["oauth"]["needs_login"] == false
    })
    .await;
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "a"), "{}", gw.log());
    // One refresh with the imported token, and no more.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(mock.oauth().refreshes(), 1, "the imported refresh token was traded once");
    assert_eq!(refresh_answers(&mock, 400), 2, "no refresh token was sent twice");
    let text = metrics(&gw).await;
    assert_eq!(counter(&text, needs_login), 2, "{text}");
    assert_eq!(counter(&text, "poolgate_oauth_refreshes_total{account=\"a\",result=\"renewed\"}"), 1, "{text}");
    let now = stored(&dir.0.join("seats/a.json"));
    assert_ne!(now["refresh_token"], json!(overnight.refresh_token), "the rotated pair is stored");
    assert_eq!(now["identity"]["organization"], json!(a.identity().organization_uuid));
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
