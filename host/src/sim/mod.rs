//! A simulated Anthropic upstream: a pool of fake accounts whose quota fills as
//! they serve and resets on a compressed clock, answering the Messages API as
//! Anthropic does — JSON and SSE replies, `count_tokens`, `/v1/models`,
//! Anthropic's error shapes, and a 429 with the `anthropic-ratelimit-unified-*`
//! headers when a window is spent.
//!
//! Why it exists: the gateway's interesting behaviour — ranking by headroom,
//! parking an exhausted account until its reset, gating one model family — only
//! shows against an upstream whose quota *moves*. The test mock
//! (`tests/mock-upstream`) plays scripted answers; this simulator derives its
//! answers from budgets and the traffic it gets, so `poolgate demo` can run
//! with no credentials and no network, and a later load simulator can reuse it.
//!
//! - [`scenario`]: the accounts, budgets, clock and latency to start from.
//! - [`quota`]: the ledger arithmetic and the headers that report it.
//! - [`reply`]: what the simulated model reads from a request and answers.
//!
//! How answers are written — bodies, events, error envelopes, quota headers —
//! is the `poolgate_wire` crate's, which the test mock shares.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use poolgate::sim::{Scenario, SimUpstream};
//! let sim = SimUpstream::start(Scenario::demo()).await?;
//! for account in sim.accounts() {
//!     // Configure a gateway account with base_url = sim.url() and this key.
//!     let _key = account.key.expose();
//! }
//! sim.stop().await;
//! # Ok(())
//! # }
//! ```

mod oauth;

/// How long a simulated OAuth seat's access token lives, s.
pub const TOKEN_LIFETIME_S: u64 = oauth::TOKEN_LIFETIME.as_secs();
pub mod quota;
pub mod reply;
pub mod scenario;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use scenario::{AccountSpec, BucketSpec, Latency, Scenario, Timescale, WindowSpec};

use crate::clock::Clock;
use crate::config::Secret;
use crate::random::{random_hex, splitmix, uuid_like};
use quota::Ledger;
use server::{Account, Shared};

/// A simulated account as a client configures it.
#[derive(Debug, Clone)]
pub struct SimAccount {
    /// Its name in the scenario.
    pub name: String,
    /// What is special about it.
    pub note: String,
    /// The API key it answers to (`x-api-key` or `Authorization: Bearer`).
    pub key: Secret,
}

/// One window of an account as the simulator sees it (the truth, which the
/// gateway only learns from answers).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowUsage {
    /// `5h`, `7d` or `7d_<bucket>`.
    pub name: String,
    /// Fraction of the budget used.
    pub utilization: f64,
    /// When the current period ends (ms since the epoch).
    pub resets_at_ms: u64,
}

/// An account's usage and counters.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountUsage {
    /// Its name.
    pub name: String,
    /// Its windows, buckets included.
    pub windows: Vec<WindowUsage>,
    /// Messages requests served.
    pub served: u64,
    /// Messages requests refused with a 429.
    pub refused: u64,
    /// Replies being sent now.
    pub in_flight: u32,
}

/// A simulated upstream serving in the background of the current tokio runtime.
pub struct SimUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The tokens of a simulated OAuth seat, as a login would hand them over.
pub struct SeatTokens {
    /// The bearer token requests carry.
    pub access_token: Secret,
    /// The single-use refresh token.
    pub refresh_token: Secret,
    /// When the access token expires, ms since the epoch.
    pub expires_at_ms: u64,
}

impl SimUpstream {
    /// Logs account `name` in as an OAuth seat: its tokens live
    /// `oauth::TOKEN_LIFETIME` and refresh at `<url>/v1/oauth/token`.
    pub fn seat(&self, name: &str) -> Result<SeatTokens> {
        let account = self.shared.accounts.iter().find(|a| a.name == name).context("no such simulated account")?;
        let (access, refresh, expires_at_ms) = oauth::issue(&self.shared.tokens, account, self.shared.clock.now_ms())?;
        Ok(SeatTokens { access_token: Secret::new(access)?, refresh_token: Secret::new(refresh)?, expires_at_ms })
    }

    /// Refresh grants the simulated token endpoint has answered.
    pub fn refreshes(&self) -> u64 {
        self.shared.tokens.refreshes.load(Ordering::Relaxed)
    }

    /// Binds an ephemeral loopback port and serves `scenario`. Every account
    /// gets a fresh random key; its windows start as the scenario says, from now.
    pub async fn start(scenario: Scenario) -> Result<SimUpstream> {
        Self::start_on(scenario, Clock::system()).await
    }

    /// [`SimUpstream::start`] on `clock`: windows fill and reset, and tokens
    /// expire, on its time.
    pub async fn start_on(scenario: Scenario, clock: Clock) -> Result<SimUpstream> {
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot bind the simulated upstream")?;
        let addr = listener.local_addr()?;
        let now = clock.now_ms();
        let accounts = scenario
            .accounts
            .iter()
            .map(|spec| {
                Ok(Arc::new(Account {
                    name: spec.name.clone(),
                    note: spec.note.clone(),
                    key: Secret::new(format!("sk-ant-sim-{}", random_hex(24)?))?,
                    organization: organization(&spec.name),
                    ledger: Mutex::new(Ledger::new(spec, &scenario.timescale, now)),
                    served: Default::default(),
                    refused: Default::default(),
                    in_flight: Default::default(),
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let seed = u64::from_le_bytes(hex::decode(random_hex(8)?)?.try_into().expect("8 bytes"));
        let shared = Arc::new(Shared::new(scenario, accounts, seed, clock));
        let (stop, mut stopped) = watch::channel(false);
        let app = server::router(shared.clone());
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
                tracing::warn!(error = %e, "simulated upstream failed");
            }
        });
        Ok(SimUpstream { addr, shared, stop, task })
    }

    /// `http://127.0.0.1:<port>`: the base URL to give the gateway's accounts.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The scenario it started from.
    pub fn scenario(&self) -> &Scenario {
        &self.shared.scenario
    }

    /// The accounts, in scenario order, with their keys.
    pub fn accounts(&self) -> Vec<SimAccount> {
        self.shared
            .accounts
            .iter()
            .map(|a| SimAccount { name: a.name.clone(), note: a.note.clone(), key: a.key.clone() })
            .collect()
    }

    /// Every account's usage as of now.
    pub fn usage(&self) -> Vec<AccountUsage> {
        let now = self.shared.clock.now_ms();
        self.shared
            .accounts
            .iter()
            .map(|a| {
                let mut ledger = a.ledger.lock().clone();
                ledger.roll(now);
                AccountUsage {
                    name: a.name.clone(),
                    windows: ledger
                        .windows()
                        .into_iter()
                        .map(|w| WindowUsage {
                            name: w.name.clone(),
                            utilization: w.utilization(),
                            resets_at_ms: w.resets_at_ms,
                        })
                        .collect(),
                    served: a.served.load(Ordering::Relaxed),
                    refused: a.refused.load(Ordering::Relaxed),
                    in_flight: a.in_flight.load(Ordering::Acquire),
                }
            })
            .collect()
    }

    /// Stops accepting, lets open replies finish for up to 2 s, and returns.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.task).await;
    }
}

impl Drop for SimUpstream {
    fn drop(&mut self) {
        // A handle dropped without `stop` must not leave a server running.
        self.task.abort();
    }
}

/// A stable fake organization id for the account `name`, the same in every run.
fn organization(name: &str) -> String {
    let h = poolgate_wire::ids::fnv1a(name.as_bytes());
    uuid_like(splitmix(h), splitmix(h ^ 1))
}
