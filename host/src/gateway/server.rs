//! The listener: TCP_NODELAY on every connection, and a graceful shutdown that
//! lets in-flight requests and streams finish — for a bounded time.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::serve::ListenerExt;
use tokio::net::TcpListener;

use super::routes::{AppState, router};

/// Binds `addr`.
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))
}

/// Refuses to expose an open gateway: without client keys, only a loopback
/// address is allowed.
pub fn check_exposure(addr: &SocketAddr, has_client_keys: bool) -> Result<()> {
    if !has_client_keys && !addr.ip().is_loopback() {
        bail!(
            "server.listen = {addr} is not a loopback address and no client keys are configured: \
             anyone who can reach it could spend the pool. Add [[server.client_keys]] or listen on 127.0.0.1"
        );
    }
    Ok(())
}

/// Serves until `shutdown` resolves, then stops accepting and waits up to
/// `grace` for open requests and streams before returning.
pub async fn serve(listener: TcpListener, state: AppState, grace: Duration, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    });
    let deadline = async move {
        shutdown.await;
        tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down: no new connections; waiting for in-flight requests");
        let _ = stop_tx.send(true);
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = server => r.context("server failed")?,
        () = deadline => tracing::warn!("shutdown grace expired; closing the connections still open"),
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn termination() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
