//! Fallback backends: when the pool is populated but cannot serve — every
//! account parked or cooling, or every attempt failed before its first byte —
//! the request goes to the first `[[fallback]]` backend that answers, an
//! OpenAI-compatible Chat Completions endpoint, with the model swapped.
//!
//! Never silently: every substituted answer carries `x-poolgate-fallback:
//! <name>/<model>`, its record names the backend and `poolgate_fallback_total`
//! counts it. Never while an account can serve (this runs only where the
//! gateway would otherwise answer a 429/502/503 itself), and never for an
//! empty pool, which is a configuration problem a fallback would hide. The
//! request is Messages-shaped here (a Chat Completions client's was translated
//! on the way in), so it is translated to Chat Completions for the backend and
//! its answer back — a stream event by event — by `poolgate_wire::openai`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full};
use poolgate_wire::openai::{self, MessagesStream};

use crate::config::FallbackConfig;
use crate::https::HttpsClient;

/// One configured backend, with its key and its rest after a failure.
pub struct Backend {
    /// Its configuration.
    pub config: FallbackConfig,
    key: Option<HeaderValue>,
    resting_until_ms: AtomicU64,
}

/// The backends of one generation, in order, and the client they share.
pub struct Fallbacks {
    backends: Vec<Backend>,
    http: Option<HttpsClient>,
    /// A `ping` after this much silence in a translated stream
    /// (`gateway.stream_keepalive_ms`).
    keepalive: Option<Duration>,
}

impl Fallbacks {
    /// The backends of `configs`, their keys read from the environment now;
    /// `keepalive`: a `ping` after that much silence in a translated stream.
    pub fn new(configs: &[FallbackConfig], keepalive: Option<Duration>) -> anyhow::Result<Fallbacks> {
        let mut backends = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let key = match &c.api_key_env {
                Some(var) => {
                    let v = std::env::var(var).map_err(|_| {
                        anyhow::anyhow!("fallback[{i}].api_key_env: environment variable {var} is not set")
                    })?;
                    let mut h = HeaderValue::from_str(&format!("Bearer {}", v.trim()))
                        .map_err(|_| anyhow::anyhow!("fallback[{i}].api_key_env: not a usable key"))?;
                    h.set_sensitive(true);
                    Some(h)
                }
                None => None,
            };
            crate::config::base_prefix(&c.base_url).map_err(|e| anyhow::anyhow!("fallback[{i}].base_url: {e}"))?;
            backends.push(Backend { config: c.clone(), key, resting_until_ms: AtomicU64::new(0) });
        }
        let http = if backends.is_empty() { None } else { Some(crate::https::client(Duration::from_secs(10))?) };
        Ok(Fallbacks { backends, http, keepalive })
    }

    /// Whether any backend is configured.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Serves the Messages request `body` through the first backend that
    /// answers 2xx; `None` when none does. The response carries the marker
    /// header; the second value names the backend for the record.
    /// `cut` resolves when the shutdown grace period ends: a translated stream
    /// still open then ends with an SSE `error` event.
    pub async fn serve(
        &self,
        body: &Bytes,
        timeout: Duration,
        cut: impl Fn() -> super::chat::OnCut,
        clock: &crate::clock::Clock,
    ) -> Option<(Response, String)> {
        let http = self.http.as_ref()?;
        let request: serde_json::Value = serde_json::from_slice(body).ok()?;
        let client_model = request.get("model").and_then(|m| m.as_str()).unwrap_or("").to_string();
        for b in &self.backends {
            let now = clock.now_ms();
            if b.resting_until_ms.load(Ordering::Acquire) > now {
                continue;
            }
            let marker = format!("{}/{}", b.config.name, b.config.model);
            match b.ask(http, &request, &client_model, timeout, self.keepalive, cut()).await {
                Ok(mut r) => {
                    if let Ok(v) = HeaderValue::from_str(&marker) {
                        r.headers_mut().insert("x-poolgate-fallback", v);
                    }
                    tracing::warn!(backend = %marker, "the pool could not serve: answered by a fallback backend");
                    return Some((r, marker));
                }
                Err(why) => {
                    b.resting_until_ms.store(now + b.config.cooldown_ms, Ordering::Release);
                    tracing::warn!(backend = %marker, error = %why, "fallback backend failed; resting it");
                }
            }
        }
        None
    }
}

impl Backend {
    /// One try: the request translated, sent, and the answer translated back.
    async fn ask(
        &self,
        http: &HttpsClient,
        request: &serde_json::Value,
        client_model: &str,
        timeout: Duration,
        keepalive: Option<Duration>,
        cut: super::chat::OnCut,
    ) -> Result<Response, String> {
        let chat = openai::messages_to_chat_request(request, &self.config.model)?;
        let url = format!("{}/v1/chat/completions", self.config.base_url.trim_end_matches('/'));
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT_ENCODING, "identity");
        if let Some(k) = &self.key {
            builder = builder.header(header::AUTHORIZATION, k.clone());
        }
        let req = builder.body(Full::new(Bytes::from(chat.to_string()))).map_err(|e| e.to_string())?;
        let response = match tokio::time::timeout(timeout, http.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(format!("{e}")),
            Err(_) => return Err(format!("no answer within {} ms", timeout.as_millis())),
        };
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if sse {
            let mut stream = MessagesStream::new(client_model);
            let mut body = response.into_body().into_data_stream();
            let keepalive = keepalive.map(|every| (every, super::chat::ANTHROPIC_PING));
            let cut = Some((cut, super::errors::STREAM_SHUTDOWN_EVENT));
            let translated = super::chat::async_stream_lines(keepalive, cut, move |tx| async move {
                while let Some(Ok(chunk)) = body.next().await {
                    for line in stream.feed(&chunk) {
                        if tx.send(line).await.is_err() {
                            return;
                        }
                    }
                }
                for line in stream.finish() {
                    let _ = tx.send(line).await;
                }
            });
            let mut r = Response::new(translated);
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            return Ok(r);
        }
        let bytes = tokio::time::timeout(timeout, response.into_body().collect())
            .await
            .map_err(|_| "the answer did not arrive in time".to_string())?
            .map_err(|e| e.to_string())?
            .to_bytes();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
        let mut r = Response::new(Body::from(openai::chat_to_messages_answer(&answer, client_model).to_string()));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(r)
    }
}
