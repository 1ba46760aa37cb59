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
mod tests {
    use futures_util::StreamExt;
    use poolgate_wire::openai::MessagesStream;

    use super::*;

    type Item = Result<Bytes, std::io::Error>;

    fn channel() -> (tokio::sync::mpsc::Sender<Item>, impl Stream<Item = Item> + Unpin) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Item>(4);
        (tx, futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }

    fn ok(s: &'static str) -> Item {
        Ok(Bytes::from_static(s.as_bytes()))
    }

    /// On tokio's paused clock: pings only in the silences, none while items flow.
    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_gets_a_ping_per_interval_and_a_busy_one_none() {
        let (tx, inner) = channel();
        let mut s = KeepAlive::new(inner, Duration::from_secs(10), b"PING");
        let start = tokio::time::Instant::now();
        tx.send(ok("a")).await.unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), "a");
        // 25 s of silence: two pings, at 10 s and 20 s.
        let producer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(25)).await;
            tx.send(ok("b")).await.unwrap();
        });
        assert_eq!(s.next().await.unwrap().unwrap(), "PING");
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(s.next().await.unwrap().unwrap(), "PING");
        assert_eq!(s.next().await.unwrap().unwrap(), "b");
        assert_eq!(start.elapsed(), Duration::from_secs(25));
        producer.await.unwrap();
        assert!(s.next().await.is_none(), "the end passes through");
    }

    /// Items every 4 s keep a 10 s keep-alive silent; the first ping comes a
    /// whole interval after the last item, not after the timer's first arming.
    #[tokio::test(start_paused = true)]
    async fn a_ping_counts_the_silence_from_the_last_item() {
        let (tx, inner) = channel();
        let mut s = KeepAlive::new(inner, Duration::from_secs(10), b"PING");
        let start = tokio::time::Instant::now();
        let producer = tokio::spawn(async move {
            for _ in 0..7 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                tx.send(ok("x")).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        for _ in 0..7 {
            assert_eq!(s.next().await.unwrap().unwrap(), "x");
        }
        assert_eq!(start.elapsed(), Duration::from_secs(28));
        assert_eq!(s.next().await.unwrap().unwrap(), "PING");
        assert_eq!(start.elapsed(), Duration::from_secs(38));
        producer.abort();
    }

    /// Cut anywhere, a translated stream has the same bytes as the
    /// translation fed whole; an error passes through at once.
    #[tokio::test]
    async fn a_translated_stream_is_the_same_however_it_is_cut_and_errors_pass_through() {
        let backend = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let mut whole = Vec::new();
        let mut t = MessagesStream::new("m");
        t.feed_into(backend.as_bytes(), &mut whole);
        t.finish_into(&mut whole);
        for every in [1, 7, 50, backend.len()] {
            let chunks: Vec<Item> = backend.as_bytes().chunks(every).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            let s = Translate::new(futures_util::stream::iter(chunks), MessagesStream::new("m"));
            let out: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
            assert!(out.iter().all(|c| !c.is_empty()), "no empty chunks");
            assert_eq!(out.concat(), whole, "cut every {every}");
        }
        let broken: Vec<Item> = vec![ok("data: {\"id\":\"c\",\"choices\":[]}\n\n"), Err(std::io::Error::other("cut"))];
        let mut s = Translate::new(futures_util::stream::iter(broken), MessagesStream::new("m"));
        assert!(s.next().await.unwrap().is_ok());
        assert!(s.next().await.unwrap().is_err(), "the error reaches the relay");
    }
}
