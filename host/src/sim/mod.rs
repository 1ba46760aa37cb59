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
//! - [`wire`]: requests read and replies rendered.
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

pub mod quota;
pub mod scenario;
mod server;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use scenario::{AccountSpec, BucketSpec, Latency, Scenario, Timescale, WindowSpec};

use crate::config::Secret;
use crate::gateway::now_ms;
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

impl SimUpstream {
    /// Binds an ephemeral loopback port and serves `scenario`. Every account
    /// gets a fresh random key; its windows start as the scenario says, from now.
    pub async fn start(scenario: Scenario) -> Result<SimUpstream> {
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot bind the simulated upstream")?;
        let addr = listener.local_addr()?;
        let now = now_ms();
        let accounts = scenario
            .accounts
            .iter()
            .map(|spec| {
                Ok(Arc::new(Account {
                    name: spec.name.clone(),
                    note: spec.note.clone(),
                    key: Secret::new(format!("sk-ant-sim-{}", random_hex(24)?))?,
                    organization: uuid_like(splitmix(fnv(&spec.name)), splitmix(fnv(&spec.name) ^ 1)),
                    ledger: Mutex::new(Ledger::new(spec, &scenario.timescale, now)),
                    served: Default::default(),
                    refused: Default::default(),
                    in_flight: Default::default(),
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let seed = u64::from_le_bytes(hex::decode(random_hex(8)?)?.try_into().expect("8 bytes"));
        let shared = Arc::new(Shared::new(scenario, accounts, seed));
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
        let now = now_ms();
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

/// `bytes` random bytes, hex-encoded, from the operating system's CSPRNG (by
/// way of the TLS stack's provider, already linked for upstream HTTPS).
pub fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut buf)
        .map_err(|_| anyhow::anyhow!("the operating system's random source failed"))?;
    Ok(hex::encode(buf))
}

/// SplitMix64: a tiny, well-mixed pseudo-random step. Jitter, reply lengths
/// and the demo's traffic vary with it; nothing secret is derived from it.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A UUID-shaped string from two 64-bit values.
pub fn uuid_like(a: u64, b: u64) -> String {
    let h = format!("{a:016x}{b:016x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// FNV-1a: a stable hash of a name (organization ids stay the same across runs).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
