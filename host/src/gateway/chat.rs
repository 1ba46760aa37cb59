//! `POST /v1/chat/completions`: OpenAI-shaped clients over the same pool.
//!
//! The request is translated to a Messages request (`poolgate_wire::openai`,
//! plain data → data) and goes through the one request path — ranking with
//! `api = chat-completions`, admission, failover, cooldowns and quota
//! learning exactly as for `/v1/messages`. Only the two ends differ: the body
//! going in, and the answer coming out, which is translated back as it
//! arrives — a JSON answer whole, a stream event by event (no buffering), and
//! every error, the gateway's own included, in OpenAI's shape.

use std::future::Future as _;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use poolgate_wire::openai::{self, ChatStream, OpenAiError};

/// Marks a response already in OpenAI's shape.
#[derive(Clone, Copy)]
pub struct Translated;

/// What the answer's translation needs to know about the request.
#[derive(Default)]
pub struct ChatFacts {
    /// The model as the client named it (the answer names it back).
    pub model: String,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Whether the stream ends with a usage chunk.
    pub include_usage: bool,
    /// A keep-alive comment after this much silence in the stream
    /// (`gateway.stream_keepalive_ms`; the translation drops Anthropic's
    /// `ping`s, which have no OpenAI form).
    pub keepalive: Option<Duration>,
}

/// The keep-alive of an OpenAI-shaped stream: an SSE comment, which every SSE
/// reader skips.
pub const OPENAI_KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// The keep-alive of an Anthropic-shaped stream: Anthropic's own `ping`
/// event, which the SDKs and Claude Code read as such.
pub const ANTHROPIC_PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";

/// An error in OpenAI's shape.
pub fn error_response(e: &OpenAiError) -> Response {
    let mut r = json_response(StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST), &e.to_body());
    r.extensions_mut().insert(Translated);
    r
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Translates the client's body and headers into a Messages request: the
/// body, the upstream path, and the facts the answer's translation needs. The
/// headers lose `accept-encoding` (a compressed stream could not be
/// translated event by event) and gain `anthropic-version` if absent.
pub fn translate_request(
    body: &Bytes,
    headers: &mut HeaderMap,
    aliases: &std::collections::BTreeMap<String, String>,
    keepalive: Option<Duration>,
) -> Result<(Bytes, Uri, ChatFacts), Box<Response>> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        Box::new(error_response(&OpenAiError::invalid(format!("the body is not valid JSON: {e}"), None)))
    })?;
    // `claude-*` models pass; other names through `[models] aliases`, else a
    // 400 naming the model.
    let alias = |name: &str| aliases.get(name).cloned();
    let translated = openai::chat_to_messages(&value, &alias).map_err(|e| Box::new(error_response(&e)))?;
    headers.remove(header::ACCEPT_ENCODING);
    headers.remove(header::CONTENT_LENGTH);
    if !headers.contains_key("anthropic-version") {
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    }
    let facts = ChatFacts {
        model: translated.model.clone(),
        stream: translated.stream,
        include_usage: translated.include_usage,
        keepalive,
    };
    let body = Bytes::from(translated.body.to_string());
    Ok((body, Uri::from_static("/v1/messages"), facts))
}

fn now_s() -> u64 {
    crate::clock::now_ms() / 1000
}

/// Whether a `GET /v1/models` comes from an OpenAI-shaped client: one that
/// sends no `anthropic-version` (every Anthropic SDK and Claude Code does).
pub fn wants_openai_models(headers: &HeaderMap) -> bool {
    !headers.contains_key("anthropic-version")
}

/// The models page of `r` in OpenAI's shape (its errors too).
pub async fn models_response(r: Response) -> Response {
    let (mut parts, body) = r.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let bytes = axum::body::to_bytes(body, 16 << 20).await.unwrap_or_default();
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    let (status, out) = if parts.status.is_success() {
        (parts.status.as_u16(), openai::models_to_openai(&value))
    } else {
        openai::anthropic_error_to_openai(parts.status.as_u16(), &value)
    };
    parts.status = StatusCode::from_u16(status).unwrap_or(parts.status);
    Response::from_parts(parts, Body::from(out.to_string()))
}

/// Translates the Messages answer `r` back: the same status and `x-poolgate-*`
/// headers, the body in OpenAI's shape.
pub async fn translate_response(r: Response, facts: ChatFacts) -> Response {
    let (mut parts, body) = r.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if parts.status.is_success() && sse {
        let mut stream = ChatStream::new(&facts.model, now_s(), facts.include_usage);
        let mut upstream = body.into_data_stream();
        let keepalive = facts.keepalive.map(|every| (every, OPENAI_KEEPALIVE));
        let translated = async_stream_lines(keepalive, None, move |tx| async move {
            while let Some(chunk) = upstream.next().await {
                let Ok(chunk) = chunk else { break };
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
        parts.extensions.insert(Translated);
        return Response::from_parts(parts, translated);
    }
    let bytes = axum::body::to_bytes(body, 64 << 20).await.unwrap_or_default();
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    let (status, out) = if parts.status.is_success() {
        (parts.status.as_u16(), openai::messages_to_chat(&value, &facts.model, now_s()))
    } else {
        openai::anthropic_error_to_openai(parts.status.as_u16(), &value)
    };
    parts.status = StatusCode::from_u16(status).unwrap_or(parts.status);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.extensions.insert(Translated);
    Response::from_parts(parts, Body::from(out.to_string()))
}

/// A future that resolves when the shutdown grace period ends.
pub type OnCut = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A body whose lines a producer task sends as they come, each sent at once
/// (the fallback's translated streams use it too), with `keepalive`'s bytes
/// written whenever nothing went out for its interval, and — when `cut`
/// resolves (the shutdown grace period ended) — its event written last and
/// the body ended.
pub(crate) fn async_stream_lines<F, Fut>(
    keepalive: Option<(Duration, &'static [u8])>,
    cut: Option<(OnCut, &'static [u8])>,
    produce: F,
) -> Body
where
    F: FnOnce(tokio::sync::mpsc::Sender<String>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(16);
    tokio::spawn(produce(tx));
    let lines = CutOff::new(tokio_stream_from(rx).map(Bytes::from), cut);
    match keepalive {
        Some((every, ping)) if !every.is_zero() => {
            Body::from_stream(KeepAlive::new(lines, every, Bytes::from_static(ping)).map(Ok::<_, std::io::Error>))
        }
        _ => Body::from_stream(lines.map(Ok::<_, std::io::Error>)),
    }
}

/// A stream that ends when `cut` resolves, with `event` as its last item (a
/// well-formed SSE `error` event: a client reads why its stream ended).
pub struct CutOff<S> {
    inner: S,
    cut: Option<(OnCut, &'static [u8])>,
    done: bool,
}

impl<S> CutOff<S> {
    /// `inner`, ended by `cut` (`None`: never).
    pub fn new(inner: S, cut: Option<(OnCut, &'static [u8])>) -> Self {
        CutOff { inner, cut, done: false }
    }
}

impl<S: futures_util::Stream<Item = Bytes> + Unpin> futures_util::Stream for CutOff<S> {
    type Item = Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some((cut, event)) = &mut this.cut
            && cut.as_mut().poll(cx).is_ready()
        {
            this.done = true;
            return Poll::Ready(Some(Bytes::from_static(event)));
        }
        std::pin::Pin::new(&mut this.inner).poll_next(cx)
    }
}

fn tokio_stream_from(mut rx: tokio::sync::mpsc::Receiver<String>) -> impl futures_util::Stream<Item = String> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A stream that yields `ping` whenever `inner` stays silent for `every`: a
/// client (Claude Code's byte watchdog, a proxy's idle timeout) sees the
/// stream alive while the backend thinks. An item only notes when it passed;
/// the timer is re-armed from that note when it fires, not per item, so a
/// busy stream costs one clock read per item and carries no pings at all.
pub struct KeepAlive<S> {
    inner: S,
    every: Duration,
    ping: Bytes,
    last: tokio::time::Instant,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<S> KeepAlive<S> {
    /// `inner` with a `ping` after every `every` of silence.
    pub fn new(inner: S, every: Duration, ping: Bytes) -> Self {
        let now = tokio::time::Instant::now();
        KeepAlive { inner, every, ping, last: now, timer: Box::pin(tokio::time::sleep_until(now + every)) }
    }
}

impl<S: futures_util::Stream<Item = Bytes> + Unpin> futures_util::Stream for KeepAlive<S> {
    type Item = Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        use std::task::Poll;
        let this = &mut *self;
        if let Poll::Ready(item) = std::pin::Pin::new(&mut this.inner).poll_next(cx) {
            this.last = tokio::time::Instant::now();
            return Poll::Ready(item);
        }
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = this.last + this.every;
            if due > tokio::time::Instant::now() {
                // Something went out since the timer was armed: wait out the
                // silence from then.
                this.timer.as_mut().reset(due);
                continue;
            }
            this.last = tokio::time::Instant::now();
            this.timer.as_mut().reset(this.last + this.every);
            return Poll::Ready(Some(this.ping.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On tokio's paused clock: pings only in the silences, none while items flow.
    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_gets_a_ping_per_interval_and_a_busy_one_none() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let inner = futures_util::stream::poll_fn({
            let mut rx = rx;
            move |cx| rx.poll_recv(cx)
        });
        let mut s = KeepAlive::new(inner, Duration::from_secs(10), Bytes::from_static(b"PING"));
        let start = tokio::time::Instant::now();
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(s.next().await.unwrap(), "a");
        // 25 s of silence: two pings, at 10 s and 20 s.
        let producer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(25)).await;
            tx.send(Bytes::from_static(b"b")).await.unwrap();
        });
        assert_eq!(s.next().await.unwrap(), "PING");
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(s.next().await.unwrap(), "PING");
        assert_eq!(s.next().await.unwrap(), "b");
        assert_eq!(start.elapsed(), Duration::from_secs(25));
        producer.await.unwrap();
        assert_eq!(s.next().await, None, "the end passes through");
    }

    /// Items every 4 s keep a 10 s keep-alive silent; the first ping comes a
    /// whole interval after the last item, not after the timer's first arming.
    #[tokio::test(start_paused = true)]
    async fn a_ping_counts_the_silence_from_the_last_item() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let inner = futures_util::stream::poll_fn({
            let mut rx = rx;
            move |cx| rx.poll_recv(cx)
        });
        let mut s = KeepAlive::new(inner, Duration::from_secs(10), Bytes::from_static(b"PING"));
        let start = tokio::time::Instant::now();
        let producer = tokio::spawn(async move {
            for _ in 0..7 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                tx.send(Bytes::from_static(b"x")).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        for _ in 0..7 {
            assert_eq!(s.next().await.unwrap(), "x");
        }
        assert_eq!(start.elapsed(), Duration::from_secs(28));
        assert_eq!(s.next().await.unwrap(), "PING");
        assert_eq!(start.elapsed(), Duration::from_secs(38));
        producer.abort();
    }
}
