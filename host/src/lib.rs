//! poolgate: a gateway for LLM APIs that routes every request to the best account
//! of a pool, decided by a chain of sandboxed WebAssembly policy plugins.
//!
//! Where things live:
//! - [`policy`] — the plugin runtime: engine, sandbox, instance pools, and the chain
//!   (`policy::chain` is where a request's order is decided).
//! - [`account`] — the account model: quota windows, statuses, cooldowns, as plain data.
//! - [`gateway`] — the HTTP proxy around the chain: `gateway::http` (listener,
//!   connections, routes) above `gateway::request` (one request as phases;
//!   the chain is called in `request::Exchange::rank`).
//! - [`learned`] — what the gateway knows about each account (state, quota
//!   readings, the cooldown plan, the facts replicas share), below everything
//!   that routes.
//! - [`shared`] — replicas sharing learned state and plugin state (Redis).
//! - [`ledger`] — the usage ledger: what each client key used and what it cost,
//!   kept durably off the request path (SQLite).
//! - [`telemetry`] — traces to an OpenTelemetry backend over OTLP, built from
//!   each request's record when it ends (`gateway::request::trace`).
//! - [`oauth`] — subscription seats: credentials, token endpoint, refresh.
//! - [`clock`], [`https`], [`metrics`] — leaves: the time, the one HTTPS
//!   client constructor, the Prometheus metrics.
//! - [`config`] — the TOML configuration.
//! - [`logs`] — the stderr lines, as text or JSON, one line per event.
//! - [`case`] — the JSON case format of `poolgate rank` and `poolgate plugin test`.
//! - [`sim`] — a simulated Anthropic upstream whose quota moves (`poolgate demo`).
//! - [`simulate`] — `poolgate simulate`: a workload replayed through real gateways
//!   on virtual time, compared side by side.
//! - [`random`] — random keys and ids, and the cheap pseudo-random step the demo varies with.
//! - [`fixtures`] — a plugin's fixture files, run through the real WASM path (`poolgate plugin test`).
//! - [`cli`] — the command line: `serve`, `check`, `demo`, `plugin`, `rank`, `login`, ….

#![deny(missing_docs)]

pub mod account;
pub mod case;
pub mod cli;
pub mod clock;
pub mod config;
pub mod fixtures;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod https;
pub mod learned;
pub mod ledger;
pub mod logs;
pub mod metrics;
pub mod oauth;
pub mod policy;
pub mod random;
pub mod shared;
pub mod sim;
pub mod simulate;
pub mod telemetry;

/// The components built from `plugins/*` and `tests/guests/*` by `build.rs`.
pub mod artifacts {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));

    /// The path of the test guest `name` (from `tests/guests/<name>`).
    pub fn test_guest(name: &str) -> Option<&'static str> {
        TEST_GUESTS.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }
}
