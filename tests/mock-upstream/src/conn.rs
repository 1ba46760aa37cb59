//! Accepting connections, and cutting one on purpose.
//!
//! `axum::serve` hides the socket, but the failure steps need to drop a connection at an
//! exact point (before any response byte, or after the Nth SSE event) and to do it with a
//! TCP reset, the way a crashed or overloaded upstream does. So each connection runs in
//! its own task, racing hyper's connection future against a per-connection
//! [`ConnControl`] that handlers reach through the request extensions. Aborting sets
//! `SO_LINGER` to zero when the socket is dropped, which turns the close into an RST.
//!
//! HTTP/1.1 is what the gateway and the SDKs speak to us, and there the cut is exact. A
//! client using HTTP/2 with prior knowledge is served too, but a cut then takes down the
//! whole connection, every stream on it included.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tower::ServiceExt;

/// The kill switch of one connection.
#[derive(Default)]
pub(crate) struct ConnControl {
    aborted: AtomicBool,
    notify: Notify,
}

impl ConnControl {
    /// Resets the connection as soon as its task runs again. Called from inside hyper's
    /// connection future (a handler or a body), so bytes hyper already queued are flushed
    /// in the same poll, before the task sees the signal.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// Connections accepted and ended so far: a client that gives up on an answer
/// (a gateway cancelling its upstream request) shows as a connection that ended
/// while its reply was still being written.
#[derive(Default)]
pub(crate) struct Tally {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
}

/// Counts one connection ended when dropped, however its task ends.
struct Counted(Arc<Tally>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::AcqRel);
    }
}

/// Accepts connections until the task is aborted; dropping the task aborts every
/// connection task too, because they live in its `JoinSet`.
pub(crate) async fn serve(listener: TcpListener, router: Router, tally: Arc<Tally>) {
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so a long benchmark run does not grow the set.
        while connections.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                eprintln!("poolgate-mock-upstream: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small SSE events must leave at once; Nagle would hold them back.
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        tally.opened.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(tally.clone());
        connections.spawn(async move {
            let _counted = counted;
            connection(stream, router).await;
        });
    }
}

async fn connection(stream: TcpStream, router: Router) {
    let control = Arc::new(ConnControl::default());
    let io = TokioIo::new(Io { stream, control: control.clone() });
    let handle = control.clone();
    let service = router.map_request(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(handle.clone());
        req
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(io, TowerToHyperService::new(service));
    tokio::select! {
        biased;
        () = control.notify.notified() => {}
        _ = conn => {}
    }
}

/// The socket, closed with a reset instead of a FIN when its connection was aborted.
struct Io {
    stream: TcpStream,
    control: Arc<ConnControl>,
}

impl Drop for Io {
    fn drop(&mut self) {
        if self.control.aborted.load(Ordering::Acquire) {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
