//! `poolgate simulate`: the same workload replayed through several
//! configurations' **real gateways** on virtual time, side by side.
//!
//! Each configuration is loaded as `serve` loads it (its chain — built-ins or
//! `.wasm` files — its cooldowns, admission, affinity and fallbacks); only
//! where its requests go changes: every account is a simulated one
//! ([`upstream::Provider`], behind the gateway's own `Transport` seam) whose
//! windows fill and reset, and the gateway reads a manual clock that the
//! replay moves from one request's time to the next. Each request goes
//! through [`crate::gateway::request::forward`] — the function a served
//! request goes through — and what the gateway decided is read from its own
//! decision record. Nothing of the routing is implemented here a second
//! time: this module only feeds requests, moves the clock and counts.
//!
//! - [`trace`]: the workload format; [`generate`]: workloads made from a seed;
//!   [`import`]: a recorded day, from the gateway's decision records;
//! - [`plans`]: what each simulated account holds;
//! - [`upstream`]: the simulated provider (quota, prompt cache, fallback);
//! - [`report`]: the figures, the side-by-side table and JSON, and the plots;
//!   [`png`]: the plots rasterized.
//!
//! Requests are replayed one at a time, each answered at once: the replay
//! measures where requests go and what that costs, not latency, so in-flight
//! limits and the admission queue never engage (stated in docs/simulator.md).

pub mod generate;
pub mod import;
pub mod plans;
pub mod png;
pub mod report;
pub mod trace;
pub mod upstream;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri};
use http_body_util::BodyExt;

use crate::clock::Clock;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::gateway::request::record::Ending;
use crate::gateway::request::{Api, Incoming, forward};
use crate::policy::{MemoryState, PolicyEngine};
use plans::Plans;
use report::{Figures, Sample, Tally};
use trace::Entry;
use upstream::Provider;

/// Where every simulation starts: Monday 2026-01-05, 00:00 UTC.
pub const START_MS: u64 = 1_767_571_200_000;
const DAY_MS: u64 = 86_400_000;
/// The least deadline a stage gets in a replay, ms.
pub const REPLAY_DEADLINE_MS: u64 = 2_000;
/// How often each account's windows are sampled for the plots.
pub const SAMPLE_EVERY_MS: u64 = 15 * 60 * 1000;

/// One configuration's run: its figures, what its stages took, and the
/// samples its plots are drawn from.
pub struct Run {
    /// What happened to the workload.
    pub figures: Figures,
    /// Mean time of each stage per decision, µs (measured, so it varies from
    /// run to run: kept out of [`Figures`], which are reproducible).
    pub stage_us: Vec<(String, f64)>,
    /// The accounts' windows over time.
    pub samples: Vec<Sample>,
}

/// What to replay, shared by every configuration compared.
pub struct Replay<'a> {
    /// The requests.
    pub workload: &'a [Entry],
    /// When the replay ends, ms from the start: a generated workload's last
    /// day's end; for a trace, midnight after its last request (so the quiet
    /// end of the last day counts, and a week that starts with the windows
    /// ends at their reset).
    pub end_ms: u64,
    /// The accounts' plans.
    pub plans: &'a Plans,
}

impl Replay<'_> {
    /// Midnight after the last request of `workload`.
    pub fn midnight_after(workload: &[Entry]) -> u64 {
        (workload.last().map_or(0, |e| e.t_ms) / DAY_MS + 1) * DAY_MS
    }
}

/// Replays a workload through the gateway `config_path` describes.
pub async fn run(label: &str, config_path: &Path, replay: &Replay<'_>, engine: Arc<PolicyEngine>) -> Result<Run> {
    let Replay { workload, end_ms: end, plans } = *replay;
    let (mut config, _) = Config::read(config_path)?;
    let keys = tempdir()?;
    let ids = simulated(&mut config, &keys)?;
    let clock = Clock::manual(START_MS);
    let account_plans: Vec<_> = ids.iter().enumerate().map(|(i, id)| plans.of(id, i, ids.len())).collect();
    let api_keys: Vec<bool> = config.accounts.iter().map(|a| a.kind == crate::config::AccountKind::ApiKey).collect();
    let provider = Arc::new(Provider::new(&ids, &account_plans, &api_keys, &clock));
    let state = Arc::new(MemoryState::with_limits(config.state_limits()));
    let gw = Gateway::with_transport_and_clock(config, engine, state, provider.clone(), clock.clone())
        .await
        .with_context(|| format!("{}: the gateway did not start", config_path.display()))?;
    let index: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
    let mut tally = Tally::new(label, &ids);
    // A first reading for every seat before the first request, as `serve`
    // heals at start.
    crate::gateway::seat_keeper::heal(&gw).await;
    let mut between = Between::new(&gw, clock.clone(), provider.clone());
    for entry in workload {
        between.run_until(&gw, entry.t_ms).await;
        provider.replaying(entry);
        let headroom = provider.headroom(&entry.model);
        let status = send(&gw, entry).await;
        settle(&gw).await;
        let record = gw.decisions.latest(1).into_iter().next().context("the gateway kept no record")?;
        let answered = provider.answered();
        let head = record.attempts.first().and_then(|a| a.decision.order.head()).and_then(|h| index.get(h).copied());
        tally.count(entry, &record, status, &answered, head, &headroom);
    }
    between.run_until(&gw, end).await;
    let mut samples = between.samples;
    samples.push(Sample { t_ms: end, windows: provider.utilization() });
    let wasted = provider.wasted();
    tally.finish(wasted, &account_plans);
    let _ = std::fs::remove_dir_all(&keys);
    let stage_us = tally.stage_means();
    Ok(Run { figures: tally.figures, stage_us, samples })
}

/// What happens between two requests, in time order: the seat keeper's
/// check every `[oauth] check_interval_ms` (refreshes due, usage polls of
/// idle seats — its own code, at its times) and a sample of every account's
/// windows for the plots every [`SAMPLE_EVERY_MS`].
struct Between {
    clock: Clock,
    provider: Arc<Provider>,
    every_check: u64,
    next_check: u64,
    next_sample: u64,
    samples: Vec<Sample>,
}

impl Between {
    fn new(gw: &Gateway, clock: Clock, provider: Arc<Provider>) -> Between {
        let every_check = gw.generation().config.oauth.check_interval_ms.max(1);
        Between { clock, provider, every_check, next_check: every_check, next_sample: 0, samples: Vec::new() }
    }

    /// Runs what is due up to `t_ms` (from the start) and moves the clock there.
    async fn run_until(&mut self, gw: &Gateway, t_ms: u64) {
        loop {
            let next = self.next_check.min(self.next_sample);
            if next > t_ms {
                break;
            }
            self.move_to(next);
            if next == self.next_sample {
                self.samples.push(Sample { t_ms: next, windows: self.provider.utilization() });
                self.next_sample += SAMPLE_EVERY_MS;
            }
            if next == self.next_check {
                let before = gw.generation().config.oauth.refresh_before_ms;
                crate::gateway::seat_keeper::refresh_due(gw, before).await;
                crate::gateway::seat_keeper::poll_usage(gw).await;
                self.next_check += self.every_check;
            }
        }
        self.move_to(t_ms);
    }

    fn move_to(&self, t_ms: u64) {
        self.clock.advance(Duration::from_millis((START_MS + t_ms).saturating_sub(self.clock.now_ms())));
    }
}

/// Points every account of `config` at the simulated provider — an OAuth
/// account as a seat with a credentials file, an API key as a key file, in
/// `keys` — and drops what needs the operator's secrets
/// (client keys, the admin token, fallback keys): the replay calls the
/// request path directly. Returns the account ids, in order.
fn simulated(config: &mut Config, keys: &Path) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for (i, a) in config.accounts.iter_mut().filter(|a| a.enabled).enumerate() {
        (a.api_key_env, a.credentials, a.token_file) = (None, None, None);
        if a.kind == crate::config::AccountKind::Oauth {
            // A seat, as `serve` keeps one: the seat keeper polls its usage.
            // Its token outlives any replay, so it never refreshes.
            let path = keys.join(format!("{i}.json"));
            let stored = serde_json::json!({"access_token": format!("sim-token-{i}"), "refresh_token": format!("sim-refresh-{i}"),
                "expires_at_ms": START_MS + 10 * 365 * DAY_MS, "scopes": ["user:inference"]});
            std::fs::write(&path, stored.to_string())?;
            a.credentials = Some(path);
        } else {
            let key = keys.join(format!("{i}.key"));
            std::fs::write(&key, format!("sim-key-{i}"))?;
            a.token_file = Some(key);
        }
        a.base_url = Some(upstream::base_url(i));
        ids.push(a.id.clone());
    }
    config.accounts.retain(|a| a.enabled);
    for f in &mut config.fallback {
        f.api_key_env = None;
    }
    // A replay judges decisions, not speed: a stage slowed by a busy machine
    // must not time out and change one (the report would differ run to run).
    // The stage times are measured and printed beside the report instead.
    config.policy.timeout_ms = config.policy.timeout_ms.max(REPLAY_DEADLINE_MS);
    for stage in &mut config.policy.chain {
        stage.timeout_ms = stage.timeout_ms.map(|t| t.max(REPLAY_DEADLINE_MS));
    }
    // Never the running gateway's state file: a replay starts from nothing
    // learned and leaves nothing behind.
    (config.state.file, config.state.file_path) = (Some(String::new()), None);
    (config.ledger.file, config.ledger.file_path, config.ledger.url) = (Some(String::new()), None, None);
    config.server.client_keys.clear();
    (config.server.admin_token_env, config.server.admin_token_sha256) = (None, None);
    Ok(ids)
}

/// A private directory for the simulated keys.
fn tempdir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("poolgate-simulate-{}", crate::random::random_hex(8)?));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Sends `entry` through the request path and reads the answer to its end
/// (which is what finishes a relayed request); the status the client got.
async fn send(gw: &Arc<Gateway>, entry: &Entry) -> u16 {
    let body = serde_json::json!({
        "model": entry.model,
        "max_tokens": entry.output_tokens.max(1),
        "stream": entry.stream,
        "messages": [{"role": "user", "content": "simulated"}],
    });
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    if let Ok(v) = HeaderValue::from_str(&entry.session) {
        headers.insert("x-claude-code-session-id", v);
    }
    let incoming = Incoming {
        id: gw.next_request_id(),
        method: Method::POST,
        uri: Uri::from_static("/v1/messages"),
        headers,
        body: Bytes::from(body.to_string()),
        client: entry.client.clone(),
        dialect: Default::default(),
        connection: None,
    };
    let response = forward(gw.clone(), Api::Messages, incoming).await;
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

/// Waits until no plugin call is running: an `observe` the request left
/// running on the call threads has finished before the next request is
/// ranked, so what a stage remembers never depends on the machine's speed.
/// Bounded: a call is cut at its deadline, so anything still running after
/// twice the replay's deadline is not a call, and the replay goes on.
async fn settle(gw: &Gateway) {
    let started = crate::clock::machine_instant();
    while gw.generation().chain.calls_running() {
        if started.elapsed() > Duration::from_millis(2 * REPLAY_DEADLINE_MS) {
            tracing::warn!("a plugin call still runs past twice its deadline; the replay goes on without it");
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Whether a record's ending is the pool answering 429 by itself.
pub fn parked(ending: Ending) -> bool {
    matches!(ending, Ending::Parked | Ending::QueueFull | Ending::QueueTimeout)
}
