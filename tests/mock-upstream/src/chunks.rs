//! The body that sends a reply's server-sent events (written by `poolgate_wire`) one
//! chunk at a time.
//!
//! A gateway that relays SSE has to cope with events arriving one by one, slowly, or not
//! at all past some point. [`Chunks`] therefore hands each event to hyper separately and
//! yields (or sleeps) in between, which makes hyper flush every event in its own write,
//! and it can cut the connection after any event.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use tokio::time::Sleep;

use crate::conn::ConnControl;

/// A response body that sends its chunks one at a time, flushing each, with an optional
/// gap between chunks and an optional connection cut after some number of chunks.
pub(crate) struct Chunks {
    chunks: std::vec::IntoIter<Bytes>,
    sent: usize,
    gap: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether the pause since the last chunk is over.
    paused: bool,
    yielded: bool,
    cut: Option<(usize, Arc<ConnControl>)>,
}

impl Chunks {
    /// Sends `chunks` with `gap` between them; with `cut`, resets the connection after
    /// that many chunks (at most all of them) instead of finishing the body.
    pub fn new(chunks: Vec<Bytes>, gap: Duration, cut: Option<(usize, Arc<ConnControl>)>) -> Chunks {
        let cut = cut.map(|(after, control)| (after.min(chunks.len()), control));
        Chunks { chunks: chunks.into_iter(), sent: 0, gap, sleep: None, paused: true, yielded: false, cut }
    }

    fn cut_due(&self) -> bool {
        self.cut.as_ref().is_some_and(|(after, _)| *after == self.sent)
    }

    /// The pause between two chunks. Returning `Pending` is what makes hyper flush the
    /// chunk before: with no gap we still yield once, so every event is its own write.
    fn poll_pause(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.paused {
            return Poll::Ready(());
        }
        if self.gap.is_zero() {
            if !self.yielded {
                self.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.yielded = false;
        } else {
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(self.gap)));
            ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
        }
        self.paused = true;
        Poll::Ready(())
    }
}

impl Stream for Chunks {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.chunks.len() == 0 && !this.cut_due() {
            return Poll::Ready(None);
        }
        ready!(this.poll_pause(cx));
        if let Some((after, control)) = &this.cut
            && *after == this.sent
        {
            // Everything sent so far was flushed during the pause; hyper flushes again
            // after this `Pending`, and then the connection task drops the socket.
            control.abort();
            return Poll::Pending;
        }
        match this.chunks.next() {
            Some(chunk) => {
                this.sent += 1;
                this.paused = false;
                Poll::Ready(Some(Ok(chunk)))
            }
            None => Poll::Ready(None),
        }
    }
}
