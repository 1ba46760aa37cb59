//! The listener: TCP_NODELAY on every connection, and a graceful shutdown that
//! lets in-flight requests and streams finish — for a bounded time.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures_util::future::Either;
use hyper::body::Incoming;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Gateway;
use super::routes::{self, AppState, Reloader, router};
use crate::config::Config;
use crate::policy::PolicyEngine;

/// Builds the reload hook once the gateway exists.
pub type MakeReloader = Box<dyn FnOnce(&Arc<Gateway>) -> Reloader + Send>;

/// A gateway serving in the background of the current tokio runtime.
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// The reload hook, when the gateway was started from a file.
    pub reloader: Option<Reloader>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<()>>,
}

impl Running {
    /// Loads `config` (compiling the chain off the async workers), binds
    /// `server.listen` and starts serving. `reloader`, if given, backs
    /// `POST /admin/reload`.
    pub async fn start(config: Config, engine: Arc<PolicyEngine>, reloader: Option<MakeReloader>) -> Result<Running> {
        let listen = config.server.listen.clone();
        let grace = Duration::from_millis(config.server.shutdown_grace_ms);
        let warm = engine.clone();
        let gateway = Gateway::new(config, engine).await?;
        // Replicas: in step with the others (or given up on it) before the
        // seats are healed and the first request is taken.
        gateway.shared.settle().await;
        // Seats whose token expired while the gateway was down are refreshed
        // before it serves, then kept fresh in the background.
        crate::oauth::keep::heal(&gateway).await;
        crate::oauth::keep::spawn(&gateway);
        // After the first generation: the chain's own built-ins are in memory by now.
        warm.warm_builtins();
        let listener = bind(&listen).await?;
        let addr = listener.local_addr()?;
        check_exposure(&addr, !gateway.generation().client_keys.is_empty())?;
        // Where it listens is fixed until a restart; reloads are judged against it.
        let _ = gateway.listening.set(addr);
        let reloader = reloader.map(|make| make(&gateway));
        let (stop, mut stopped) = watch::channel(false);
        let state = AppState { gateway: gateway.clone(), reloader: reloader.clone() };
        let task = tokio::spawn(serve(listener, state, grace, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        Ok(Running { addr, gateway, reloader, stop, task })
    }

    /// Starts a graceful shutdown.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until the server has stopped.
    pub async fn wait(self) -> Result<()> {
        self.task.await?
    }
}

/// Binds `addr`.
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))
}

/// Refuses to expose an open gateway: without client keys, only a loopback
/// address is allowed.
pub fn check_exposure(addr: &SocketAddr, has_client_keys: bool) -> Result<()> {
    if !crate::config::validate::exposure_allowed(addr, has_client_keys) {
        bail!(
            "server.listen = {addr} is not a loopback address and no client keys are configured: \
             anyone who can reach it could spend the pool. Add [[server.client_keys]] or listen on 127.0.0.1"
        );
    }
    Ok(())
}

/// Serves until `shutdown` resolves, then stops accepting and waits up to
/// `grace` for open requests and streams before returning.
///
/// Each connection is served by hyper directly (HTTP/1.1, and HTTP/2 with
/// prior knowledge), with TCP_NODELAY, and with head limits above poolgate's
/// own ([`routes::MAX_HEADERS`], `server.max_header_bytes`; hyper's are
/// [`routes::SERVER_HEAD_BYTES`]), so that a request with too large a head gets
/// poolgate's 431 — in Anthropic's error shape, with a request id — rather
/// than hyper's bare one.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    grace: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let gateway = state.gateway.clone();
    let app = TowerToHyperService::new(router(state));
    let service = service_fn(move |req: http::Request<Incoming>| {
        match routes::oversized_head(&gateway, req.method(), req.uri(), req.headers()) {
            Some(refused) => Either::Left(std::future::ready(Ok(refused))),
            None => Either::Right(app.call(req)),
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_headers(routes::MAX_HEADERS * 10).max_buf_size(routes::SERVER_HEAD_BYTES);
    builder.http2().max_header_list_size(routes::SERVER_HEAD_BYTES as u32);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, or a connection reset while queued:
                    // the listener stays; pause a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let conn = builder.serve_connection(TokioIo::new(tcp), service.clone()).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections; waiting for in-flight requests"
    );
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => tracing::warn!("shutdown grace expired; closing the connections still open"),
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn termination() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
