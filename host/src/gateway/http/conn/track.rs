//! What the connection's guard needs to hear from the requests on it: when a
//! request starts (the HTTP server has its head), whether its body was read to
//! the end, and when its response ends. From these the guard knows whether the
//! connection is idle (its keep-alive timer runs), reading a head (the head
//! timer runs) or busy with a request (no timer of its own: the body has its
//! deadline, and an answer may stream for minutes).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

use crate::gateway::request::read::ClientConnection;

/// The state one connection's guard and its requests share.
#[derive(Default)]
pub struct Shared {
    started: AtomicU64,
    ended: AtomicU64,
    body_done: AtomicBool,
    /// The guard's read: woken when a response ends, so that the idle timer
    /// starts even while nothing is read (HTTP/2 always has a read pending).
    reader: AtomicWaker,
    /// Rung by the guard to ask for a graceful close (idle too long).
    close: Notify,
    /// Whether the guard knows the protocol (HTTP/1 or HTTP/2) yet.
    known: AtomicBool,
    known_notify: Notify,
    /// Whether it is HTTP/2 (known once `known` is).
    http2: AtomicBool,
    /// Whether the guard ended the connection for a client that accepted no
    /// byte of its answer for `server.send_timeout_ms`.
    send_timed_out: AtomicBool,
}

/// A snapshot of the requests on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requests {
    /// Requests started so far.
    pub started: u64,
    /// Responses ended so far.
    pub ended: u64,
    /// Whether the last request's body was read to its end (or it had none).
    pub body_done: bool,
}

impl Shared {
    /// The requests so far.
    pub fn requests(&self) -> Requests {
        // `ended` first: a response that ends between the loads can only make
        // the snapshot look busier than it is, never idle while busy.
        let ended = self.ended.load(Ordering::Acquire);
        let body_done = self.body_done.load(Ordering::Acquire);
        Requests { started: self.started.load(Ordering::Acquire), ended, body_done }
    }

    /// Resolves when the guard asks for the connection to be closed
    /// gracefully (it sat idle too long).
    pub async fn close_requested(&self) {
        self.close.notified().await;
    }

    /// Asks for a graceful close.
    pub(super) fn request_close(&self) {
        self.close.notify_one();
    }

    /// Resolves once the connection's protocol is known: until then the
    /// HTTP server is still reading its first bytes, and asking it to close
    /// would drop a request it has not seen.
    pub async fn protocol_known(&self) {
        let notified = self.known_notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.known.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// Whether the connection speaks HTTP/2 (false until the protocol is known).
    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Acquire)
    }

    /// The guard knows the protocol: HTTP/2 when `http2`.
    pub(super) fn set_protocol_known(&self, http2: bool) {
        self.http2.store(http2, Ordering::Release);
        self.known.store(true, Ordering::Release);
        self.known_notify.notify_waiters();
    }

    /// Registers the guard's read to be woken when a response ends.
    pub(super) fn register_reader(&self, cx: &Context<'_>) {
        self.reader.register(cx.waker());
    }

    /// Notes that the client accepted no byte for `server.send_timeout_ms`;
    /// true the first time (the guard counts and logs it once).
    pub(super) fn note_send_timeout(&self) -> bool {
        !self.send_timed_out.swap(true, Ordering::AcqRel)
    }

    /// A request's head arrived; `body_done` when it has no body to read.
    pub fn request_started(&self, body_done: bool) {
        self.body_done.store(body_done, Ordering::Release);
        self.started.fetch_add(1, Ordering::AcqRel);
    }

    fn body_ended(&self) {
        self.body_done.store(true, Ordering::Release);
    }

    fn response_ended(&self) {
        self.ended.fetch_add(1, Ordering::AcqRel);
        self.reader.wake();
    }
}

/// How a request's end learns why its client stopped taking its answer.
impl ClientConnection for Shared {
    fn send_timed_out(&self) -> bool {
        self.send_timed_out.load(Ordering::Acquire)
    }
}

/// Ends a request on its connection when dropped (once).
pub struct Ticket(Option<std::sync::Arc<Shared>>);

impl Ticket {
    /// A ticket for a request that just started on `shared`'s connection.
    pub fn new(shared: std::sync::Arc<Shared>) -> Self {
        Ticket(Some(shared))
    }

    fn end(&mut self) {
        if let Some(s) = self.0.take() {
            s.response_ended();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.end();
    }
}

/// What a body wrapped by [`AtEnd`] does when it ends.
pub trait EndHook {
    /// The body was read to its end.
    fn ended(&mut self);
}

/// A request body: its end tells [`Shared`] the body was read whole.
impl EndHook for std::sync::Arc<Shared> {
    fn ended(&mut self) {
        self.body_ended();
    }
}

/// A response body: its end (or its drop, by the ticket's own) ends the
/// request on the connection.
impl EndHook for Ticket {
    fn ended(&mut self) {
        self.end();
    }
}

pin_project_lite::pin_project! {
    /// A body that runs its hook when it ends: a request body telling the
    /// connection it was read whole, a response body ending its request
    /// (written, or — by the ticket's drop — the client went away).
    pub struct AtEnd<B, H> {
        #[pin]
        inner: B,
        hook: H,
    }
}

impl<B, H> AtEnd<B, H> {
    /// Wraps `inner`.
    pub fn new(inner: B, hook: H) -> Self {
        AtEnd { inner, hook }
    }
}

impl<B: Body<Data = Bytes>, H: EndHook> Body for AtEnd<B, H> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            this.hook.ended();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_request_is_busy_from_its_head_until_its_response_ends() {
        let shared = Arc::new(Shared::default());
        assert_eq!(shared.requests(), Requests { started: 0, ended: 0, body_done: false });
        shared.request_started(false);
        let body = AtEnd::new(http_body_util::Full::new(Bytes::from_static(b"{}")), shared.clone());
        assert!(!shared.requests().body_done);
        body.collect().await.unwrap();
        assert!(shared.requests().body_done, "read to its end");
        let response = AtEnd::new(http_body_util::Full::new(Bytes::from_static(b"ok")), Ticket::new(shared.clone()));
        assert_eq!(shared.requests().ended, 0);
        response.collect().await.unwrap();
        assert_eq!(shared.requests(), Requests { started: 1, ended: 1, body_done: true });

        // A response dropped unread ends its request too, once.
        shared.request_started(true);
        let response = AtEnd::new(http_body_util::Full::new(Bytes::from_static(b"ok")), Ticket::new(shared.clone()));
        drop(response);
        assert_eq!(shared.requests(), Requests { started: 2, ended: 2, body_done: true });
    }
}
