//! The OAuth side: seats, the token endpoint (rotation, PKCE, modes), expiry on the API
//! routes, and the usage and profile routes.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{client, client_with_timeout, header, message_body};
use poolgate_mock_upstream::{
    Config, EXPIRED, Identity, MockUpstream, OAUTH_BETA, Quota, Seat, Step, TokenMode, Window, pkce_challenge,
};
use serde_json::{Value, json};

const CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";

fn seat(up: &MockUpstream, credential: &str, name: &str) -> Seat {
    up.oauth().seat(&up.account(credential), Identity::new(name))
}

/// `POST /v1/oauth/token` with a form body.
async fn token_form(up: &MockUpstream, form: &str) -> reqwest::Response {
    client()
        .post(format!("{}/v1/oauth/token", up.base_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.to_owned())
        .send()
        .await
        .unwrap()
}

/// `POST /v1/oauth/token` with a JSON body.
async fn token_json(up: &MockUpstream, body: &Value) -> reqwest::Response {
    client().post(format!("{}/v1/oauth/token", up.base_url())).json(body).send().await.unwrap()
}

async fn refresh(up: &MockUpstream, refresh_token: &str) -> reqwest::Response {
    token_form(up, &format!("grant_type=refresh_token&refresh_token={refresh_token}&client_id={CLIENT_ID}")).await
}

/// `POST /v1/messages` as Claude Code sends it with a subscription token.
async fn messages(up: &MockUpstream, access_token: &str) -> reqwest::Response {
    client()
        .post(format!("{}/v1/messages", up.base_url()))
        .bearer_auth(access_token)
        .header("anthropic-beta", OAUTH_BETA)
        .json(&message_body(false))
        .send()
        .await
        .unwrap()
}

/// `GET /api/oauth/<route>` with a bearer token and, if `beta`, the OAuth beta flag.
async fn oauth_get(up: &MockUpstream, route: &str, token: &str, beta: bool) -> reqwest::Response {
    let mut request = client().get(format!("{}/api/oauth/{route}", up.base_url())).bearer_auth(token);
    if beta {
        request = request.header("anthropic-beta", format!("claude-code-20250219,{OAUTH_BETA}"));
    }
    request.send().await.unwrap()
}

async fn status_and_json(r: reqwest::Response) -> (u16, Value) {
    (r.status().as_u16(), r.json().await.unwrap())
}

fn invalid_grant() -> Value {
    json!({"error": "invalid_grant", "error_description": "Refresh token not found or invalid"})
}

#[tokio::test]
async fn a_refresh_rotates_both_tokens_and_the_used_one_is_invalid_grant() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let login = seat.issue();
    assert_eq!(login.scopes, ["user:inference", "user:profile"]);

    let r = refresh(&up, &login.refresh_token).await;
    assert!(header(&r, "request-id").is_some_and(|id| id.starts_with("req_")));
    let (status, body) = status_and_json(r).await;
    assert_eq!(status, 200, "{body}");
    let identity = Identity::new("alice");
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3600);
    assert_eq!(body["scope"], "user:inference user:profile");
    assert_eq!(
        body["organization"],
        json!({"uuid": identity.organization_uuid, "name": "alice@example.com's Organization"})
    );
    assert_eq!(body["account"], json!({"uuid": identity.account_uuid, "email_address": "alice@example.com"}));
    let (access, next) = (body["access_token"].as_str().unwrap(), body["refresh_token"].as_str().unwrap());
    assert!(access.starts_with("sk-ant-oat01-") && next.starts_with("sk-ant-ort01-"));
    assert_ne!((access, next), (login.access_token.as_str(), login.refresh_token.as_str()));

    assert_eq!(status_and_json(refresh(&up, &login.refresh_token).await).await, (400, invalid_grant()));
    let json_refresh = json!({"grant_type": "refresh_token", "refresh_token": next, "client_id": CLIENT_ID});
    assert_eq!(token_json(&up, &json_refresh).await.status(), 200, "JSON bodies are accepted too");
    assert_eq!(token_json(&up, &json_refresh).await.status(), 400, "and rotate just the same");

    let oauth = up.oauth();
    assert_eq!(oauth.refreshes(), 2);
    let log = oauth.token_requests();
    let statuses: Vec<Option<u16>> = log.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Some(200), Some(400), Some(200), Some(400)]);
    assert!(log.iter().all(|r| r.grant_type == "refresh_token" && r.client_id.as_deref() == Some(CLIENT_ID)));
    assert!(log.iter().all(|r| r.seat.as_ref() == Some(&seat)), "a used token is still known as the seat's");
    assert!(log.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert!(up.requests().is_empty(), "token requests are not API traffic");
}

#[tokio::test]
async fn every_token_of_a_seat_answers_as_its_account_with_its_organization() {
    let up = MockUpstream::start().await;
    let account = up.account("acct-a");
    account.set_org("org-api-key");
    let seat = seat(&up, "acct-a", "alice");
    account.push(Step::Overloaded);
    let old = seat.issue();
    let (_, body) = status_and_json(refresh(&up, &old.refresh_token).await).await;
    let new = body["access_token"].as_str().unwrap();

    // One script, whichever token: the old one (valid until its own expiry) takes the
    // queued step, the new one the default.
    let first = messages(&up, &old.access_token).await;
    assert_eq!(first.status(), 529);
    assert_eq!(header(&first, "anthropic-organization-id"), Some(seat.identity().organization_uuid.as_str()));
    assert_eq!(messages(&up, new).await.status(), 200);
    let by_key = common::post_messages(&up, "acct-a", &message_body(false)).await;
    assert_eq!(header(&by_key, "anthropic-organization-id"), Some("org-api-key"), "API-key traffic keeps its org");
    assert_eq!(account.count(), 3);

    assert_eq!(up.served_by(), ["acct-a", "acct-a", "acct-a"]);
    let bearers: Vec<Option<String>> = up.requests().into_iter().map(|r| r.bearer).collect();
    assert_eq!(bearers, [Some(old.access_token.clone()), Some(new.to_owned()), None]);
}

#[tokio::test]
async fn an_expired_access_token_is_a_401_and_a_refreshed_one_works() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    seat.set_lifetime(Duration::from_secs(1));
    let login = seat.issue();
    assert_eq!(messages(&up, &login.access_token).await.status(), 200);

    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(login.expires_at_ms > now_ms && login.expires_at_ms <= now_ms + 1_000);
    tokio::time::sleep(Duration::from_millis(login.expires_at_ms - now_ms + 50)).await;
    let expired = messages(&up, &login.access_token).await;
    assert!(header(&expired, "request-id").is_some());
    let want = json!({"type": "error", "error": {"type": "authentication_error", "message": EXPIRED}});
    assert_eq!(status_and_json(expired).await, (401, want));

    let (status, body) = status_and_json(refresh(&up, &login.refresh_token).await).await;
    assert_eq!((status, &body["expires_in"]), (200, &json!(1)));
    assert_eq!(messages(&up, body["access_token"].as_str().unwrap()).await.status(), 200);

    assert_eq!(up.served_by(), ["acct-a", "", "acct-a"], "an expired token is nobody's request");
    assert_eq!(up.requests()[1].bearer.as_deref(), Some(login.access_token.as_str()));
    assert_eq!(up.account("acct-a").count(), 2, "the 401 took no step");
}

#[tokio::test]
async fn expiry_comes_before_accept_any_and_unknown_bearers_keep_todays_answer() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let login = seat.issue();
    seat.expire_access_tokens();
    assert_eq!(messages(&up, &login.access_token).await.status(), 401);
    let (status, body) = status_and_json(messages(&up, "sk-ant-oat01-never-issued").await).await;
    assert_eq!((status, body["error"]["message"].as_str()), (401, Some("invalid x-api-key")));

    let any = MockUpstream::start_with(Config { accept_any: true, ..Config::default() }).await;
    let seat = any.oauth().seat(&any.account("acct-a"), Identity::new("alice"));
    let login = seat.issue();
    seat.expire_access_tokens();
    let (_, body) = status_and_json(messages(&any, &login.access_token).await).await;
    assert_eq!(body["error"]["message"], EXPIRED, "not a fresh account");
    assert_eq!(messages(&any, "sk-ant-oat01-never-issued").await.status(), 200);
}

#[tokio::test]
async fn a_code_exchange_checks_pkce_and_is_good_once() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let verifier = "a-verifier-of-at-least-forty-three-characters-0123";
    let code = seat.code_for(&pkce_challenge(verifier));
    let exchange = |verifier: &str| {
        json!({"grant_type": "authorization_code", "code": code, "code_verifier": verifier, "state": "xyz",
               "redirect_uri": "http://localhost:54545/callback", "client_id": CLIENT_ID})
    };

    let (status, body) = status_and_json(token_json(&up, &exchange("the-wrong-verifier")).await).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")));
    let (status, body) = status_and_json(token_json(&up, &exchange(verifier)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["account"]["email_address"], "alice@example.com");
    assert_eq!(messages(&up, body["access_token"].as_str().unwrap()).await.status(), 200);
    assert_eq!(refresh(&up, body["refresh_token"].as_str().unwrap()).await.status(), 200);
    let (status, body) = status_and_json(token_json(&up, &exchange(verifier)).await).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")), "a code is single-use");

    // The same exchange as a form, with a percent-encoded redirect_uri.
    let code = seat.code_for(&pkce_challenge(verifier));
    let form = format!(
        "grant_type=authorization_code&code={code}&code_verifier={verifier}&client_id={CLIENT_ID}\
         &redirect_uri=http%3A%2F%2Flocalhost%3A54545%2Fcallback&state=xyz"
    );
    assert_eq!(token_form(&up, &form).await.status(), 200);

    let log = up.oauth().token_requests();
    let grants: Vec<(&str, Option<u16>)> = log.iter().map(|r| (r.grant_type.as_str(), r.status)).collect();
    let code = "authorization_code";
    let want =
        [(code, Some(400)), (code, Some(200)), ("refresh_token", Some(200)), (code, Some(400)), (code, Some(200))];
    assert_eq!(grants, want);
    assert_eq!(up.oauth().refreshes(), 1, "only refresh grants count as refreshes");
}

#[tokio::test]
async fn malformed_token_requests_are_invalid_request() {
    let up = MockUpstream::start().await;
    let login = seat(&up, "acct-a", "alice").issue();
    let rt = &login.refresh_token;
    let cases = [
        (format!("grant_type=password&client_id={CLIENT_ID}"), "Unsupported grant_type: password"),
        (format!("grant_type=refresh_token&client_id={CLIENT_ID}"), "Missing required parameter: refresh_token"),
        (format!("grant_type=refresh_token&refresh_token={rt}"), "Missing required parameter: client_id"),
        (format!("refresh_token={rt}&client_id={CLIENT_ID}"), "Missing required parameter: grant_type"),
        (
            format!("grant_type=authorization_code&code=c&client_id={CLIENT_ID}"),
            "Missing required parameter: code_verifier",
        ),
    ];
    for (form, description) in cases {
        let want = json!({"error": "invalid_request", "error_description": description});
        assert_eq!(status_and_json(token_form(&up, &form).await).await, (400, want), "{form}");
    }
    let broken = client()
        .post(format!("{}/v1/oauth/token", up.base_url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(status_and_json(broken).await.1["error"], "invalid_request");
    assert_eq!(refresh(&up, rt).await.status(), 200, "none of them spent the token");
    let grant_types: Vec<String> = up.oauth().token_requests().into_iter().map(|r| r.grant_type).collect();
    assert_eq!(
        grant_types,
        ["password", "refresh_token", "refresh_token", "", "authorization_code", "", "refresh_token"]
    );
}

#[tokio::test]
async fn a_failing_or_hanging_endpoint_changes_nothing() {
    let up = MockUpstream::start().await;
    let login = seat(&up, "acct-a", "alice").issue();
    let oauth = up.oauth();

    oauth.set_mode(TokenMode::Failing(503));
    let r = refresh(&up, &login.refresh_token).await;
    assert!(header(&r, "request-id").is_some());
    let (status, body) = status_and_json(r).await;
    assert_eq!(
        (status, body["type"].as_str(), body["error"]["type"].as_str()),
        (503, Some("error"), Some("api_error"))
    );

    oauth.set_mode(TokenMode::Hang);
    let impatient = client_with_timeout(Duration::from_millis(300));
    let form = format!("grant_type=refresh_token&refresh_token={}&client_id={CLIENT_ID}", login.refresh_token);
    let url = format!("{}/v1/oauth/token", up.base_url());
    let hung = impatient.post(&url).header("content-type", "application/x-www-form-urlencoded").body(form.clone());
    assert!(hung.send().await.unwrap_err().is_timeout());

    // A slow endpoint the client gives up on has not rotated anything either.
    oauth.set_mode(TokenMode::Slow(Duration::from_millis(600)));
    let slow = impatient.post(&url).header("content-type", "application/x-www-form-urlencoded").body(form);
    assert!(slow.send().await.unwrap_err().is_timeout());
    let started = Instant::now();
    assert_eq!(refresh(&up, &login.refresh_token).await.status(), 200, "the token survived every failure");
    assert!(started.elapsed() >= Duration::from_millis(600), "slow means slow");

    let statuses: Vec<Option<u16>> = oauth.token_requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Some(503), None, None, Some(200)]);
    assert_eq!(oauth.refreshes(), 1);
}

#[tokio::test]
async fn a_revoked_seat_must_log_in_again() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let login = seat.issue();
    seat.revoke();
    assert_eq!(status_and_json(refresh(&up, &login.refresh_token).await).await, (400, invalid_grant()));
    assert_eq!(messages(&up, &login.access_token).await.status(), 200, "access tokens live out their lifetime");
    assert_eq!(refresh(&up, &seat.issue().refresh_token).await.status(), 200, "a new login works");
}

#[tokio::test]
async fn usage_reports_the_seat_accounts_current_quota() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let mut quota = Quota::unified_at(0.25, 0.5, 1_795_003_199 - 5 * 3600);
    quota.buckets = vec![("opus".into(), Window::new(0.95, "allowed_warning", 1_795_003_199))];
    seat.account().set_quota(quota);
    let login = seat.issue();

    let (status, body) = status_and_json(oauth_get(&up, "usage", &login.access_token, true).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["five_hour"], json!({"utilization": 25, "resets_at": "2026-11-18T11:59:59Z"}));
    assert_eq!(body["seven_day"]["utilization"], 50);
    assert_eq!(
        body["limits"][2],
        json!({"kind": "weekly_scoped", "percent": 95, "severity": "warning", "resets_at": "2026-11-18T11:59:59Z",
               "is_active": true, "scope": {"model": {"display_name": "Opus"}}})
    );
    let kinds: Vec<&str> = body["limits"].as_array().unwrap().iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["session", "weekly_all", "weekly_scoped"]);

    seat.account().set_quota(Quota::unified(1.0, 0.5));
    let (_, body) = status_and_json(oauth_get(&up, "usage", &login.access_token, true).await).await;
    assert_eq!((&body["limits"][0]["percent"], &body["limits"][0]["severity"]), (&json!(100), &json!("critical")));
    assert_eq!(up.oauth().usage_requests(), 2);
    assert!(up.requests().is_empty(), "usage polls are not API traffic");
}

#[tokio::test]
async fn the_oauth_routes_need_the_beta_and_a_live_seat_token() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let login = seat.issue();
    for route in ["usage", "profile"] {
        let (status, body) = status_and_json(oauth_get(&up, route, &login.access_token, false).await).await;
        assert_eq!((status, body["error"]["type"].as_str()), (401, Some("authentication_error")), "{route}");
        let status = oauth_get(&up, route, "acct-a", true).await.status();
        assert_eq!(status, 401, "{route}: an account credential is not a seat token");
    }
    seat.expire_access_tokens();
    let (status, body) = status_and_json(oauth_get(&up, "usage", &login.access_token, true).await).await;
    assert_eq!((status, body["error"]["message"].as_str()), (401, Some(EXPIRED)));
    assert_eq!(up.oauth().usage_requests(), 3, "refused calls count too");
}

#[tokio::test]
async fn usage_can_be_rate_limited_per_token() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "alice");
    let (a, b) = (seat.issue(), seat.issue());
    up.oauth().set_usage_limit(Some(2));
    for _ in 0..2 {
        assert_eq!(oauth_get(&up, "usage", &a.access_token, true).await.status(), 200);
    }
    let limited = oauth_get(&up, "usage", &a.access_token, true).await;
    assert_eq!(limited.status(), 429);
    let retry_after: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after));
    assert_eq!(status_and_json(limited).await.1["error"]["type"], "rate_limit_error");
    assert_eq!(oauth_get(&up, "usage", &b.access_token, true).await.status(), 200, "another token has its own budget");
    up.oauth().set_usage_limit(None);
    assert_eq!(oauth_get(&up, "usage", &a.access_token, true).await.status(), 200);
}

#[tokio::test]
async fn the_profile_names_the_seat() {
    let up = MockUpstream::start().await;
    let seat = seat(&up, "acct-a", "bob");
    let id = Identity::new("bob");
    let r = oauth_get(&up, "profile", &seat.issue().access_token, true).await;
    let (status, body) = status_and_json(r).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&body["account"]["uuid"], &body["account"]["email"]),
        (&json!(id.account_uuid), &json!("bob@example.com"))
    );
    assert_eq!(
        body["organization"],
        json!({"uuid": id.organization_uuid, "name": "bob@example.com's Organization",
               "organization_type": "claude_max", "rate_limit_tier": "default_claude_max_5x"})
    );
}
