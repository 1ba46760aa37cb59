//! The fallback backend of a chaos run (and of the fallback tests): an
//! OpenAI-compatible Chat Completions server that answers "from the
//! fallback", as JSON or as a stream, or fails every request (503) while told
//! to; it counts what it was asked and keeps the last request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use parking_lot::Mutex;
use serde_json::{Value, json};

/// A running fallback backend.
#[derive(Clone)]
pub struct Fallback {
    /// Its base URL.
    pub url: String,
    failing: Arc<AtomicBool>,
    asked: Arc<AtomicU64>,
    last: Arc<Mutex<Option<Value>>>,
}

impl Fallback {
    /// Starts one on a free loopback port.
    pub async fn start() -> std::io::Result<Fallback> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (failing, asked) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let last = Arc::new(Mutex::new(None));
        let (f, a, l) = (failing.clone(), asked.clone(), last.clone());
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |body: axum::Json<Value>| {
                let (f, a, l) = (f.clone(), a.clone(), l.clone());
                async move {
                    a.fetch_add(1, Ordering::Relaxed);
                    *l.lock() = Some(body.0.clone());
                    if f.load(Ordering::Relaxed) {
                        return (StatusCode::SERVICE_UNAVAILABLE, "the fallback is down").into_response();
                    }
                    answer(&body.0)
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Fallback { url, failing, asked, last })
    }

    /// Makes it fail (503) or answer.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Whether it fails now.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Requests it received.
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }

    /// The last request it received (its JSON body).
    pub fn last_request(&self) -> Option<Value> {
        self.last.lock().clone()
    }
}

fn answer(body: &Value) -> Response {
    let model = body["model"].as_str().unwrap_or("").to_string();
    if body["stream"] == json!(true) {
        let chunk = |delta: Value, finish: Value| {
            let c = json!({"id": "fb1", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            format!("data: {c}\n\n")
        };
        let usage = json!({"id": "fb1", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}});
        let body = [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"content": "from the "}), Value::Null),
            chunk(json!({"content": "fallback"}), Value::Null),
            chunk(json!({}), json!("stop")),
            format!("data: {usage}\n\n"),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        return ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    }
    axum::Json(json!({"id": "fb1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "from the fallback"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}))
    .into_response()
}
