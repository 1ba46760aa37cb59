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
//!
//! A backend is a [`Target`] of the gateway's one [`Transport`]: the same
//! client, connect and header timeouts as the accounts, its key resolved with
//! the rest of the config's secrets. What it answers is handed back to the
//! request's phases ([`Substitute`]), which relay it and finish the request
//! when it ends — a stream that breaks half-way is recorded as broken.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri, header};
use poolgate_wire::openai::{self, MessagesStream};

use super::body::Translate;
use super::upstream::{Rest, Target, Transport, body_stream};
use crate::config::FallbackConfig;
use crate::config::ResolvedFallback;

/// One configured backend, where it is and its rest after a failure.
pub struct Backend {
    /// Its configuration.
    pub config: FallbackConfig,
    target: Target,
    resting_until_ms: AtomicU64,
}

/// The backends of one generation, in order.
pub struct Fallbacks {
    backends: Vec<Backend>,
}

/// A backend's answer, in Anthropic's shape.
pub enum Substitute {
    /// A JSON answer, read whole and translated: a Messages answer's body.
    Whole(Bytes),
    /// An event stream, translated as it arrives.
    Stream(Rest),
}

/// The one path every backend is asked at.
const PATH: &str = "/v1/chat/completions";

impl Fallbacks {
    /// The backends of `configs`, where `resolved` (the same order) says they
    /// are and with the keys it read.
    pub fn new(configs: &[FallbackConfig], resolved: &[ResolvedFallback]) -> anyhow::Result<Fallbacks> {
        let mut backends = Vec::new();
        for (i, (c, r)) in configs.iter().zip(resolved).enumerate() {
            let target = Target::backend(&r.base, r.key.as_ref())
                .map_err(|e| anyhow::anyhow!("fallback[{i}].api_key_env: {e}"))?;
            backends.push(Backend { config: c.clone(), target, resting_until_ms: AtomicU64::new(0) });
        }
        Ok(Fallbacks { backends })
    }

    /// Each backend as it is named in metrics and the marker header
    /// (`<name>/<model>`).
    pub fn markers(&self) -> impl Iterator<Item = String> + '_ {
        self.backends.iter().map(Backend::marker)
    }

    /// Whether any backend is configured.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Serves the Messages request `body` through the first backend that
    /// answers 2xx; `None` when none does. The second value names the backend
    /// (`<name>/<model>`), for the marker header and the record.
    pub async fn serve(
        &self,
        transport: &dyn Transport,
        body: &Bytes,
        timeout: Duration,
        clock: &crate::clock::Clock,
    ) -> Option<(Substitute, String)> {
        let request: serde_json::Value = serde_json::from_slice(body).ok()?;
        let client_model = request.get("model").and_then(|m| m.as_str()).unwrap_or("").to_string();
        for b in &self.backends {
            let now = clock.now_ms();
            if b.resting_until_ms.load(Ordering::Acquire) > now {
                continue;
            }
            let marker = b.marker();
            match b.ask(transport, &request, &client_model, timeout).await {
                Ok(answer) => {
                    tracing::warn!(backend = %marker, "the pool could not serve: answered by a fallback backend");
                    return Some((answer, marker));
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
    /// `<name>/<model>`: the backend in the marker header, the record and metrics.
    fn marker(&self) -> String {
        format!("{}/{}", self.config.name, self.config.model)
    }

    /// One try: the request translated and sent; a JSON answer read and
    /// translated back, a stream's translation set up to run as it is read.
    async fn ask(
        &self,
        transport: &dyn Transport,
        request: &serde_json::Value,
        client_model: &str,
        timeout: Duration,
    ) -> Result<Substitute, String> {
        let chat = openai::messages_to_chat_request(request, &self.config.model)?;
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // Translated event by event: nothing compressed.
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        let uri = Uri::from_static(PATH);
        let body = Bytes::from(chat.to_string());
        let response = transport.send(&self.target, &Method::POST, &uri, &headers, &body, timeout).await?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if sse {
            let events = Translate::new(Box::pin(body_stream(response)), MessagesStream::new(client_model));
            return Ok(Substitute::Stream(Box::pin(events)));
        }
        let bytes = tokio::time::timeout(timeout, super::upstream::read_whole(response, WHOLE_LIMIT))
            .await
            .map_err(|_| "the answer did not arrive in time".to_string())??;
        let answer: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
        Ok(Substitute::Whole(Bytes::from(openai::chat_to_messages_answer(&answer, client_model).to_string())))
    }
}

/// The most of a backend's JSON answer that is read.
const WHOLE_LIMIT: usize = 64 << 20;
