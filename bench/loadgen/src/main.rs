//! `poolgate-loadgen`: what poolgate costs, measured against a direct call in the
//! same run.
//!
//! It starts the mock upstream and `poolgate serve` (release binaries, separate
//! processes) and drives the same load (a) straight at the mock and (b) through
//! poolgate with the default chain over 8 accounts:
//! - concurrency 1: latency p50/p99 of each path, and the difference poolgate adds;
//! - concurrency 32: throughput of each path, and the ratio;
//! - the gateway's own CPU time per request (utime+stime of the process over the
//!   run, divided by requests served) — the fairest figure on a shared 2-core box;
//! - peak RSS of the gateway holding 1,000 concurrent open SSE streams.
//!
//! Every connection sets TCP_NODELAY (the mock and poolgate do on their side).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures_util::StreamExt;

#[derive(Parser)]
struct Args {
    /// Directory holding the release binaries `poolgate` and `poolgate-mock-upstream`.
    #[arg(long, default_value = "target/release")]
    bin: PathBuf,
    /// Sequential requests per path at concurrency 1.
    #[arg(long, default_value_t = 4000)]
    requests: usize,
    /// Seconds of load per path at concurrency 32.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Concurrent open SSE streams for the memory figure.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Request bodies stream (SSE) instead of JSON.
    #[arg(long)]
    sse: bool,
    /// Also measure a plain HAProxy hop in front of the mock (needs `haproxy`
    /// on PATH), as a reference for what any proxy hop costs on this machine.
    #[arg(long)]
    haproxy: bool,
    /// The chain to run, as comma-separated built-ins (`skip-exhausted,headroom`);
    /// default: the gateway's default chain. Naming it lets two builds with
    /// different defaults be compared like for like.
    #[arg(long)]
    chain: Option<String>,
    /// Share state through this Redis server (`[state] backend = "redis"`),
    /// to measure what the shared backend costs against the embedded one.
    #[arg(long)]
    redis: Option<String>,
    /// `max_in_flight` of every account (with `--redis`, each request then
    /// takes a lease in Redis too).
    #[arg(long)]
    max_in_flight: Option<u32>,
}

/// What the gateway's config varies by.
struct Setup<'a> {
    chain: Option<&'a str>,
    redis: Option<&'a str>,
    max_in_flight: Option<u32>,
}

struct Proc {
    child: Child,
    url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a process and waits for the line announcing its URL.
fn start(mut cmd: Command, marker: &str) -> Result<Proc> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("spawn")?;
    let (tx, rx) = std::sync::mpsc::channel();
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        let marker = marker.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(rest) = line.split(&marker).nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        });
    }
    let url = rx.recv_timeout(Duration::from_secs(60)).context("process did not announce its address")?;
    Ok(Proc { child, url })
}

fn mock(bin: &Path, chunk_delay_ms: u64) -> Result<Proc> {
    let mut cmd = Command::new(bin.join("poolgate-mock-upstream"));
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--accept-any",
        "--utilization",
        "0.2",
        "--chunk-delay-ms",
        &chunk_delay_ms.to_string(),
    ]);
    start(cmd, "listening on ")
}

fn gateway(bin: &Path, upstream: &str, dir: &std::path::Path, setup: &Setup<'_>) -> Result<Proc> {
    let mut config = String::from("[server]\ndecisions_kept = 200\n\n[gateway]\nqueue_max = 4096\n\n");
    if let Some(url) = setup.redis {
        let prefix = format!("loadgen-{}:", std::process::id());
        config.push_str(&format!("[state]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\n\n"));
    }
    for stage in setup.chain.into_iter().flat_map(|c| c.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
        config.push_str(&format!("[[policy.chain]]\nplugin = \"builtin:{stage}\"\n\n"));
    }
    let limit = setup.max_in_flight.map(|n| format!("max_in_flight = {n}\n")).unwrap_or_default();
    for i in 0..8 {
        config.push_str(&format!(
            "[[accounts]]\nid = \"acct-{i}\"\napi_key_env = \"LOADGEN_KEY_{i}\"\nbase_url = \"{upstream}\"\n{limit}\n"
        ));
    }
    let path = dir.join("poolgate.toml");
    std::fs::write(&path, config)?;
    let mut cmd = Command::new(bin.join("poolgate"));
    cmd.args(["serve", "--config"]).arg(&path).args(["--listen", "127.0.0.1:0"]).env("POOLGATE_LOG", "warn");
    for i in 0..8 {
        cmd.env(format!("LOADGEN_KEY_{i}"), format!("loadgen-key-{i}"));
    }
    start(cmd, "poolgate listening on ")
}

/// HAProxy in HTTP mode with keep-alive, one backend: the mock.
fn haproxy(upstream: &str, dir: &std::path::Path) -> Result<Proc> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let backend = upstream.trim_start_matches("http://");
    let cfg = format!(
        "global\n  nbthread 2\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n\
         frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\nbackend b\n  server s1 {backend}\n"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, cfg)?;
    let child = Command::new("haproxy")
        .arg("-f")
        .arg(&path)
        .arg("-db")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn haproxy")?;
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(Proc { child, url });
        }
        #[allow(
            clippy::disallowed_methods,
            reason = "before the measurement starts, on the main thread: waiting for haproxy to listen"
        )]
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("haproxy did not start")
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// A field of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s.lines().find(|l| l.starts_with(field)).context("status field")?;
    Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
}

fn body(stream: bool) -> String {
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "stream": stream,
        "messages": [{ "role": "user", "content": "hello" }],
    })
    .to_string()
}

fn client() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(4096).no_proxy().build()?)
}

async fn one(client: &reqwest::Client, url: &str, body: &str) -> Result<()> {
    let r = client
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", "loadgen-key-0")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("status {}", r.status());
    }
    r.bytes().await?;
    Ok(())
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

async fn latency(client: &reqwest::Client, url: &str, n: usize, body: &str) -> Result<(f64, f64)> {
    for _ in 0..n / 10 {
        one(client, url, body).await?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        one(client, url, body).await?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok((pct(&v, 0.5), pct(&v, 0.99)))
}

async fn throughput(
    client: &reqwest::Client,
    url: &str,
    concurrency: usize,
    seconds: u64,
    body: &str,
) -> Result<(f64, u64)> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body, done, errors) =
            (client.clone(), url.to_string(), body.to_string(), done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match one(&client, &url, &body).await {
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
    Ok((n as f64 / seconds as f64, n))
}

async fn open_streams(url: &str, n: usize) -> Result<(Vec<reqwest::Response>, Duration)> {
    let client = client()?;
    let started = Instant::now();
    let mut pending = futures_util::stream::iter((0..n).map(|_| {
        let client = client.clone();
        let url = url.to_string();
        async move {
            let mut r = client
                .post(format!("{url}/v1/messages"))
                .header("content-type", "application/json")
                .body(body(true))
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("status {}", r.status());
            }
            r.chunk().await?;
            Ok::<_, anyhow::Error>(r)
        }
    }))
    .buffer_unordered(256);
    let mut open = Vec::with_capacity(n);
    while let Some(r) = pending.next().await {
        open.push(r?);
    }
    Ok((open, started.elapsed()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("poolgate-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let up = mock(&args.bin, 0)?;
    let setup = Setup { chain: args.chain.as_deref(), redis: args.redis.as_deref(), max_in_flight: args.max_in_flight };
    let gw = gateway(&args.bin, &up.url, &dir, &setup)?;
    let gw_pid = gw.child.id();
    let client = client()?;
    let payload = body(args.sse);
    println!(
        "poolgate overhead: {} bodies, default chain over 8 accounts, mock at {}, state {}{}",
        if args.sse { "SSE" } else { "JSON" },
        up.url,
        if args.redis.is_some() { "shared through Redis" } else { "embedded" },
        args.max_in_flight.map(|n| format!(", max_in_flight {n}")).unwrap_or_default(),
    );

    // Concurrency 1, interleaved in blocks so drift on a shared machine hits both paths.
    let cpu0 = cpu_seconds(gw_pid)?;
    let mock_cpu0 = cpu_seconds(up.child.id())?;
    let mut direct_served = 0u64;
    let mut served = 0u64;
    let (mut d50, mut d99, mut g50, mut g99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let block = (args.requests / 4).max(100);
    for _ in 0..4 {
        let (a, b) = latency(&client, &up.url, block, &payload).await?;
        d50.push(a);
        d99.push(b);
        direct_served += (block + block / 10) as u64;
        let (a, b) = latency(&client, &gw.url, block, &payload).await?;
        g50.push(a);
        g99.push(b);
        served += (block + block / 10) as u64;
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (d50, d99, g50, g99) = (med(d50), med(d99), med(g50), med(g99));
    println!("\nconcurrency 1 ({} requests per path, 4 interleaved blocks, median of blocks)", block * 4);
    println!("  direct   p50 {d50:8.1} µs   p99 {d99:8.1} µs");
    println!("  poolgate p50 {g50:8.1} µs   p99 {g99:8.1} µs");
    println!("  added    p50 {:8.1} µs   p99 {:8.1} µs   (goal ≤ 150 / ≤ 500)", g50 - d50, g99 - d99);

    let (direct_rps, direct_n) = throughput(&client, &up.url, 32, args.seconds, &payload).await?;
    direct_served += direct_n;
    let (gw_rps, n) = throughput(&client, &gw.url, 32, args.seconds, &payload).await?;
    served += n;
    let cpu = cpu_seconds(gw_pid)? - cpu0;
    // Every request, direct or proxied, reaches the mock once.
    let mock_cpu = cpu_seconds(up.child.id())? - mock_cpu0;
    let mock_ms = mock_cpu * 1000.0 / (direct_served + served) as f64;
    println!("\nconcurrency 32 ({} s per path)", args.seconds);
    println!("  direct   {direct_rps:9.0} req/s");
    println!("  poolgate {gw_rps:9.0} req/s   ratio {:.2} (goal ≥ 0.50)", gw_rps / direct_rps);
    println!(
        "\ngateway CPU: {:.1} s over {served} requests = {:.3} ms per request (goal ≤ 0.1)",
        cpu,
        cpu * 1000.0 / served as f64
    );
    println!("  for scale: the mock upstream (an axum server, no client side) used {mock_ms:.3} ms per request");

    if args.haproxy {
        let hp = haproxy(&up.url, &dir)?;
        let cpu0 = cpu_seconds(hp.child.id())?;
        let (h50, h99) = latency(&client, &hp.url, args.requests, &payload).await?;
        let (h_rps, n) = throughput(&client, &hp.url, 32, args.seconds, &payload).await?;
        let h_cpu = cpu_seconds(hp.child.id())? - cpu0;
        let h_ms = h_cpu * 1000.0 / (n + (args.requests + args.requests / 10) as u64) as f64;
        println!("\nreference: HAProxy hop (same mock, same load)");
        println!("  added    p50 {:8.1} µs   p99 {:8.1} µs", h50 - d50, h99 - d99);
        println!("  {h_rps:9.0} req/s   ratio {:.2}   CPU {h_ms:.3} ms per request", h_rps / direct_rps);
    }

    // Memory with many open streams: a second mock whose events trickle out.
    drop(gw);
    let slow = mock(&args.bin, 2_000)?;
    let gw = gateway(&args.bin, &slow.url, &dir, &setup)?;
    let rss_idle = status_kib(gw.child.id(), "VmRSS:")?;
    let (open, took) = open_streams(&gw.url, args.streams).await?;
    let rss = status_kib(gw.child.id(), "VmRSS:")?;
    let hwm = status_kib(gw.child.id(), "VmHWM:")?;
    println!(
        "\n{} concurrent open SSE streams (opened in {:.1} s): RSS {:.1} MiB (idle {:.1} MiB), peak {:.1} MiB (goal ≤ 64)",
        open.len(),
        took.as_secs_f64(),
        rss as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    drop(open);
    let summary = serde_json::json!({
        "added_p50_us": g50 - d50, "added_p99_us": g99 - d99,
        "direct_p50_us": d50, "poolgate_p50_us": g50,
        "throughput_ratio": gw_rps / direct_rps, "direct_rps": direct_rps, "poolgate_rps": gw_rps,
        "cpu_ms_per_request": cpu * 1000.0 / served as f64, "mock_cpu_ms_per_request": mock_ms,
        "streams": args.streams, "peak_rss_mib": hwm as f64 / 1024.0,
    });
    println!("\n{summary}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
