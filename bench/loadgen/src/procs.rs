//! The processes a run measures: the mock upstream, `poolgate serve`, HAProxy
//! and the bare hyper pass-through, each a separate process on a free loopback
//! port (so its CPU and memory are its own in /proc), each killed when dropped.
//! Also the OTLP sink that `--tracing` exports to.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// One started process and the URL it serves.
pub struct Proc {
    pub child: Child,
    pub url: String,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
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

/// What the mock answers.
#[derive(Clone, Copy)]
pub enum Reply {
    /// Its normal reply (JSON or a short SSE stream), events spaced by this many ms.
    Normal { chunk_delay_ms: u64 },
    /// `deltas` text deltas of about `bytes` bytes each (`--stream-deltas`),
    /// `gap_ms` apart.
    Long { deltas: usize, bytes: usize, gap_ms: u64 },
}

/// The credentials every hop sends (poolgate's accounts use the same).
pub const KEYS: usize = 8;

pub fn mock(bin: &Path, reply: Reply) -> Result<Proc> {
    let mut cmd = Command::new(bin.join("poolgate-mock-upstream"));
    cmd.args(["--listen", "127.0.0.1:0", "--accept-any", "--utilization", "0.2"]);
    match reply {
        Reply::Normal { chunk_delay_ms } => {
            cmd.args(["--chunk-delay-ms", &chunk_delay_ms.to_string()]);
        }
        Reply::Long { deltas, bytes, gap_ms } => {
            cmd.args(["--chunk-delay-ms", &gap_ms.to_string()]);
            for i in 0..KEYS {
                cmd.args(["--credential", &format!("loadgen-key-{i}")]);
            }
            cmd.args(["--stream-deltas", &deltas.to_string(), "--delta-bytes", &bytes.to_string()]);
        }
    }
    start(cmd, "listening on ")
}

/// What the gateway's config varies by (`--chain`, `--redis`, `--no-ledger`, `--tracing`).
pub struct Setup {
    pub chain: Option<String>,
    pub redis: Option<String>,
    pub max_in_flight: Option<u32>,
    /// The usage ledger (the gateway's default: an SQLite file in its state dir).
    pub ledger: bool,
    /// `[telemetry]` exporting every request's spans to this OTLP/HTTP endpoint.
    pub tracing: Option<String>,
}

impl Setup {
    fn config(&self, upstream: &str) -> String {
        let mut c = String::from("[server]\ndecisions_kept = 200\n\n[gateway]\nqueue_max = 4096\n\n");
        if let Some(url) = &self.redis {
            let prefix = format!("loadgen-{}:", std::process::id());
            c.push_str(&format!("[state]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\n\n"));
        }
        if !self.ledger {
            c.push_str("[ledger]\nfile = \"\"\n\n");
        }
        if let Some(endpoint) = &self.tracing {
            c.push_str(&format!("[telemetry]\nendpoint = \"{endpoint}\"\nsampling = 1.0\n\n"));
        }
        for stage in self.chain.iter().flat_map(|c| c.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
            c.push_str(&format!("[[policy.chain]]\nplugin = \"builtin:{stage}\"\n\n"));
        }
        let limit = self.max_in_flight.map(|n| format!("max_in_flight = {n}\n")).unwrap_or_default();
        for i in 0..KEYS {
            c.push_str(&format!(
                "[[accounts]]\nid = \"acct-{i}\"\napi_key_env = \"LOADGEN_KEY_{i}\"\nbase_url = \"{upstream}\"\n{limit}\n"
            ));
        }
        c
    }
}

/// `poolgate serve` over 8 accounts at `upstream`, its state (the ledger) in `dir`.
pub fn gateway(bin: &Path, upstream: &str, dir: &Path, setup: &Setup) -> Result<Proc> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("poolgate.toml");
    std::fs::write(&path, setup.config(upstream))?;
    let mut cmd = Command::new(bin.join("poolgate"));
    cmd.args(["serve", "--config"]).arg(&path).args(["--listen", "127.0.0.1:0"]);
    cmd.env("POOLGATE_LOG", "warn").env("XDG_STATE_HOME", dir.join("state")).env_remove("POOLGATE_CONFIG");
    for i in 0..KEYS {
        cmd.env(format!("LOADGEN_KEY_{i}"), format!("loadgen-key-{i}"));
    }
    start(cmd, "poolgate listening on ")
}

/// The bare hyper pass-through (`poolgate-passthrough`) in front of `upstream`.
pub fn passthrough(bin: &Path, upstream: &str) -> Result<Proc> {
    let mut cmd = Command::new(bin);
    cmd.args(["--upstream", upstream]);
    start(cmd, "passthrough listening on ")
}

/// Where `poolgate-passthrough` is: beside this binary unless named.
pub fn passthrough_bin(named: Option<&Path>) -> Result<PathBuf> {
    match named {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(std::env::current_exe()?.with_file_name("poolgate-passthrough")),
    }
}

/// A free loopback port (bound, then released).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// HAProxy in HTTP mode with keep-alive, one backend (the mock), two binds:
/// HTTP/1.1 at the returned URL, prior-knowledge HTTP/2 (`proto h2`) at the
/// second. `maxconn` leaves room under the 20,000 open-file limit for one
/// upstream connection per stream at 10,000 streams.
///
/// `no_delay` adds `option http-no-delay`: without it HAProxy may hold a small
/// piece of a response back while it expects more (measured: 118 ms to the
/// first byte of a stream whose events come 1 ms apart).
pub fn haproxy(upstream: &str, dir: &Path, no_delay: bool) -> Result<(Proc, String)> {
    let (port, h2) = (free_port()?, free_port()?);
    let no_delay = if no_delay { "  option http-no-delay\n" } else { "" };
    let backend = upstream.trim_start_matches("http://");
    let cfg = format!(
        "global\n  nbthread 2\n  maxconn 9000\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n  option http-keep-alive\n  http-reuse always\n{no_delay}\
         frontend f\n  bind 127.0.0.1:{port}\n  bind 127.0.0.1:{h2} proto h2\n  default_backend b\nbackend b\n  server s1 {backend}\n"
    );
    let path = dir.join(format!("haproxy-{port}.cfg"));
    std::fs::write(&path, cfg)?;
    let child = Command::new("haproxy")
        .arg("-f")
        .arg(&path)
        .arg("-db")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn haproxy")?;
    let proc = Proc { child, url: format!("http://127.0.0.1:{port}") };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", h2)).is_ok() {
            return Ok((proc, format!("http://127.0.0.1:{h2}")));
        }
        #[allow(
            clippy::disallowed_methods,
            reason = "before the measurement starts, on the main thread: waiting for haproxy to listen"
        )]
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("haproxy did not start")
}

/// Whether `haproxy` can be started.
pub fn haproxy_available() -> bool {
    Command::new("haproxy").arg("-v").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// An OTLP/HTTP sink on a free loopback port that takes every export (a 200
/// with an empty `ExportTraceServiceResponse`), as bench/traces.sh's does; it
/// runs on this process's runtime, so its work is not the gateway's.
pub async fn otlp_sink() -> Result<String> {
    use hyper::{Response, body::Incoming};
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                use http_body_util::BodyExt;
                let _ = req.into_body().collect().await;
                Response::builder()
                    .header("content-type", "application/x-protobuf")
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    Ok(url)
}
