//! The signals an operator stops the gateway with, and the shutdown each
//! asks for ([`Stop`]): SIGTERM drains (a service manager or orchestrator
//! moving traffic away), SIGINT closes at once (Ctrl-C at a terminal, where
//! nobody balances load), and a second signal of either kind cuts what is
//! still open. The staged shutdown itself is [`super::server`]'s.

use anyhow::{Context, Result};

/// How a shutdown goes; a stronger request overrides a weaker one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stop {
    /// SIGTERM: `/readyz` 503, keep accepting for `server.drain_ms`, then
    /// close the listener; open requests get the rest of the grace period.
    Drain,
    /// Close the listener at once; open requests get the grace period.
    Close,
    /// Cut whatever is open now.
    Now,
}

/// A termination signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: a service manager or orchestrator stopping the gateway.
    Terminate,
    /// SIGINT: Ctrl-C at a terminal.
    Interrupt,
}

impl Signal {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Terminate => "SIGTERM",
            Signal::Interrupt => "SIGINT",
        }
    }

    /// The shutdown it asks for: SIGTERM drains, SIGINT does not.
    pub fn stop(self) -> Stop {
        match self {
            Signal::Terminate => Stop::Drain,
            Signal::Interrupt => Stop::Close,
        }
    }
}

/// SIGINT and SIGTERM, listened to from creation on (a signal that arrives
/// before [`Signals::next`] is called is not lost).
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts listening.
    pub fn new() -> Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal.
    pub async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => Signal::Terminate,
                _ = self.int.recv() => Signal::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Interrupt
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn termination() {
    match Signals::new() {
        Ok(mut s) => {
            s.next().await;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for signals; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
