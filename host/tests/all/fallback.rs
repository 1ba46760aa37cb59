//! Fallback backends through the real binary: a populated pool that cannot
//! serve (every account parked) answers through an OpenAI-compatible backend
//! — Messages JSON and stream, Chat Completions — with the marker header; the
//! fallback is never used while an account can serve, and an empty pool still
//! answers 503.

use crate::support;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::post;
use poolgate_chaos::fallback::Fallback;
use poolgate_mock_upstream::{MockUpstream, Step};
use serde_json::{Value, json};
use support::{Gateway, message};

/// Serves `app` on a fresh local port for the rest of the test; its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The chaos run's fallback backend: it answers "from the fallback", as JSON
/// or as a stream, counts what it was asked and keeps the last request.
async fn backend() -> Fallback {
    Fallback::start().await.unwrap()
}

/// A backend that fails every request (503), counting them.
async fn failing_backend() -> Fallback {
    let down = backend().await;
    down.set_failing(true);
    down
}

fn config(mock: &MockUpstream, backend: &str, accounts: bool) -> String {
    let mut s = String::from("[server]\nadmin_token_env = \"PG_ADMIN\"\n\n");
    if accounts {
        s.push_str(&format!(
            "[[accounts]]\nid = \"a\"\napi_key_env = \"KEY_A\"\nbase_url = \"{}\"\n\n",
            mock.base_url()
        ));
    }
    s.push_str(&format!(
        "[[fallback]]\nname = \"backup\"\nbase_url = \"{backend}\"\napi_key_env = \"FB_KEY\"\nmodel = \"gpt-backup\"\n"
    ));
    s
}

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("FB_KEY", "fallback-key"), ("PG_ADMIN", "fb-admin")]
}

async fn post_messages(gw: &Gateway, body: &Value) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_answers_through_the_fallback_never_while_an_account_serves() {
    let mock = MockUpstream::start().await;
    let fb = backend().await;
    let url = fb.url.clone();
    let gw = Gateway::start(&config(&mock, &url, true), &env());
    mock.account("key-a");
    // The account serves: the fallback is not asked.
    let r = post_messages(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-poolgate-fallback").is_none());
    assert_eq!(fb.asked(), 0);
    // Parked (a unified 429): Messages JSON through the backend, marked.
    mock.account("key-a").set_default(Step::RateLimited { unified: true, retry_after: None });
    let r = post_messages(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["model"], "claude-sonnet-4-5", "the client's model is named back");
    assert_eq!(v["content"][0]["text"], "from the fallback");
    assert_eq!(fb.last_request().unwrap()["model"], "gpt-backup", "the model is swapped");
    // A Claude Code–style stream through the backend, event by event.
    let r = post_messages(&gw, &message("claude-sonnet-4-5", true)).await;
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup");
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert!(text.contains("from the ") && text.contains("fallback") && text.contains("event: message_stop"), "{text}");
    // A Chat Completions client too.
    let r = Gateway::client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "from the fallback", "{v}");
    // The record and the metrics name it.
    let decisions = gw.admin_json("/admin/decisions?limit=1", "fb-admin").await;
    assert_eq!(decisions[0]["fallback"], "backup/gpt-backup", "{decisions}");
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).bearer_auth("fb-admin").send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("poolgate_fallback_total{backend=\"backup/gpt-backup\"} 3"), "{metrics}");
    // Its tokens, by the backend in place of an account: 5 in and 3, 2, 3 out.
    let tokens = "poolgate_tokens_total{account=\"fallback:backup/gpt-backup\",model=\"claude-sonnet-4-5\",kind=";
    assert!(metrics.contains(&format!("{tokens}\"input\"}} 15\n")), "{metrics}");
    assert!(metrics.contains(&format!("{tokens}\"output\"}} 8\n")), "{metrics}");
    // And /status, whose web page shows the fallback's use.
    let status = gw.admin_json("/status", "fb-admin").await;
    assert_eq!(status["fallback"], json!([{ "backend": "backup/gpt-backup", "served": 3 }]), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_still_answers_503_and_never_falls_back() {
    let mock = MockUpstream::start().await;
    let fb = backend().await;
    let url = fb.url.clone();
    let gw = Gateway::start(&config(&mock, &url, false), &env());
    let r = post_messages(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("x-poolgate-fallback").is_none());
    assert_eq!(fb.asked(), 0);
}

/// A backend that fails rests while the next one is tried; and once the
/// pool's account recovers from its cooldown, requests go back to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_rests_and_the_pool_takes_over_again_once_it_recovers() {
    let mock = MockUpstream::start().await;
    let fb = backend().await;
    let url = fb.url.clone();
    let down = failing_backend().await;
    let cfg = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[cooldowns]\ntransient_ms = 1000\n\n\
         [[accounts]]\nid = \"a\"\napi_key_env = \"KEY_A\"\nbase_url = \"{}\"\n\n\
         [[fallback]]\nname = \"down\"\nbase_url = \"{}\"\nmodel = \"m1\"\ncooldown_ms = 60000\n\n\
         [[fallback]]\nname = \"backup\"\nbase_url = \"{url}\"\napi_key_env = \"FB_KEY\"\nmodel = \"gpt-backup\"\n",
        mock.base_url(),
        down.url
    );
    let gw = Gateway::start(&cfg, &env());
    let a = mock.account("key-a");
    // A bare 429: a short (1 s) transient cooldown on the pool's only account.
    a.push(Step::RateLimited { unified: false, retry_after: None });
    let r = post_messages(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup", "the first backend is down: the next one");
    let r = post_messages(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup");
    assert_eq!(fb.asked(), 2);
    assert_eq!(down.asked(), 1, "the failed backend rests instead of being asked again");
    // The account's cooldown ends: the pool serves again, the fallback rests.
    support::eventually("the pool serves again", std::time::Duration::from_secs(10), async || {
        let r = post_messages(&gw, &message("claude-sonnet-4-5", false)).await;
        r.status() == 200 && r.headers().get("x-poolgate-fallback").is_none()
    })
    .await;
    assert_eq!(r_account(&gw).await, "a");
}

async fn r_account(gw: &Gateway) -> String {
    let r = post_messages(gw, &message("claude-sonnet-4-5", false)).await;
    r.headers().get("x-poolgate-account").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// A backend whose stream sends its first chunk, then nothing for a minute.
async fn stalling_backend() -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            let first = format!(
                "data: {}\n\n",
                json!({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"from the "},"finish_reason":null}]})
            );
            let stream = futures_util::stream::unfold(0, move |i| {
                let first = first.clone();
                async move {
                    if i > 0 {
                        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                    }
                    Some((Ok::<_, std::io::Error>(first), i + 1))
                }
            });
            ([(http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(stream)).into_response()
        }),
    );
    serve(app).await
}

/// A fallback backend's stream still open when the shutdown grace period
/// ends is cut like an account's: with Anthropic's `error` event saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_stream_open_at_the_end_of_the_grace_ends_with_an_error_event() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").set_default(Step::RateLimited { unified: true, retry_after: None });
    let url = stalling_backend().await;
    let mut gw = Gateway::start(&config(&mock, &url, true), &env());
    let r = post_messages(&gw, &message("claude-sonnet-4-5", true)).await;
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup");
    let reading = tokio::spawn(async move { r.text().await.unwrap() });
    // Ctrl-C, then a second one: the grace ends at once.
    gw.signal("INT");
    let seen = gw.wait_for_log("waiting for open requests and streams", std::time::Duration::from_secs(10)).await;
    assert!(seen, "{}", gw.log());
    gw.signal("INT");
    let text = tokio::time::timeout(std::time::Duration::from_secs(20), reading).await.unwrap().unwrap();
    assert!(text.contains("from the "), "{text}");
    assert!(text.trim_end().ends_with("shutdown grace period\"}}"), "{text}");
    let exit = tokio::task::spawn_blocking(move || gw.wait(std::time::Duration::from_secs(15))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()));
}

/// A backend whose stream sends its first chunk, then breaks (the
/// connection ends without the chunked terminator).
async fn breaking_backend() -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            let first = format!(
                "data: {}\n\n",
                json!({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"from the "},"finish_reason":null}]})
            );
            // The break comes after the head and the first chunk went out.
            let stream = futures_util::stream::unfold(0, move |i| {
                let first = first.clone();
                async move {
                    match i {
                        0 => Some((Ok(first), 1)),
                        1 => {
                            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                            Some((Err(std::io::Error::other("backend died")), 2))
                        }
                        _ => None,
                    }
                }
            });
            ([(http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(stream)).into_response()
        }),
    );
    serve(app).await
}

/// A substituted stream finishes when it ends, like an account's: whole, it
/// is recorded as `fallback`; broken half-way, the client reads an `error`
/// event (an OpenAI error chunk for a chat client) and the record says
/// `stream_error` — it is not taken for whole when its headers go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_stream_is_recorded_when_it_ends_whole_or_broken() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").set_default(Step::RateLimited { unified: true, retry_after: None });
    let url = backend().await.url;
    let gw = Gateway::start(&config(&mock, &url, true), &env());
    let last = async |gw: &Gateway| gw.admin_json("/admin/decisions?limit=1", "fb-admin").await[0].clone();
    let text = post_messages(&gw, &message("claude-sonnet-4-5", true)).await.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    let record = last(&gw).await;
    assert_eq!((record["outcome"].as_str(), record["status"].as_u64()), (Some("fallback"), Some(200)), "{record}");

    let broken = breaking_backend().await;
    let gw = Gateway::start(&config(&mock, &broken, true), &env());
    let r = post_messages(&gw, &message("claude-sonnet-4-5", true)).await;
    assert_eq!(r.headers()["x-poolgate-fallback"], "backup/gpt-backup");
    let text = r.text().await.unwrap();
    assert!(text.contains("from the "), "{text}");
    assert!(text.trim_end().ends_with("upstream stream interrupted (poolgate)\"}}"), "{text}");
    let record = last(&gw).await;
    assert_eq!(record["outcome"], "stream_error", "{record}");
    assert_eq!(record["fallback"], "backup/gpt-backup", "{record}");
    // The same backend to a chat client: an OpenAI error chunk, then [DONE].
    let r = Gateway::client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model":"claude-sonnet-4-5","stream":true,"messages":[{"role":"user","content":"hi"}]}))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(text.contains("\"error\"") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(last(&gw).await["outcome"], "stream_error");
}
