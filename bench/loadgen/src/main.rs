//! `poolgate-loadgen`: what poolgate costs, measured in one run against a
//! direct call and against two other hops in front of the same mock upstream:
//! HAProxy (when `haproxy` is on PATH), the reference for what any proxy hop
//! costs on this machine, and `poolgate-passthrough`, a bare hyper pass-through,
//! the floor any hyper-based proxy pays. Every figure is given absolute and as a
//! ratio to HAProxy and to the pass-through: the absolute CPU figures move 4x
//! between VMs and days (docs/benchmarks.md, "What the old loadgen figure left
//! out"), the ratios to hops measured in the same run do not.
//!
//! Phases (each can be skipped):
//! - JSON requests ([`json`]): latency at c=1, throughput at c=32, CPU per
//!   request of each hop at both;
//! - streams ([`stream`]): CPU per streamed request at 50 and 500 realistic text
//!   deltas, CPU per relayed event, added time to first byte at c=1;
//! - memory ([`memory`]): RSS per open stream at 1,000 and 10,000 streams,
//!   idle, at the height and after they close.
//!
//! Every hop is its own process; CPU is utime+stime from `/proc/<pid>/stat` over
//! a phase divided by the requests of the phase, the fairest figure on 2 shared
//! cores where the load generator, the mock and the hop compete for the CPUs.

mod hops;
mod json;
mod measure;
mod memory;
mod procs;
mod request;
mod stream;
mod table;

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

#[derive(Parser)]
pub struct Args {
    /// Directory holding the release binaries `poolgate` and `poolgate-mock-upstream`.
    #[arg(long, default_value = "target/release")]
    bin: PathBuf,
    /// Directory holding `poolgate-mock-upstream` if not `--bin` (the streams
    /// phase needs one with `--stream-deltas`).
    #[arg(long)]
    mock_bin: Option<PathBuf>,
    /// The `poolgate-passthrough` binary; default: beside this one.
    #[arg(long)]
    passthrough: Option<PathBuf>,
    /// A short run: fewer requests, shorter phases, 1,000 streams, 10 s settle.
    #[arg(long)]
    quick: bool,
    /// Sequential JSON requests per path at concurrency 1.
    #[arg(long, default_value_t = 4000)]
    requests: usize,
    /// Seconds of JSON load per path at concurrency 32.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// The JSON phase's bodies stream (the mock's short SSE reply) instead.
    #[arg(long)]
    sse: bool,
    /// Text deltas of the two stream lengths.
    #[arg(long, num_args = 2, value_delimiter = ',', default_value = "50,500")]
    deltas: Vec<usize>,
    /// Bytes of text per delta (whole six-byte words).
    #[arg(long, default_value_t = 36)]
    delta_bytes: usize,
    /// Milliseconds between two events of a stream. At 0 the mock writes a
    /// whole stream at once and a hop that reads what is buffered (HAProxy)
    /// relays many events per system call; a model's deltas come tens of ms
    /// apart, each on its own: 1 or more measures that case.
    #[arg(long, default_value_t = 0)]
    delta_gap_ms: u64,
    /// Seconds of streamed load at c=32 per hop, length and round.
    #[arg(long, default_value_t = 4.0)]
    stream_seconds: f64,
    /// Rounds of the streamed phase (hops and lengths interleaved in each).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Streams per hop for the time to first byte at c=1.
    #[arg(long, default_value_t = 1000)]
    ttfb_requests: usize,
    /// Concurrent open streams for the memory figures (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    streams: Vec<usize>,
    /// Client streams per HTTP/2 connection in the memory phase.
    #[arg(long, default_value_t = 100)]
    per_conn: usize,
    /// Milliseconds between the events of a held stream.
    #[arg(long, default_value_t = 10_000)]
    hold_event_ms: u64,
    /// Seconds after the streams close before the "after" RSS.
    #[arg(long, default_value_t = 120)]
    settle: u64,
    /// Skip the JSON phase.
    #[arg(long)]
    no_json: bool,
    /// Skip the streams phase.
    #[arg(long)]
    no_stream: bool,
    /// Skip the memory phase.
    #[arg(long)]
    no_memory: bool,
    /// Skip the HAProxy reference hop (measured by default when `haproxy` is on PATH).
    #[arg(long)]
    no_haproxy: bool,
    /// HAProxy with `option http-no-delay` (sends each piece of a streamed
    /// response as it comes; without it, small pieces may wait for more).
    #[arg(long)]
    haproxy_no_delay: bool,
    /// Send the minimal request of the first version of this tool (three headers,
    /// no session) instead of Claude Code's headers and metadata.
    #[arg(long)]
    bare_request: bool,
    /// The chain to run, as comma-separated built-ins (`skip-exhausted,headroom`);
    /// default: the gateway's default chain.
    #[arg(long)]
    chain: Option<String>,
    /// Share state through this Redis server (`[state] backend = "redis"`).
    #[arg(long)]
    redis: Option<String>,
    /// `max_in_flight` of every account.
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Turn the usage ledger off (`[ledger] file = ""`); it is on by default.
    #[arg(long)]
    no_ledger: bool,
    /// Turn tracing on: `[telemetry]` exports every request's spans (100 %
    /// sampled) over OTLP/HTTP to a sink in this process.
    #[arg(long)]
    tracing: bool,
}

impl Args {
    fn shorten(&mut self) {
        if self.quick {
            (self.requests, self.seconds, self.stream_seconds, self.rounds) = (800, 2.0, 2.0, 1);
            (self.ttfb_requests, self.streams, self.settle) = (200, vec![1000], 10);
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    args.shorten();
    let dir = std::env::temp_dir().join(format!("poolgate-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tracing = if args.tracing { Some(procs::otlp_sink().await?) } else { None };
    let setup = procs::Setup {
        chain: args.chain.clone(),
        redis: args.redis.clone(),
        max_in_flight: args.max_in_flight,
        ledger: !args.no_ledger,
        tracing,
    };
    let ctx = hops::Ctx {
        bin: args.bin.clone(),
        mock_bin: args.mock_bin.clone().unwrap_or_else(|| args.bin.clone()),
        passthrough: procs::passthrough_bin(args.passthrough.as_deref())?,
        dir: dir.clone(),
        setup,
        haproxy: !args.no_haproxy && procs::haproxy_available(),
        haproxy_no_delay: args.haproxy_no_delay,
    };
    println!(
        "poolgate-loadgen: {} requests, {}, ledger {}, tracing {}, state {}{}; load average before: {}",
        if args.bare_request { "bare" } else { "Claude Code-shaped" },
        args.chain.as_deref().map_or("default chain".to_string(), |c| format!("chain {c}")),
        if args.no_ledger { "off" } else { "on" },
        if args.tracing { "on (100 %, OTLP/HTTP sink)" } else { "off" },
        if args.redis.is_some() { "shared through Redis" } else { "embedded" },
        args.max_in_flight.map(|n| format!(", max_in_flight {n}")).unwrap_or_default(),
        loadavg(),
    );
    if !ctx.haproxy {
        println!(
            "  (no HAProxy reference: {})",
            if args.no_haproxy { "--no-haproxy" } else { "`haproxy` not on PATH" }
        );
    }
    let mut table = table::Table::default();
    let done = phases(&ctx, &args, &mut table).await;
    table.print();
    // What a failed phase measured before it failed is still printed above.
    done?;
    println!("\nload average after: {}\n\n{}", loadavg(), table.json());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn phases(ctx: &hops::Ctx, args: &Args, table: &mut table::Table) -> Result<()> {
    if !args.no_json {
        json::run(ctx, args, table).await?;
        println!("  JSON phase done; load average {}", loadavg());
    }
    if !args.no_stream {
        stream::run(ctx, args, table).await?;
        println!("  streams phase done; load average {}", loadavg());
    }
    if !args.no_memory {
        memory::run(ctx, args, table).await?;
        println!("  memory phase done; load average {}", loadavg());
    }
    Ok(())
}

/// /proc/loadavg's three figures, to print beside every time figure.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
