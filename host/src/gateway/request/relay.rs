//! The response body the client reads: the upstream's bytes, passed on as they
//! arrive, plus what must happen when the response ends — however it ends.
//!
//! When the stream completes, breaks, or the client goes away (the body is
//! dropped, and with it the [`Finish`]), the in-flight lease is released, the chain's `observe` is told how
//! the request ended, and the request record is kept. For SSE, a stream the
//! upstream cuts mid-way ends cleanly with an `error` event instead of a torn
//! connection; to make that possible the relay holds back the tail of a chunk
//! that ends inside an event until the event is complete (chunks normally end on
//! event boundaries, and then nothing is held or copied).
//!
//! A shutdown's grace period that ends while the answer is still open cuts it
//! the same way — an SSE stream ends with an `error` event saying the gateway
//! is shutting down (which the OpenAI translation turns into an OpenAI error
//! chunk), any other body ends torn — and the request is recorded as
//! `shutdown`, not as a client that went away.
//!
//! An answer that must be translated whole (any but a 2xx stream, for a
//! client of another dialect) is read whole first ([`read_whole`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::Stream;

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{StatusCode, header};

use super::attempt::WHOLE_LIMIT;
use super::body::{ANTHROPIC_PING, OPENAI_KEEPALIVE, Translate, with_keepalive};
use super::errors::{ErrorType, error};
use super::finish::Finish;
use super::record::Ending;
use super::upstream::Rest;
use poolgate_wire::usage::{Scanner, Usage};

/// The SSE event sent when the upstream stream breaks after the first byte.
pub const STREAM_ERROR_EVENT: &[u8] =
    b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream stream interrupted (poolgate)\"}}\n\n";

pub use super::errors::STREAM_SHUTDOWN_EVENT;

/// Passes SSE chunks on at event boundaries: a chunk that ends inside an event
/// is held until the event completes. Chunks that end on a boundary (the normal
/// case) pass through untouched, without a copy.
#[derive(Default)]
pub struct SseFramer {
    pending: BytesMut,
}

impl SseFramer {
    /// Takes a chunk; returns what can go out now.
    pub fn push(&mut self, chunk: Bytes) -> Option<Bytes> {
        if self.pending.is_empty() && chunk.ends_with(b"\n\n") {
            return Some(chunk);
        }
        self.pending.extend_from_slice(&chunk);
        let boundary = self.pending.windows(2).rposition(|w| w == b"\n\n")?;
        Some(self.pending.split_to(boundary + 2).freeze())
    }

    /// What is held back (at the end of a stream).
    pub fn rest(&mut self) -> Option<Bytes> {
        let rest = std::mem::take(&mut self.pending);
        (!rest.is_empty()).then(|| rest.freeze())
    }

    /// Drops a torn event.
    pub fn clear(&mut self) {
        self.pending.clear();
    }
}

/// The response whose body is `first` then `rest`, relayed as it arrives in
/// the client's dialect; `finish` ends the request when the body ends.
/// `head` carries the status and headers. `written_here`: the stream is one
/// poolgate writes itself (a fallback's translation), so an Anthropic client
/// gets its `ping`s in the silences (an account's stream has its own).
pub fn respond(
    mut finish: Finish,
    mut head: Response,
    first: Bytes,
    rest: Rest,
    sse: bool,
    length: Option<u64>,
    written_here: bool,
) -> Response {
    let keepalive = Some(Duration::from_millis(finish.generation.config.gateway.stream_keepalive_ms));
    let translation = if sse { finish.dialect.stream_translation() } else { None };
    if translation.is_some() {
        head.headers_mut().remove(header::CONTENT_LENGTH);
    }
    let head = finish.respond(head);
    let relay = Relay::new(first, rest, sse, length, finish);
    let body = match translation {
        Some(t) => with_keepalive(Translate::new(relay, t), keepalive, OPENAI_KEEPALIVE),
        None if sse && written_here => with_keepalive(relay, keepalive, ANTHROPIC_PING),
        None => Body::from_stream(relay),
    };
    head.map(|_| body)
}

/// The most of a JSON answer kept to read its `usage` at its end; a larger
/// answer's usage is unknown (and counted so in the ledger).
const METERED_BODY_MAX: usize = 8 << 20;

/// Reads what a successful answer says it used, as its bytes go out: a
/// stream's events as they pass, a JSON body at its end.
enum Meter {
    Stream(Scanner),
    /// A JSON body's chunks (shared, not copied) and their length.
    Body(Vec<Bytes>, usize),
    Off,
}

impl Meter {
    fn new(sse: bool, status: u16) -> Meter {
        match (sse, (200..300).contains(&status)) {
            (_, false) => Meter::Off,
            (true, true) => Meter::Stream(Scanner::default()),
            (false, true) => Meter::Body(Vec::new(), 0),
        }
    }

    fn push(&mut self, chunk: &Bytes) {
        match self {
            Meter::Stream(s) => s.push(chunk),
            Meter::Body(parts, len) if *len + chunk.len() <= METERED_BODY_MAX => {
                *len += chunk.len();
                parts.push(chunk.clone());
            }
            Meter::Body(..) => *self = Meter::Off,
            Meter::Off => {}
        }
    }

    /// What the answer used, and whether that is an estimate (a stream that
    /// ended before its closing count is charged by its bytes).
    fn usage(&self) -> (Option<Usage>, bool) {
        match self {
            Meter::Stream(s) if s.finished() => (s.usage(), false),
            Meter::Stream(s) => (s.usage().map(|_| s.charge()), s.usage().is_some()),
            Meter::Body(parts, _) if parts.len() == 1 => (poolgate_wire::usage::of_message(&parts[0]), false),
            Meter::Body(parts, _) => (poolgate_wire::usage::of_message(&parts.concat()), false),
            Meter::Off => (None, false),
        }
    }
}

/// The relayed body.
pub struct Relay {
    first: Option<Bytes>,
    upstream: Rest,
    sse: bool,
    framer: SseFramer,
    finish: Option<Finish>,
    ended: bool,
    /// The upstream's `content-length`: hyper stops reading the body once that
    /// many bytes went out, so reaching it is the end.
    expected: Option<u64>,
    sent: u64,
    /// Resolves when the shutdown grace period ends; made at the first wait.
    cut: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// What the answer says it used, read as it goes out.
    meter: Meter,
}

impl Relay {
    /// A body that starts with `first` (already read, to be sure the upstream
    /// answered before committing to it) and continues with `upstream`.
    /// `finish` ends the request however the body ends (dropped before its
    /// end, it ends it as `client_gone`).
    pub fn new(first: Bytes, upstream: Rest, sse: bool, content_length: Option<u64>, finish: Finish) -> Self {
        let meter = Meter::new(sse, finish.status);
        Relay {
            meter,
            first: Some(first),
            upstream,
            sse,
            framer: SseFramer::default(),
            finish: Some(finish),
            ended: false,
            expected: content_length,
            sent: 0,
            cut: None,
        }
    }

    /// Counts bytes going out; the declared length reached means complete.
    fn out(&mut self, chunk: Bytes) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        self.sent += chunk.len() as u64;
        self.meter.push(&chunk);
        if self.expected == Some(self.sent) {
            self.ended = true;
            self.finish(Ending::Complete);
        }
        Poll::Ready(Some(Ok(chunk)))
    }

    fn finish(&mut self, ending: Ending) {
        if let Some(mut f) = self.finish.take() {
            (f.record.usage, f.record.usage_estimated) = self.meter.usage();
            f.complete(ending);
        }
    }

    /// Whether the shutdown grace period has ended; `cx` is woken when it
    /// does (called only while the upstream has nothing ready, so a stream
    /// that flows pays one atomic load a chunk).
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(finish) = &self.finish else { return false };
        let lifecycle = &finish.gateway.lifecycle;
        if lifecycle.is_cut() {
            return true;
        }
        self.cut.get_or_insert_with(|| lifecycle.on_cut()).as_mut().poll(cx).is_ready()
    }

    /// Ends the answer at the end of the shutdown grace period.
    fn cut(&mut self) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        self.ended = true;
        if let Some(f) = &self.finish {
            f.gateway.metrics.shutdown_cut();
            tracing::warn!(request = f.record.id, "shutdown grace ended: answer cut while still open");
        }
        self.finish(Ending::Shutdown);
        if self.sse {
            // Drop a torn event; end with a well-formed error event.
            self.framer.clear();
            return Poll::Ready(Some(Ok(Bytes::from_static(STREAM_SHUTDOWN_EVENT))));
        }
        Poll::Ready(Some(Err(std::io::Error::other("poolgate is shutting down"))))
    }

    /// Passes `chunk` on, holding back an SSE event that is not yet complete.
    fn pass(&mut self, chunk: Bytes) -> Option<Bytes> {
        if !self.sse {
            return Some(chunk);
        }
        self.framer.push(chunk)
    }
}

impl Drop for Relay {
    /// The client went away mid-answer: what the answer reported up to then
    /// is kept with the record (its `Finish` ends it as `client_gone`).
    fn drop(&mut self) {
        if let Some(f) = &mut self.finish {
            (f.record.usage, f.record.usage_estimated) = self.meter.usage();
        }
    }
}

impl Stream for Relay {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(first) = self.first.take()
            && let Some(out) = self.pass(first)
        {
            return self.out(out);
        }
        if self.ended {
            return Poll::Ready(None);
        }
        if self.finish.as_ref().is_some_and(|f| f.gateway.lifecycle.is_cut()) {
            return self.cut();
        }
        loop {
            match self.upstream.as_mut().poll_next(cx) {
                Poll::Pending => {
                    if self.poll_cut(cx) {
                        return self.cut();
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Some(out) = self.pass(chunk) {
                        return self.out(out);
                    }
                }
                Poll::Ready(None) => {
                    self.ended = true;
                    let rest = self.framer.rest();
                    if let Some(rest) = &rest {
                        self.meter.push(rest);
                    }
                    self.finish(Ending::Complete);
                    return Poll::Ready(rest.map(Ok));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.ended = true;
                    self.finish(Ending::StreamError);
                    tracing::warn!(error = %e, "upstream stream broke after the first byte");
                    if self.sse {
                        // Drop the torn event; end with a well-formed error event.
                        self.framer.clear();
                        return Poll::Ready(Some(Ok(Bytes::from_static(STREAM_ERROR_EVENT))));
                    }
                    return Poll::Ready(Some(Err(std::io::Error::other("upstream body interrupted"))));
                }
            }
        }
    }
}

/// Reads the account's answer whole (`first`, then `rest`) and answers with
/// it in the client's dialect; an answer that breaks first is a 502, and one
/// still open at the end of the shutdown grace period a 503.
pub async fn read_whole(finish: Finish, head: Response, first: Bytes, rest: Rest) -> Response {
    let cut = finish.gateway.lifecycle.on_cut();
    tokio::select! {
        biased;
        read = super::upstream::collect(first, rest, WHOLE_LIMIT) => match read {
            Ok(bytes) => {
                let mut finish = finish;
                if head.status().is_success() {
                    finish.record.usage = poolgate_wire::usage::of_message(&bytes);
                }
                finish.now(head.map(|_| Body::from(bytes)), Ending::Complete)
            }
            Err(why) => {
                tracing::warn!(request = finish.record.id, error = %why, "upstream answer broke before it was whole");
                let msg = "poolgate: the upstream answer broke before it was whole";
                finish.now(error(StatusCode::BAD_GATEWAY, ErrorType::Api, msg), Ending::StreamError)
            }
        },
        () = cut => {
            finish.gateway.metrics.shutdown_cut();
            let msg = "poolgate is shutting down: its shutdown grace period ended before the upstream answer was whole";
            finish.now(error(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Api, msg), Ending::Shutdown)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_never_changes_the_bytes_however_the_stream_is_cut() {
        let stream = b"event: message_start\ndata: {\"a\":1}\n\nevent: ping\ndata: {}\n\nevent: content_block_delta\ndata: {\"b\":\"x\\n\"}\n\nevent: message_stop\ndata: {}\n\n";
        for cut_every in 1..stream.len() {
            let mut f = SseFramer::default();
            let mut out = Vec::new();
            for piece in stream.chunks(cut_every) {
                if let Some(b) = f.push(Bytes::copy_from_slice(piece)) {
                    assert!(b.ends_with(b"\n\n"), "only whole events go out");
                    out.extend_from_slice(&b);
                }
            }
            if let Some(b) = f.rest() {
                out.extend_from_slice(&b);
            }
            assert_eq!(out, stream, "cut every {cut_every}");
        }
    }

    #[test]
    fn the_stream_error_event_is_anthropics() {
        let event = poolgate_wire::sse::error_event(
            poolgate_wire::error::ErrorType::Api,
            "upstream stream interrupted (poolgate)",
        );
        assert_eq!(STREAM_ERROR_EVENT, event.as_bytes());
    }

    #[test]
    fn the_shutdown_event_is_anthropics_and_says_why() {
        let event = poolgate_wire::sse::error_event(
            poolgate_wire::error::ErrorType::Api,
            "poolgate is shutting down: the stream was cut at the end of its shutdown grace period",
        );
        assert_eq!(STREAM_SHUTDOWN_EVENT, event.as_bytes());
    }

    #[test]
    fn a_chunk_ending_on_a_boundary_passes_untouched() {
        let mut f = SseFramer::default();
        let chunk = Bytes::from_static(b"event: ping\ndata: {}\n\n");
        let out = f.push(chunk.clone()).unwrap();
        assert_eq!(out.as_ptr(), chunk.as_ptr(), "no copy");
    }
}
