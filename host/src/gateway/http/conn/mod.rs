//! The connection guard: every accepted socket is read through a [`Guard`],
//! which bounds what one client can hold.
//!
//! The HTTP server (hyper) has no clock of its own here and would wait for a
//! head or a body forever; its head limits answer with an empty 431. So the
//! guard watches the bytes as they pass, with a phase it shares with the
//! requests on the connection ([`track::Shared`]):
//!
//! - **waiting** for a request: a new connection may stay silent for
//!   `server.header_timeout_ms`, a kept-alive one for `server.idle_timeout_ms`;
//!   then it is closed gracefully (nothing to answer);
//! - **reading a head**: it must be complete within `server.header_timeout_ms`
//!   of its first byte, else a 408; its bytes and lines are counted as they
//!   arrive ([`head::HeadScan`]), and past the limits the gateway's own 431 is
//!   written before the server has the head whole, however large it would be;
//! - **busy** with a request: no timer of its own — the body has its deadline
//!   (`server.body_timeout_ms`, in the route) and an answer may stream for
//!   minutes.
//!
//! Whatever the phase, a write the client does not take — its window full,
//! not one byte accepted for `server.send_timeout_ms` — ends the connection
//! (nginx's `send_timeout`): the server sees the write fail and drops the
//! answers on it, and with them their upstream requests. The timer runs only
//! while bytes wait, so a stream that is merely quiet never trips it; a write
//! that goes through costs one store.
//!
//! The server's own limits stay above the guard's, as a backstop. A
//! connection that opens with the HTTP/2 preface is served as HTTP/2 and only
//! its idleness is watched: no HTTP/1 byte is ever written into it.

pub mod head;
pub mod refuse;
pub mod track;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::routes::MAX_HEADERS;
use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::gateway::request::errors::ErrorType;
use head::{HeadLimits, HeadScan, Scan, Sniff, Sniffer};
use refuse::Refusal;
use track::Shared;

/// What a request line may add to `server.max_header_bytes` before the guard
/// refuses the head: the gateway's own check of the headers (with its exact
/// count in the message) runs on every head under this.
pub const REQUEST_LINE_BYTES: usize = 16 << 10;

/// The limits one connection is held to, taken from the configuration in
/// force when it was accepted.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// What a head may hold.
    pub head: HeadLimits,
    /// `server.max_header_bytes`, for messages.
    pub max_header_bytes: usize,
    /// `server.header_timeout_ms`.
    pub header_timeout: Duration,
    /// `server.idle_timeout_ms`.
    pub idle_timeout: Duration,
    /// `server.send_timeout_ms`.
    pub send_timeout: Duration,
}

impl Limits {
    /// The limits of `server`.
    pub fn of(server: &ServerConfig) -> Limits {
        Limits {
            head: HeadLimits { bytes: server.max_header_bytes + REQUEST_LINE_BYTES, headers: MAX_HEADERS },
            max_header_bytes: server.max_header_bytes,
            header_timeout: Duration::from_millis(server.header_timeout_ms),
            idle_timeout: Duration::from_millis(server.idle_timeout_ms),
            send_timeout: Duration::from_millis(server.send_timeout_ms),
        }
    }
}

/// Where a connection is.
#[derive(Debug)]
enum Phase {
    /// No byte of a request yet, since `since`; `fresh` for a new connection
    /// (the head timeout applies, else the idle one).
    Waiting { since: Instant, fresh: bool },
    /// A head is arriving, since `since`.
    Head { since: Instant, scan: HeadScan },
    /// The head is complete; the server is about to start the request.
    Parsing { since: Instant },
    /// Requests are open.
    Busy,
    /// The last request's body was not read to its end: the server drains or
    /// closes; the guard follows no bytes until the next request starts.
    Untracked { since: Instant },
    /// Asked to close, or refused.
    Closing,
}

/// What a deadline that passed calls for.
enum Expired {
    Close { idle: bool },
    Refuse(Refusal, String, String, Instant),
}

/// A client socket read through the guard.
pub struct Guard {
    io: Option<TcpStream>,
    shared: Arc<Shared>,
    gateway: Arc<Gateway>,
    limits: Limits,
    sniff: Sniffer,
    phase: Phase,
    /// Requests started, as last seen.
    seen: u64,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    refusing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Since when a write has waited without the client taking a byte.
    stalled: Option<Instant>,
    /// The send timeout's timer: made at the first write that waits.
    send_timer: Option<Pin<Box<Sleep>>>,
}

impl Guard {
    /// Guards `io`, just accepted.
    pub fn new(io: TcpStream, shared: Arc<Shared>, gateway: Arc<Gateway>, limits: Limits) -> Guard {
        let now = Instant::now();
        Guard {
            io: Some(io),
            shared,
            gateway,
            limits,
            sniff: Sniffer::default(),
            phase: Phase::Waiting { since: now, fresh: true },
            seen: 0,
            timer: Box::pin(tokio::time::sleep_until(now + limits.header_timeout)),
            armed: None,
            refusing: None,
            stalled: None,
            send_timer: None,
        }
    }

    /// Waits for the connection's first bytes without taking them, and says
    /// what they open: the server built for that protocol alone reads the
    /// head whole in its first read. (hyper's own detection hands it the 24
    /// bytes it sniffed first, and the rest of the head in a second read that
    /// doubles its read buffer to 16 KiB, kept for the connection's life.)
    /// [`Sniff::Undecided`]: a partial preface so far, for the server's own
    /// detection to finish; `None`: the connection ended first — closed, or
    /// silent past `server.header_timeout_ms` (counted idle, as ever).
    pub fn poll_opens(&mut self, cx: &mut Context<'_>) -> Poll<Option<Sniff>> {
        let Some(io) = self.io.as_ref() else { return Poll::Ready(None) };
        let mut first = [0u8; head::H2_PREFACE.len()];
        let mut buf = ReadBuf::new(&mut first);
        match io.poll_peek(cx, &mut buf) {
            Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(None),
            Poll::Ready(Ok(n)) => return Poll::Ready(Some(Sniffer::default().feed(&first[..n]))),
            Poll::Pending => {}
        }
        match self.poll_deadline(cx) {
            None => Poll::Pending,
            Some(expired) => {
                self.act(expired);
                Poll::Ready(None)
            }
        }
    }

    /// Follows the requests the server started and ended since the last read.
    fn sync(&mut self) {
        let r = self.shared.requests();
        if r.started != self.seen {
            self.seen = r.started;
            if !matches!(self.phase, Phase::Closing) {
                self.phase = Phase::Busy;
            }
        }
        if matches!(self.phase, Phase::Busy) && r.ended == r.started {
            let since = Instant::now();
            self.phase = if self.sniff.verdict() == Sniff::Http2 || r.body_done {
                Phase::Waiting { since, fresh: false }
            } else {
                Phase::Untracked { since }
            };
        }
    }

    /// Takes bytes just read; a refusal when they break a head limit.
    fn observe(&mut self, bytes: &[u8]) -> Option<Expired> {
        match self.sniff.verdict() {
            Sniff::Http2 => return None,
            Sniff::Undecided => match self.sniff.feed(bytes) {
                Sniff::Http2 => {
                    // Served as HTTP/2 from here: only idleness is watched.
                    self.shared.set_protocol_known(true);
                    self.phase = Phase::Waiting { since: Instant::now(), fresh: false };
                    return None;
                }
                Sniff::Http1 => self.shared.set_protocol_known(false),
                Sniff::Undecided => {}
            },
            Sniff::Http1 => {}
        }
        if let Phase::Waiting { .. } = self.phase {
            self.phase = Phase::Head { since: Instant::now(), scan: HeadScan::new(self.limits.head) };
        }
        let limits = self.limits;
        let Phase::Head { since, scan } = &mut self.phase else { return None };
        let since = *since;
        let headers_too_large = |what: String| {
            format!(
                "poolgate: the request headers are too large ({what}; the limit is {MAX_HEADERS} headers, {} bytes: \
                 server.max_header_bytes)",
                limits.max_header_bytes
            )
        };
        let (status, reason, message) = match scan.feed(bytes) {
            Scan::Partial => return None,
            Scan::Complete(_) => {
                self.phase = Phase::Parsing { since };
                return None;
            }
            Scan::TooManyHeaders => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too_many_headers",
                headers_too_large(format!("more than {MAX_HEADERS} headers")),
            ),
            Scan::TooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
                headers_too_large(format!("more than {} bytes in the head", limits.head.bytes)),
            ),
            Scan::LineTooLong => (
                StatusCode::URI_TOO_LONG,
                "uri_too_long",
                format!("poolgate: the request line is longer than {} bytes", limits.head.bytes),
            ),
        };
        let (method, path) = scan.method_and_path();
        let kind = ErrorType::InvalidRequest;
        let refusal = Refusal { status, kind, reason, message, is_final: true, retry_after_s: None };
        Some(Expired::Refuse(refusal, method, path, since))
    }

    /// When the phase's timer runs out, if it has one.
    fn deadline(&self) -> Option<Instant> {
        let l = &self.limits;
        match &self.phase {
            Phase::Waiting { since, fresh: true } => Some(*since + l.header_timeout),
            Phase::Waiting { since, fresh: false } => Some(*since + l.idle_timeout),
            Phase::Head { since, .. } | Phase::Parsing { since } => Some(*since + l.header_timeout),
            Phase::Untracked { since } => Some(*since + l.idle_timeout + l.header_timeout),
            Phase::Busy | Phase::Closing => None,
        }
    }

    /// Polls the phase's timer; what to do if it ran out.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Option<Expired> {
        let at = self.deadline()?;
        if self.armed != Some(at) {
            self.timer.as_mut().reset(at);
            self.armed = Some(at);
        }
        self.timer.as_mut().poll(cx).is_ready().then_some(())?;
        self.armed = None;
        match &self.phase {
            Phase::Head { since, scan } if self.sniff.verdict() == Sniff::Http1 && scan.begun() => {
                let (method, path) = scan.method_and_path();
                let refusal = Refusal {
                    status: StatusCode::REQUEST_TIMEOUT,
                    kind: ErrorType::InvalidRequest,
                    reason: "head_timeout",
                    message: format!(
                        "poolgate: the request head did not arrive within {} ms (server.header_timeout_ms)",
                        self.limits.header_timeout.as_millis()
                    ),
                    is_final: false,
                    retry_after_s: None,
                };
                Some(Expired::Refuse(refusal, method, path, *since))
            }
            Phase::Waiting { .. } => Some(Expired::Close { idle: true }),
            // A partial HTTP/2 preface, leading empty lines, a head the server
            // never started, a body left unread: nothing to answer.
            _ => Some(Expired::Close { idle: false }),
        }
    }

    /// Acts on an expired deadline or a broken limit.
    fn act(&mut self, what: Expired) {
        match what {
            Expired::Close { idle } => {
                if idle {
                    self.gateway.metrics.idle_closed();
                }
                self.phase = Phase::Closing;
                self.shared.request_close();
            }
            Expired::Refuse(refusal, method, path, since) => {
                let bytes = refuse::answer(&self.gateway, refusal, &method, &path, since.into_std());
                self.phase = Phase::Closing;
                if let Some(io) = self.io.take() {
                    self.refusing = Some(Box::pin(refuse::send(io, bytes)));
                }
            }
        }
    }
}

/// The error the server sees once a refusal was written: it ends the
/// connection without writing anything of its own.
fn refused() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "connection refused by poolgate")
}

impl AsyncRead for Guard {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some(refusing) = this.refusing.as_mut() {
                ready!(refusing.as_mut().poll(cx));
                return Poll::Ready(Err(refused()));
            }
            this.shared.register_reader(cx);
            this.sync();
            let Some(io) = this.io.as_mut() else { return Poll::Ready(Err(refused())) };
            let before = buf.filled().len();
            match Pin::new(io).poll_read(cx, buf) {
                Poll::Ready(Ok(())) => {
                    let n = buf.filled().len() - before;
                    if n == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    match this.observe(&buf.filled()[before..]) {
                        None => return Poll::Ready(Ok(())),
                        Some(refusal) => {
                            // The server never sees the bytes that broke the limit.
                            buf.set_filled(before);
                            this.act(refusal);
                        }
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => match this.poll_deadline(cx) {
                    None => return Poll::Pending,
                    Some(expired @ Expired::Close { .. }) => {
                        this.act(expired);
                        return Poll::Pending;
                    }
                    Some(refusal) => this.act(refusal),
                },
            }
        }
    }
}

impl Guard {
    /// Follows a write's progress: a byte taken clears the stall; a write
    /// that waits starts it (or goes on with it) and fails once it has
    /// lasted `server.send_timeout_ms`.
    fn sent<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
        progress: impl Fn(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(Ok(done)) if progress(&done) => {
                self.stalled = None;
                Poll::Ready(Ok(done))
            }
            Poll::Pending => match self.poll_stall(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }

    /// Polls the send timer of a write that waits; the error that ends the
    /// connection once it ran out (told once: counted, logged, and noted for
    /// the requests on the connection, which end as `send_timeout`).
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let since = *self.stalled.get_or_insert_with(Instant::now);
        let at = since + self.limits.send_timeout;
        let timer = self.send_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if timer.deadline() != at {
            timer.as_mut().reset(at);
        }
        ready!(timer.as_mut().poll(cx));
        if self.shared.note_send_timeout() {
            self.gateway.metrics.send_timeout();
            let ms = self.limits.send_timeout.as_millis() as u64;
            tracing::warn!(
                send_timeout_ms = ms,
                "a client accepted no byte of its answer for {ms} ms (server.send_timeout_ms): connection closed, \
                 its requests' upstream cancelled"
            );
        }
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "the client accepted no byte (server.send_timeout_ms)"))
    }
}

impl AsyncWrite for Guard {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = match this.io.as_mut() {
            Some(io) => Pin::new(io).poll_write(cx, buf),
            None => return Poll::Ready(Err(refused())),
        };
        this.sent(cx, polled, |&n| n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = match this.io.as_mut() {
            Some(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            None => return Poll::Ready(Err(refused())),
        };
        this.sent(cx, polled, |&n| n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = match this.io.as_mut() {
            Some(io) => Pin::new(io).poll_flush(cx),
            None => return Poll::Ready(Ok(())),
        };
        this.sent(cx, polled, |_| false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = match this.io.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => return Poll::Ready(Ok(())),
        };
        this.sent(cx, polled, |_| false)
    }
}
