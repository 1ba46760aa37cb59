//! A chaos run: the real `poolgate serve` binary, two replicas on one Redis,
//! under a mixed workload, while everything around it misbehaves — and one
//! table that says what it survived.
//!
//! poolgate has a test for each fault alone; what a team needs before putting
//! a gateway between every developer and the provider is the faults together,
//! under load, for minutes: the defects the big gateways' trackers are full of
//! (a stream whose blocks interleave, a request failed while an account was
//! free, memory that grows) only show there.
//!
//! The parts: [`world`] starts the mock upstream (six API keys, two of them
//! behind [`forward`]ers that refuse or close connections, two OAuth seats on
//! the mock's token endpoint), the [`fallback`] backend, Redis and the
//! replicas ([`process`]); [`faults`] injects; [`workload`] sends and
//! classifies; [`grammar`] checks every stream; [`report`] reads each outcome
//! against the injector's timeline and prints the table.

pub mod fallback;
pub mod faults;
pub mod forward;
pub mod grammar;
pub mod process;
pub mod report;
pub mod soak;
pub mod workload;
pub mod world;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use parking_lot::Mutex;

use crate::faults::{Pace, Timeline};
use crate::report::{Replica, Report};
use crate::world::{ADMIN, World};

/// What a chaos run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `poolgate` binary.
    pub gateway: PathBuf,
    /// How long the workload runs.
    pub duration: Duration,
    /// Clients sending at once.
    pub clients: usize,
    /// Gateway replicas (two or more share state through a Redis the run
    /// starts, and kills, and starts again).
    pub replicas: usize,
    /// The seed of every random choice.
    pub seed: u64,
    /// The hostile test plugin (`tests/guests/misbehave`), for hot swaps to a
    /// plugin that traps, loops, runs out of memory or answers nonsense.
    pub hostile_plugin: Option<PathBuf>,
    /// Where the run keeps its files.
    pub dir: PathBuf,
}

/// Runs the workload and the injector for `s.duration`; the figures.
pub async fn run(s: &Settings) -> Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = Arc::new(World::start(s).await?);
    let urls: Vec<String> = world.gateways.iter().map(|g| g.url.clone()).collect();
    // Warm up: plugin instances, upstream connections, seat tokens.
    let warm = Instant::now() + Duration::from_secs(2);
    let warmers: Vec<_> =
        (0..s.clients as u64).map(|i| tokio::spawn(workload::client(urls.clone(), warm, s.seed ^ i))).collect();
    for w in warmers {
        let _ = w.await;
    }
    let fds_start: Vec<usize> = world.gateways.iter().map(|g| g.fds()).collect();

    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let start = Instant::now();
    let until = start + s.duration;
    let pace = Pace {
        until,
        exhaust_every: Duration::from_secs(20),
        exhaust_for: Duration::from_secs(4),
        reload_every: Duration::from_secs(3),
        redis_every: Duration::from_secs(15),
    };
    let injector = tokio::spawn(faults::inject(world.clone(), timeline.clone(), pace, s.seed));
    let clients: Vec<_> = (0..s.clients as u64)
        .map(|i| tokio::spawn(workload::client(urls.clone(), until, s.seed.wrapping_add(i + 1))))
        .collect();
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.extend(c.await?);
    }
    injector.await?;
    let duration = start.elapsed();
    // Let connections the clients dropped close before counting descriptors.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut report, signalled) = {
        let timeline = timeline.lock();
        (Report::new(&outcomes, &timeline, duration), timeline.reloads.clone())
    };
    for (r, (g, fds_start)) in world.gateways.iter().zip(fds_start).enumerate() {
        let (rss, peak) = g.rss_kib();
        report.replicas.push(Replica {
            peak_rss_mib: peak as f64 / 1024.0,
            rss_end_mib: rss as f64 / 1024.0,
            fds: (fds_start, g.fds()),
            panics: g.panics(),
            alive: g.alive(),
            reloads: reloads(&g.url).await,
            signalled: signalled.get(&r).copied().unwrap_or_default(),
        });
    }
    Ok(report)
}

/// `poolgate_reloads_total` by result: (ok, error).
async fn reloads(url: &str) -> (u64, u64) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("a reqwest client");
    let text = match http.get(format!("{url}/metrics")).bearer_auth(ADMIN).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let value = |series: &str| {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(0.0) as u64
    };
    (value("poolgate_reloads_total{result=\"ok\"}"), value("poolgate_reloads_total{result=\"error\"}"))
}
