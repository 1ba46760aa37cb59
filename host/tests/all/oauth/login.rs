//! Logins that bring seats: `poolgate login`, `poolgate accounts import` of
//! Claude Code's credentials file, and an import that brings back a seat that
//! needs a login without a restart.

use super::*;

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
