//! How a figure is taken: a process's CPU time and memory from /proc, latency
//! at concurrency 1, throughput at concurrency N, time to a stream's first byte.
//! Every connection sets TCP_NODELAY (the mock, poolgate and the pass-through
//! do on their side).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::request::Request;

/// utime + stime of `pid`, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// A field of `/proc/<pid>/status`, in KiB.
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s.lines().find(|l| l.starts_with(field)).context("status field")?;
    Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
}

/// Read and write system calls `pid` has made (`syscr`, `syscw` of `/proc/<pid>/io`):
/// reads include recv, writes include writev and sendmsg.
pub fn syscalls(pid: u32) -> Result<(u64, u64)> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let field = |name: &str| -> Result<u64> {
        let line = io.lines().find_map(|l| l.strip_prefix(name)).context("io field")?;
        Ok(line.trim().parse()?)
    };
    Ok((field("syscr:")?, field("syscw:")?))
}

/// Open descriptors of `pid`.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// CPU seconds of a process over one phase.
pub struct Phase {
    cpu0: f64,
    pid: u32,
}

impl Phase {
    pub fn start(pid: u32) -> Result<Phase> {
        Ok(Phase { cpu0: cpu_seconds(pid)?, pid })
    }
    pub fn seconds(&self) -> Result<f64> {
        Ok(cpu_seconds(self.pid)? - self.cpu0)
    }
}

pub fn client() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(4096).no_proxy().build()?)
}

/// One request, its body read to the end.
pub async fn one(client: &reqwest::Client, url: &str, req: &Request) -> Result<()> {
    let r = req.to(client, url).send().await?;
    if !r.status().is_success() {
        bail!("status {}", r.status());
    }
    r.bytes().await?;
    Ok(())
}

/// One request: µs to the first byte of its body, then read to the end.
pub async fn first_byte(client: &reqwest::Client, url: &str, req: &Request) -> Result<f64> {
    let t = Instant::now();
    let mut r = req.to(client, url).send().await?;
    if !r.status().is_success() {
        bail!("status {}", r.status());
    }
    r.chunk().await?.context("empty body")?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    while r.chunk().await?.is_some() {}
    Ok(us)
}

/// One whole body, as text (to check a relayed stream).
pub async fn text(client: &reqwest::Client, url: &str, req: &Request) -> Result<String> {
    let r = req.to(client, url).send().await?;
    if !r.status().is_success() {
        bail!("status {}", r.status());
    }
    Ok(r.text().await?)
}

pub fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

pub fn med(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// p50 and p99 (µs) of `n` sequential requests after `n / 10` of warm-up:
/// the whole request, or with `ttfb` the time to its first body byte.
pub async fn latency(client: &reqwest::Client, url: &str, n: usize, req: &Request, ttfb: bool) -> Result<(f64, f64)> {
    for _ in 0..n / 10 {
        one(client, url, req).await?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        if ttfb {
            v.push(first_byte(client, url, req).await?);
        } else {
            let t = Instant::now();
            one(client, url, req).await?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    v.sort_by(f64::total_cmp);
    Ok((pct(&v, 0.5), pct(&v, 0.99)))
}

/// Requests completed by `concurrency` loops over `seconds`: (req/s, count).
pub async fn throughput(
    client: &reqwest::Client,
    url: &str,
    concurrency: usize,
    seconds: f64,
    req: &Arc<Request>,
) -> Result<(f64, u64)> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, req, done, errors) =
            (client.clone(), url.to_string(), req.clone(), done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match one(&client, &url, &req).await {
                    Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let n = done.load(Ordering::Relaxed);
    if errors.load(Ordering::Relaxed) > 0 {
        bail!("{} requests failed", errors.load(Ordering::Relaxed));
    }
    Ok((n as f64 / seconds, n))
}
