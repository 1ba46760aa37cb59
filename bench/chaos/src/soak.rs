//! The soak: thousands of slow streams held open through one gateway at
//! once, round after round — every stream must complete, and the gateway's
//! memory and descriptors must come back to where they were after each round
//! closes (flat across rounds, not growing).
//!
//! A Claude Code turn holds its connection for seconds to minutes, so a team
//! gateway's real load is thousands of open streams. Half the streams here
//! come on HTTP/1.1 connections of their own, half multiplexed 100 to an
//! HTTP/2 connection (as from a load balancer in front): the open-file limit
//! of one process here is 20,000, and 10,000 client connections plus 10,000
//! upstream connections would not fit in the gateway's.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::StreamExt;
use poolgate_mock_upstream::{Config, MockUpstream, Step};

use crate::grammar::{self, Ending};
use crate::process::Gateway;

/// What a soak does.
#[derive(Clone, Debug)]
pub struct SoakSettings {
    /// The `poolgate` binary.
    pub gateway: PathBuf,
    /// Streams open at once.
    pub streams: usize,
    /// Milliseconds between two events of a stream (a stream has ~13).
    pub event_ms: u64,
    /// Rounds of opening them all, holding them until they end, and closing.
    pub rounds: usize,
    /// How long after a round's last stream its "after" figures are taken:
    /// past the gateway's idle timeout for upstream connections (90 s), what
    /// the round left is what stays.
    pub settle: Duration,
    /// Where the run keeps its files.
    pub dir: PathBuf,
}

/// One round's figures.
#[derive(Clone, Debug, Default)]
pub struct Round {
    /// Streams that ended with `message_stop`.
    pub complete: u64,
    /// Streams that failed or broke.
    pub failed: u64,
    /// Seconds to open them all (until each had its first byte).
    pub open_s: f64,
    /// Time to the first byte, ms: p50, p99.
    pub ttfb_ms: (f64, f64),
    /// The gateway's resident memory, MiB: before the round, at its
    /// height, and [`SoakSettings::settle`] after the last stream closed.
    pub rss_mib: (f64, f64, f64),
    /// The gateway's open descriptors: before, at the height, after.
    pub fds: (usize, usize, usize),
}

/// A soak's figures.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// Streams a round.
    pub streams: usize,
    /// The gateway's memory before the first stream, MiB.
    pub idle_rss_mib: f64,
    /// Each round.
    pub rounds: Vec<Round>,
}

impl SoakReport {
    /// What the soak must show; each broken promise, named: every stream
    /// complete, and what a round leaves behind not growing round over round
    /// (after-round memory within 10 % or 8 MiB of the first round's, the
    /// descriptors within 16).
    pub fn verdict(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let Some(first) = self.rounds.first() else { return vec!["no round ran".into()] };
        for (i, r) in self.rounds.iter().enumerate() {
            if r.failed > 0 || r.complete != self.streams as u64 {
                bad.push(format!(
                    "round {i}: {} of {} streams complete, {} failed",
                    r.complete, self.streams, r.failed
                ));
            }
            let bound = (first.rss_mib.2 * 0.10).max(8.0);
            if r.rss_mib.2 > first.rss_mib.2 + bound {
                bad.push(format!("round {i}: {:.1} MiB after, first round {:.1}", r.rss_mib.2, first.rss_mib.2));
            }
            if r.fds.2 > first.fds.2 + 16 {
                bad.push(format!("round {i}: {} fds after, first round {}", r.fds.2, first.fds.2));
            }
        }
        bad
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "soak: {} slow streams at once, {} rounds; idle RSS {:.1} MiB",
            self.streams,
            self.rounds.len(),
            self.idle_rss_mib
        )?;
        writeln!(
            f,
            "  round  complete  failed  open(s)  ttfb p50/p99 ms   RSS before/peak/after MiB   fds before/peak/after  KiB/stream"
        )?;
        for (i, r) in self.rounds.iter().enumerate() {
            let per = (r.rss_mib.1 - r.rss_mib.0) * 1024.0 / self.streams.max(1) as f64;
            writeln!(
                f,
                "  {i:>5}  {:>8}  {:>6}  {:>7.1}  {:>7.1} / {:<7.1}  {:>7.1} / {:>7.1} / {:>7.1}  {:>6} / {:>5} / {:>5}  {per:>10.1}",
                r.complete,
                r.failed,
                r.open_s,
                r.ttfb_ms.0,
                r.ttfb_ms.1,
                r.rss_mib.0,
                r.rss_mib.1,
                r.rss_mib.2,
                r.fds.0,
                r.fds.1,
                r.fds.2
            )?;
        }
        let verdict = self.verdict();
        match verdict.is_empty() {
            true => writeln!(f, "verdict: held"),
            false => writeln!(f, "verdict: BROKEN — {}", verdict.join("; ")),
        }
    }
}

/// Runs the soak.
pub async fn soak(s: &SoakSettings) -> Result<SoakReport> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::fs::create_dir_all(&s.dir)?;
    let mock = MockUpstream::start_with(Config { accept_any: true, record: false, ..Config::default() }).await;
    let mut config = String::from("[server]\nadmin_token_env = \"SOAK_ADMIN\"\n\n");
    let mut env = vec![("SOAK_ADMIN".to_string(), "soak-admin".to_string())];
    for i in 0..8 {
        let credential = format!("soak-key-{i}");
        mock.account(&credential).set_default(Step::SlowStream { chunk_delay_ms: s.event_ms });
        config.push_str(&format!(
            "[[accounts]]\nid = \"k{i}\"\napi_key_env = \"SOAK_K{i}\"\nbase_url = \"{}\"\n\n",
            mock.base_url()
        ));
        env.push((format!("SOAK_K{i}"), credential));
    }
    let path = s.dir.join("poolgate.toml");
    std::fs::write(&path, config)?;
    let gw = Gateway::start(&s.gateway, &path, &env, &s.dir.join("state"))?;
    // A few requests first, so plugin instances and pools are as a day's use leaves them.
    let mut report = SoakReport { streams: s.streams, ..SoakReport::default() };
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.idle_rss_mib = gw.rss_kib().0 as f64 / 1024.0;
    for _ in 0..s.rounds {
        report.rounds.push(round(&gw, s).await);
    }
    Ok(report)
}

/// Opens every stream (ramping at 1,000 a second), samples the gateway while
/// they run, and waits [`SoakSettings::settle`] after the last one ends.
async fn round(gw: &Gateway, s: &SoakSettings) -> Round {
    let mut r = Round { rss_mib: (gw.rss_kib().0 as f64 / 1024.0, 0.0, 0.0), ..Round::default() };
    r.fds.0 = gw.fds();
    let h1 = client(false);
    let h2: Vec<_> = (0..s.streams.div_ceil(200)).map(|_| client(true)).collect();
    let started = Instant::now();
    let first_bytes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(s.streams);
    for i in 0..s.streams {
        let http = if i % 2 == 0 { h1.clone() } else { h2[i / 200].clone() };
        let (url, first) = (gw.url.clone(), first_bytes.clone());
        tasks.push(tokio::spawn(async move { stream(&http, &url, &first).await }));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut open_s = None;
    let mut peak = (0u64, 0usize);
    while !tasks.iter().all(|t| t.is_finished()) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = (peak.0.max(gw.rss_kib().0), peak.1.max(gw.fds()));
        if open_s.is_none() && first_bytes.load(Ordering::Relaxed) == s.streams as u64 {
            open_s = Some(started.elapsed().as_secs_f64());
        }
    }
    let mut ttfb = Vec::with_capacity(s.streams);
    for t in tasks {
        match t.await {
            Ok(Some(first_ms)) => {
                r.complete += 1;
                ttfb.push(first_ms);
            }
            _ => r.failed += 1,
        }
    }
    drop((h1, h2));
    tokio::time::sleep(s.settle).await;
    ttfb.sort_by(f64::total_cmp);
    let at = |q: f64| ttfb.get(((ttfb.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    r.ttfb_ms = (at(0.5), at(0.99));
    r.open_s = open_s.unwrap_or(f64::NAN);
    r.rss_mib.1 = peak.0 as f64 / 1024.0;
    r.rss_mib.2 = gw.rss_kib().0 as f64 / 1024.0;
    r.fds.1 = peak.1;
    r.fds.2 = gw.fds();
    r
}

/// An HTTP/1.1 client that keeps no idle connection (so every stream opens
/// its own, as separate developers' clients do), or an HTTP/2 client whose one
/// connection carries its streams.
fn client(h2: bool) -> reqwest::Client {
    let b = reqwest::Client::builder().timeout(Duration::from_secs(600));
    let b = if h2 { b.http2_prior_knowledge() } else { b.http1_only().pool_max_idle_per_host(0) };
    b.build().expect("a reqwest client")
}

/// One stream, read to its end: its time to first byte, ms, when it ended
/// whole.
async fn stream(http: &reqwest::Client, url: &str, first: &AtomicU64) -> Option<f64> {
    let body = serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 256, "stream": true,
        "messages": [{"role": "user", "content": "Tell me a long story."}]});
    let sent = Instant::now();
    let resp = http
        .post(format!("{url}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .ok()?;
    if resp.status() != 200 {
        return None;
    }
    let mut chunks = resp.bytes_stream();
    let mut text = Vec::new();
    let mut ttfb = None;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.ok()?;
        if ttfb.is_none() {
            ttfb = Some(sent.elapsed().as_secs_f64() * 1e3);
            first.fetch_add(1, Ordering::Relaxed);
        }
        text.extend_from_slice(&chunk);
    }
    (grammar::messages(&String::from_utf8_lossy(&text)) == Ending::Whole).then_some(ttfb?)
}
