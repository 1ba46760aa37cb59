//! Adapters over a response body as it streams: translation into another
//! dialect ([`Translate`]) and keep-alives in its silences ([`KeepAlive`]).
//!
//! Both are plain [`Stream`]s polled by the connection that writes the
//! response: no task, no channel, and no allocation per event — a translated
//! chunk is the translator's output buffer for one upstream chunk. They sit
//! around a [`super::relay::Relay`], which owns how the request ends; an
//! upstream error passes through them to it unchanged.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use poolgate_wire::openai::Translation;

/// The keep-alive of an OpenAI-shaped stream: an SSE comment, which every SSE
/// reader skips.
pub const OPENAI_KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// The keep-alive of an Anthropic-shaped stream: Anthropic's own `ping`
/// event, which the SDKs and Claude Code read as such.
pub const ANTHROPIC_PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";

/// `inner`'s events translated by `T` as they arrive; at `inner`'s end, the
/// translation's closing events. Chunks that complete no event give nothing.
pub struct Translate<S, T> {
    inner: S,
    translation: T,
    out: Vec<u8>,
    ended: bool,
}

impl<S, T> Translate<S, T> {
    /// `inner`, translated by `translation`.
    pub fn new(inner: S, translation: T) -> Self {
        Translate { inner, translation, out: Vec::new(), ended: false }
    }

    /// What the translation wrote, as one chunk.
    fn take(&mut self) -> Option<Bytes> {
        (!self.out.is_empty()).then(|| Bytes::from(std::mem::take(&mut self.out)))
    }
}

impl<S, T, E> Stream for Translate<S, T>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    T: Translation + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while !this.ended {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    this.translation.feed_into(&chunk, &mut this.out);
                    if let Some(out) = this.take() {
                        return Poll::Ready(Some(Ok(out)));
                    }
                }
                // The stream broke: whoever owns the request's end says so
                // (the relay ends it with an error event, translated later).
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    this.ended = true;
                    this.translation.finish_into(&mut this.out);
                    return Poll::Ready(this.take().map(Ok));
                }
            }
        }
        Poll::Ready(None)
    }
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
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<S> KeepAlive<S> {
    /// `inner` with a `ping` after every `every` of silence.
    pub fn new(inner: S, every: Duration, ping: &'static [u8]) -> Self {
        let now = tokio::time::Instant::now();
        let ping = Bytes::from_static(ping);
        KeepAlive { inner, every, ping, last: now, timer: Box::pin(tokio::time::sleep_until(now + every)) }
    }
}

impl<S, E> Stream for KeepAlive<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Poll::Ready(item) = Pin::new(&mut this.inner).poll_next(cx) {
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
            return Poll::Ready(Some(Ok(this.ping.clone())));
        }
    }
}

/// The response body of `stream`, with a `ping` after every `every` of
/// silence when `every` is given and not zero.
pub fn with_keepalive<S>(stream: S, every: Option<Duration>, ping: &'static [u8]) -> axum::body::Body
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Unpin + Send + 'static,
{
    match every {
        Some(every) if !every.is_zero() => axum::body::Body::from_stream(KeepAlive::new(stream, every, ping)),
        _ => axum::body::Body::from_stream(stream),
    }
}

#[cfg(test)]
mod tests;
