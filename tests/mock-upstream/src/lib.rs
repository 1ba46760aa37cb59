//! A mock of Anthropic's Messages API, scripted per account credential.
//!
//! poolgate's end-to-end tests and benchmarks need an upstream that speaks Anthropic's
//! wire format faithfully (JSON and SSE bodies, `request-id`, organization and quota
//! headers, error envelopes) and that fails on cue, per account: a 429 with or without the
//! unified rate-limit headers, a 529, a connection reset before or during a stream, a hang.
//! Reaching the real API is neither possible nor wanted, so this crate is that upstream: a
//! real HTTP server on loopback that the gateway under test forwards to.
//! How an answer is written (bodies, events, error envelopes, quota headers) is
//! `poolgate_wire`'s, shared with the demo's simulated upstream; this crate decides what
//! each account answers and when.
//!
//! Each credential (`x-api-key` or `authorization: Bearer`) is an [`Account`] with a FIFO
//! of one-shot [`Step`]s, a default step and a [`Quota`]. Every request is recorded on
//! arrival, so a test can assert which accounts the gateway tried, in which order.
//!
//! # Examples
//!
//! 1. Start the server and register two accounts.
//! 2. Script the first to be rate limited once; give the second a quota.
//! 3. Point the gateway at [`MockUpstream::base_url`], send requests through it.
//! 4. Assert on [`MockUpstream::served_by`].
//!
//! ```no_run
//! # async fn example() {
//! use poolgate_mock_upstream::{MockUpstream, Quota, Step};
//!
//! let upstream = MockUpstream::start().await;
//! let a = upstream.account("sk-ant-test-a");
//! let b = upstream.account("sk-ant-test-b");
//! a.push(Step::RateLimited { unified: true, retry_after: Some("30".into()) });
//! b.set_quota(Quota::unified(0.2, 0.1));
//! // … a gateway configured with both keys and `upstream.base_url()` serves a request …
//! assert_eq!(upstream.served_by(), ["sk-ant-test-a", "sk-ant-test-b"]);
//! # }
//! ```
//!
//! # OAuth seats
//!
//! A Claude subscription login is a [`Seat`] of the mock's [`OAuth`] authority, bound to
//! one scripted [`Account`]: every access token the seat is ever given answers as that
//! account (and is recorded under its credential), so a test scripts the account once
//! while the gateway refreshes underneath. The authority serves Anthropic's OAuth routes
//! on the same address:
//!
//! - `POST /v1/oauth/token`: `refresh_token` grants (rotating, single-use refresh tokens)
//!   and `authorization_code` grants (PKCE S256), as a form or as JSON; its behaviour is
//!   set with [`OAuth::set_mode`].
//! - `GET /api/oauth/usage`: the seat account's [`Quota`] as percents and limits.
//! - `GET /api/oauth/profile`: the seat's [`Identity`].
//!
//! An expired access token gets Anthropic's 401 ([`EXPIRED`]) on the API routes.
//!
//! ```no_run
//! # async fn example() {
//! use std::time::Duration;
//! use poolgate_mock_upstream::{Identity, MockUpstream, Step};
//!
//! let upstream = MockUpstream::start().await;
//! let account = upstream.account("seat-a");
//! let seat = upstream.oauth().seat(&account, Identity::new("alice"));
//! seat.set_lifetime(Duration::from_secs(2));
//! let tokens = seat.issue(); // written to the gateway's credentials file
//! account.push(Step::Overloaded); // whichever token the gateway uses next
//! // … the gateway serves requests past the expiry, refreshing on the way …
//! assert!(upstream.oauth().refreshes() >= 1);
//! assert!(upstream.served_by().iter().all(|c| c == "seat-a"));
//! # let _ = tokens;
//! # }
//! ```
#![deny(missing_docs)]

mod chunks;
mod conn;
mod oauth;
mod quota;
mod reply;
mod script;
mod server;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use oauth::{EXPIRED, Identity, OAUTH_BETA, OAuth, SCOPES, Seat, TokenMode, TokenRequest, Tokens, pkce_challenge};
pub use poolgate_wire::ratelimit::{Quota, Window, now_s, rfc3339};
pub use reply::{DEFAULT_TEXT, MODELS};
pub use script::{Account, Step};

/// Server-wide settings; [`MockUpstream::start`] uses [`Config::default`].
#[derive(Clone, Debug)]
pub struct Config {
    /// Every credential is a valid account, created on first use (for benchmarks that
    /// point many gateway accounts at one mock). A missing credential is still a 401.
    pub accept_any: bool,
    /// Wait this long before answering every authenticated request (time to first byte).
    pub latency_ms: u64,
    /// Wait this long between SSE events of normal replies.
    pub chunk_delay_ms: u64,
    /// The quota every new account starts with.
    pub default_quota: Option<Quota>,
    /// Record requests for [`MockUpstream::requests`]. On by default; a long benchmark run
    /// turns it off so memory stays flat.
    pub record: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config { accept_any: false, latency_ms: 0, chunk_delay_ms: 0, default_quota: None, record: true }
    }
}

/// The upstream's connections, as [`MockUpstream::connections`] counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connections {
    /// Accepted so far.
    pub opened: u64,
    /// Still open.
    pub open: u64,
}

/// One request as the mock received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `GET`, `POST`, `HEAD`, …
    pub method: String,
    /// The path with its query string, e.g. `/v1/messages?beta=true`.
    pub path: String,
    /// The credential of the account that answered: the API key or bearer token it is
    /// registered under. For a seat's OAuth access token it is the credential of the
    /// seat's [`Account`], whichever token was used, so [`MockUpstream::served_by`] stays
    /// stable as tokens rotate (the token itself is in [`Recorded::bearer`]). `""` if
    /// there was no credential, or it was unknown or an expired access token.
    pub credential: String,
    /// The exact token of `authorization: Bearer`, when that is what authenticated the
    /// request (`None` with an `x-api-key`, which takes precedence, or with neither).
    pub bearer: Option<String>,
    /// Headers as received (lowercase names), in order; non-UTF-8 bytes are replaced.
    pub headers: Vec<(String, String)>,
    /// The request body.
    pub body: bytes::Bytes,
}

impl Recorded {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// A running mock upstream. Serves until dropped.
pub struct MockUpstream {
    shared: Arc<server::Shared>,
    tally: Arc<conn::Tally>,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MockUpstream {
    /// Binds 127.0.0.1:0 and serves until dropped (the server task is aborted on drop).
    ///
    /// # Panics
    /// Outside a Tokio runtime, or if loopback cannot be bound.
    pub async fn start() -> MockUpstream {
        MockUpstream::start_with(Config::default()).await
    }

    /// Like [`MockUpstream::start`], with settings.
    ///
    /// # Panics
    /// Outside a Tokio runtime, or if loopback cannot be bound.
    pub async fn start_with(config: Config) -> MockUpstream {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        MockUpstream::bind(addr, config)
            .await
            .unwrap_or_else(|e| panic!("failed to bind the mock upstream on `{addr}`: {e}"))
    }

    /// Binds `addr` and serves until dropped.
    pub async fn bind(addr: SocketAddr, config: Config) -> io::Result<MockUpstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(server::Shared::new(config));
        let tally = Arc::new(conn::Tally::default());
        let task = tokio::spawn(conn::serve(listener, server::router(shared.clone()), tally.clone()));
        Ok(MockUpstream { shared, tally, addr, task })
    }

    /// The base URL to point a client at, e.g. `"http://127.0.0.1:41234"`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Registers (or returns) the account answering to `credential` (an API key or a
    /// bearer token).
    pub fn account(&self, credential: &str) -> Account {
        self.shared.account(credential)
    }

    /// The OAuth authority: seats, their tokens, and the token, usage and profile routes.
    pub fn oauth(&self) -> OAuth {
        OAuth { inner: self.shared.oauth.clone() }
    }

    /// Every request received, in arrival order, except those to the OAuth routes
    /// (`/v1/oauth/token`, `/api/oauth/usage`, `/api/oauth/profile`), which
    /// [`OAuth::token_requests`] and [`OAuth::usage_requests`] account for, so a gateway's
    /// background refreshes do not interleave with the traffic a test asserts on.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.records().clone()
    }

    /// The usage every whole Messages reply reported (a reply the script
    /// cuts is not counted), in order. A request with a `cache_control`
    /// breakpoint reports cache use: twice its input tokens read, a quarter
    /// (and one) written.
    pub fn reported_usage(&self) -> Vec<poolgate_wire::usage::Usage> {
        self.shared.reported.lock().clone()
    }

    /// The credentials that served each request, in arrival order (unknown credentials
    /// appear as `""`).
    pub fn served_by(&self) -> Vec<String> {
        self.shared.records().iter().map(|r| r.credential.clone()).collect()
    }

    /// Forgets the requests received so far (accounts and their scripts stay).
    pub fn clear_requests(&self) {
        self.shared.records().clear();
    }

    /// Connections accepted so far and, of those, how many have ended (closed by
    /// either side): a gateway that cancels an upstream request closes its connection,
    /// so `open` falling back shows the request was cancelled.
    pub fn connections(&self) -> Connections {
        let closed = self.tally.closed.load(std::sync::atomic::Ordering::Acquire);
        let opened = self.tally.opened.load(std::sync::atomic::Ordering::Acquire);
        Connections { opened, open: opened.saturating_sub(closed) }
    }

    /// The settings this server runs with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockUpstream").field("addr", &self.addr).finish_non_exhaustive()
    }
}
