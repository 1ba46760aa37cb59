//! What stands around the gateway in these tests: an upstream that streams a
//! script with silences, a slow OpenAI-compatible backend, a recording TCP
//! tap, and where the Claude Code CLI is.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A scripted Anthropic stream with silences: pings, an SSE comment, a
/// thinking and a text block, a `message_delta` with the stop reason, then
/// `message_stop` and a usage-only `message_delta` after it.
pub(super) const SCRIPTED_STREAM: &[&str] = &[
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    ": a comment the upstream sends\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQB\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":5}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null,\"stop_sequence\":null},\"usage\":{\"output_tokens\":6}}\n\n",
];

/// An upstream that answers every request with [`SCRIPTED_STREAM`], `gap`
/// between events, and the unified family on the head.
pub(super) async fn scripted_upstream(gap: Duration) -> String {
    use axum::response::IntoResponse;
    let app = axum::Router::new().fallback(move || async move {
        let stream = futures_util::stream::unfold(0usize, move |i| async move {
            let event = SCRIPTED_STREAM.get(i)?;
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(event.as_bytes())), i + 1))
        });
        let head = [
            (http::header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (http::HeaderName::from_static("request-id"), "req_stream"),
            (http::HeaderName::from_static("anthropic-ratelimit-unified-status"), "allowed"),
        ];
        (head, axum::body::Body::from_stream(stream)).into_response()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// An OpenAI-compatible backend whose stream waits `gap` between chunks.
pub(super) async fn slow_openai_backend(gap: Duration) -> String {
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || async move {
            let chunk = |delta: Value, finish: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
                )
            };
            let parts = vec![
                chunk(json!({"role":"assistant","content":""}), Value::Null),
                chunk(json!({"content":"from the "}), Value::Null),
                chunk(json!({"content":"fallback"}), Value::Null),
                chunk(json!({}), json!("stop")),
                "data: [DONE]\n\n".to_string(),
            ];
            let stream = futures_util::stream::unfold(parts.into_iter(), move |mut rest| async move {
                let next = rest.next()?;
                tokio::time::sleep(gap).await;
                Some((Ok::<_, std::io::Error>(next), rest))
            });
            ([(http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(stream)).into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Bytes that crossed a recording tap, per connection, one direction each.
#[derive(Default)]
pub(super) struct Taped {
    pub(super) to_gateway: Vec<Vec<u8>>,
    pub(super) to_client: Vec<Vec<u8>>,
}

/// A TCP tap on loopback in front of `target`: it records what each
/// connection carries both ways, byte for byte, and passes it on.
pub(super) async fn tap(target: String) -> (String, Arc<Mutex<Taped>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let taped = Arc::new(Mutex::new(Taped::default()));
    let t = taped.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = tokio::net::TcpStream::connect(&target).await.unwrap();
            let n = {
                let mut t = t.lock();
                t.to_gateway.push(Vec::new());
                t.to_client.push(Vec::new());
                t.to_gateway.len() - 1
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut ur, mut uw) = upstream.into_split();
            let (t1, t2) = (t.clone(), t.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(k) = cr.read(&mut buf).await {
                    if k == 0 || uw.write_all(&buf[..k]).await.is_err() {
                        break;
                    }
                    t1.lock().to_gateway[n].extend_from_slice(&buf[..k]);
                }
                let _ = uw.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(k) = ur.read(&mut buf).await {
                    if k == 0 || cw.write_all(&buf[..k]).await.is_err() {
                        break;
                    }
                    t2.lock().to_client[n].extend_from_slice(&buf[..k]);
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    (url, taped)
}

/// Where the Claude Code CLI is: `POOLGATE_CLAUDE`, else `claude` on the
/// PATH. test.sh installs it (npm) and sets `POOLGATE_REQUIRE_CLAUDE=1`, so in
/// CI its absence fails the test rather than skipping it.
pub(super) fn claude_cli() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("POOLGATE_CLAUDE") {
        return Some(p.into());
    }
    let on_path = std::process::Command::new("claude").arg("--version").output().is_ok_and(|o| o.status.success());
    on_path.then(|| "claude".into())
}
