//! `poolgate-loadgen`: what poolgate costs, measured against a direct call in the
//! same run.
//!
//! It starts the mock upstream and `poolgate serve` (release binaries, separate
//! processes) and drives the same load (a) straight at the mock, (b) through
//! poolgate with the default chain over 8 accounts and (c), when `haproxy` is on
//! PATH, through a plain HAProxy hop, the reference for what any proxy hop costs
//! on this machine today:
//! - concurrency 1: latency p50/p99 of each path, and the difference each hop adds;
//! - concurrency 32: throughput of each path, and the ratio;
//! - CPU time per request of each hop (utime+stime of the process over one phase,
//!   divided by the requests of that phase), at concurrency 1 and at 32 apart,
//!   and poolgate's against HAProxy's: the absolute figure moves 4x between VMs
//!   and days (docs/benchmarks.md, "What the old loadgen figure left out"), the
//!   ratio to a hop measured in the same run does not;
//! - peak RSS of the gateway holding 1,000 concurrent open SSE streams.
//!
//! By default each request is what Claude Code sends: its ~20 headers
//! (`anthropic-beta`, `x-stainless-*`, `x-claude-code-session-id`, …) and a
//! `metadata.user_id` naming the session; `--bare-request` sends the three
//! headers and bare body of the first version of this tool.
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
    /// Skip the HAProxy reference hop (measured by default when `haproxy` is on PATH).
    #[arg(long)]
    no_haproxy: bool,
    /// Send the minimal request of the first version of this tool (three headers,
    /// no session) instead of Claude Code's headers and metadata.
    #[arg(long)]
    bare_request: bool,
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
        "global\n  nbthread 2\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n  http-reuse always\n\
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

/// The session id of every Claude Code-shaped request (one session, as a user's).
const SESSION: &str = "7f9c1a52-3b1e-4c1a-9d3e-5a8b2c7d9e01";

/// A Messages request as a client sends it: body and headers.
struct Request {
    body: String,
    headers: Vec<(&'static str, &'static str)>,
}

impl Request {
    /// What the first version of this tool sent: three headers, no session.
    fn bare(stream: bool) -> Request {
        Request {
            body: body(stream),
            headers: vec![
                ("x-api-key", "loadgen-key-0"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
            ],
        }
    }

    /// What Claude Code sends (shared/references/claude-code-wire.md): its
    /// headers, and the session in `metadata.user_id` as a JSON-encoded string.
    fn claude_code(stream: bool) -> Request {
        let user_id = serde_json::json!({
            "device_id": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "account_uuid": "",
            "session_id": SESSION,
        })
        .to_string();
        let body = serde_json::json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "stream": stream,
            "metadata": { "user_id": user_id },
            "messages": [{ "role": "user", "content": "hello" }],
        })
        .to_string();
        Request {
            body,
            headers: vec![
                ("x-api-key", "loadgen-key-0"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
                ("accept", "application/json"),
                (
                    "anthropic-beta",
                    "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
                ),
                ("anthropic-dangerous-direct-browser-access", "true"),
                ("x-app", "cli"),
                ("user-agent", "claude-cli/2.0.14 (external, sdk-cli)"),
                ("x-claude-code-session-id", SESSION),
                ("x-stainless-arch", "x64"),
                ("x-stainless-lang", "js"),
                ("x-stainless-os", "Linux"),
                ("x-stainless-package-version", "0.60.0"),
                ("x-stainless-retry-count", "0"),
                ("x-stainless-runtime", "node"),
                ("x-stainless-runtime-version", "v22.19.0"),
                ("x-stainless-timeout", "600"),
                ("accept-encoding", "gzip, deflate, br, zstd"),
                ("accept-language", "*"),
                ("sec-fetch-mode", "cors"),
            ],
        }
    }
}

fn client() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(4096).no_proxy().build()?)
}

async fn one(client: &reqwest::Client, url: &str, req: &Request) -> Result<()> {
    let mut b = client.post(format!("{url}/v1/messages"));
    for (name, value) in &req.headers {
        b = b.header(*name, *value);
    }
    let r = b.body(req.body.clone()).send().await?;
    if !r.status().is_success() {
        bail!("status {}", r.status());
    }
    r.bytes().await?;
    Ok(())
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

async fn latency(client: &reqwest::Client, url: &str, n: usize, req: &Request) -> Result<(f64, f64)> {
    for _ in 0..n / 10 {
        one(client, url, req).await?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        one(client, url, req).await?;
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
    req: &Arc<Request>,
) -> Result<(f64, u64)> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
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

/// Whether `haproxy` can be started.
fn haproxy_available() -> bool {
    Command::new("haproxy").arg("-v").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// CPU milliseconds per request of a process over one phase.
struct Phase {
    cpu0: f64,
    pid: u32,
}

impl Phase {
    fn start(pid: u32) -> Result<Phase> {
        Ok(Phase { cpu0: cpu_seconds(pid)?, pid })
    }
    fn ms_per_request(&self, requests: u64) -> Result<f64> {
        Ok((cpu_seconds(self.pid)? - self.cpu0) * 1000.0 / requests.max(1) as f64)
    }
}

/// One hop's figures: latency at c=1 (median of blocks), throughput at c=32,
/// CPU per request in each phase.
#[derive(Default)]
struct Hop {
    p50: Vec<f64>,
    p99: Vec<f64>,
    c1_requests: u64,
    c1_cpu_ms: f64,
    rps: f64,
    c32_cpu_ms: f64,
}

fn med(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("poolgate-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let up = mock(&args.bin, 0)?;
    let setup = Setup { chain: args.chain.as_deref(), redis: args.redis.as_deref(), max_in_flight: args.max_in_flight };
    let gw = gateway(&args.bin, &up.url, &dir, &setup)?;
    let hp = if args.no_haproxy || !haproxy_available() { None } else { Some(haproxy(&up.url, &dir)?) };
    let client = client()?;
    let req = Arc::new(if args.bare_request { Request::bare(args.sse) } else { Request::claude_code(args.sse) });
    println!(
        "poolgate overhead: {} bodies, {} requests ({} headers), {} over 8 accounts, mock at {}, state {}{}",
        if args.sse { "SSE" } else { "JSON" },
        if args.bare_request { "bare" } else { "Claude Code-shaped" },
        req.headers.len(),
        args.chain.as_deref().map_or("default chain".to_string(), |c| format!("chain {c}")),
        up.url,
        if args.redis.is_some() { "shared through Redis" } else { "embedded" },
        args.max_in_flight.map(|n| format!(", max_in_flight {n}")).unwrap_or_default(),
    );
    if hp.is_none() {
        println!(
            "  (no HAProxy reference: {})",
            if args.no_haproxy { "--no-haproxy" } else { "`haproxy` not on PATH" }
        );
    }

    // The hops measured: direct (the mock alone), poolgate, HAProxy.
    let mut hops: Vec<(&str, &str, Option<u32>)> =
        vec![("direct", &up.url, None), ("poolgate", &gw.url, Some(gw.child.id()))];
    if let Some(hp) = &hp {
        hops.push(("haproxy", &hp.url, Some(hp.child.id())));
    }
    let mut fig: Vec<Hop> = hops.iter().map(|_| Hop::default()).collect();
    let mock_pid = up.child.id();
    let mut mock_requests = 0u64;
    let mock_phase = Phase::start(mock_pid)?;

    // Concurrency 1, interleaved in blocks so drift on a shared machine hits every path.
    let block = (args.requests / 4).max(100);
    for _ in 0..4 {
        for (i, (_, url, pid)) in hops.iter().enumerate() {
            let phase = pid.map(Phase::start).transpose()?;
            let (a, b) = latency(&client, url, block, &req).await?;
            let n = (block + block / 10) as u64;
            if let Some(phase) = phase {
                let f = &mut fig[i];
                f.c1_cpu_ms = (f.c1_cpu_ms * f.c1_requests as f64 + phase.ms_per_request(n)? * n as f64)
                    / (f.c1_requests + n) as f64;
            }
            fig[i].c1_requests += n;
            fig[i].p50.push(a);
            fig[i].p99.push(b);
            mock_requests += n;
        }
    }
    // Concurrency 32, one phase per hop.
    for (i, (_, url, pid)) in hops.iter().enumerate() {
        let phase = pid.map(Phase::start).transpose()?;
        let (rps, n) = throughput(&client, url, 32, args.seconds, &req).await?;
        if let Some(phase) = phase {
            fig[i].c32_cpu_ms = phase.ms_per_request(n)?;
        }
        fig[i].rps = rps;
        mock_requests += n;
    }
    // Every request, direct or through a hop, reaches the mock once.
    let mock_ms = mock_phase.ms_per_request(mock_requests)?;

    let (d50, d99, d_rps) = (med(&fig[0].p50), med(&fig[0].p99), fig[0].rps);
    println!("\nconcurrency 1 ({} requests per path, 4 interleaved blocks, median of blocks)", block * 4);
    for ((name, _, _), f) in hops.iter().zip(&fig) {
        let (p50, p99) = (med(&f.p50), med(&f.p99));
        if *name == "direct" {
            println!("  {name:<8} p50 {p50:8.1} µs   p99 {p99:8.1} µs");
        } else {
            println!(
                "  {name:<8} p50 {p50:8.1} µs   p99 {p99:8.1} µs   added p50 {:7.1} µs   p99 {:7.1} µs",
                p50 - d50,
                p99 - d99
            );
        }
    }
    println!("  (poolgate goal: added ≤ 150 / ≤ 500 µs)");
    println!("\nconcurrency 32 ({} s per path)", args.seconds);
    for ((name, _, _), f) in hops.iter().zip(&fig) {
        println!("  {name:<8} {:9.0} req/s   ratio to direct {:.2}", f.rps, f.rps / d_rps);
    }
    println!("  (poolgate goal: ratio ≥ 0.50)");
    println!("\nCPU per request, each hop's own process (utime+stime over the phase / its requests)");
    println!("  {:<8} {:>10} {:>10}", "", "c=1 ms", "c=32 ms");
    for ((name, _, pid), f) in hops.iter().zip(&fig) {
        if pid.is_some() {
            println!("  {name:<8} {:>10.3} {:>10.3}", f.c1_cpu_ms, f.c32_cpu_ms);
        }
    }
    println!("  mock     {mock_ms:>10.3} (both phases; an axum server, no client side)");
    let g = &fig[1];
    let href = fig.get(2);
    if let Some(h) = href {
        println!(
            "  poolgate / HAProxy: {:.1}x at c=1, {:.1}x at c=32   (poolgate goal: ≤ 0.1 ms at c=32)",
            g.c1_cpu_ms / h.c1_cpu_ms,
            g.c32_cpu_ms / h.c32_cpu_ms
        );
    } else {
        println!("  (poolgate goal: ≤ 0.1 ms at c=32)");
    }

    // Memory with many open streams: a second mock whose events trickle out.
    drop(hp);
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
    let (g50, g99) = (med(&g.p50), med(&g.p99));
    let summary = serde_json::json!({
        "request": if args.bare_request { "bare" } else { "claude-code" },
        "added_p50_us": g50 - d50, "added_p99_us": g99 - d99,
        "direct_p50_us": d50, "poolgate_p50_us": g50,
        "throughput_ratio": g.rps / d_rps, "direct_rps": d_rps, "poolgate_rps": g.rps,
        "cpu_ms_per_request_c1": g.c1_cpu_ms, "cpu_ms_per_request_c32": g.c32_cpu_ms,
        "mock_cpu_ms_per_request": mock_ms,
        "haproxy": href.map(|h| serde_json::json!({
            "added_p50_us": med(&h.p50) - d50, "added_p99_us": med(&h.p99) - d99,
            "throughput_ratio": h.rps / d_rps,
            "cpu_ms_per_request_c1": h.c1_cpu_ms, "cpu_ms_per_request_c32": h.c32_cpu_ms,
        })),
        "cpu_vs_haproxy_c32": href.map(|h| g.c32_cpu_ms / h.c32_cpu_ms),
        "streams": args.streams, "peak_rss_mib": hwm as f64 / 1024.0,
    });
    println!("\n{summary}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
