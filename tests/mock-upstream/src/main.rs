//! `poolgate-mock-upstream`: the mock Anthropic upstream as a standalone server, for
//! benchmarks and manual runs. Serves until killed; prints `listening on http://…` once
//! bound, so a script can wait for that line. Requests are not recorded, so memory stays
//! flat over long benchmark runs.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use poolgate_mock_upstream::{Config, MockUpstream, Quota, Step};

#[derive(Parser)]
#[command(version, about = "A mock Anthropic Messages API upstream for poolgate's tests and benchmarks.")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: SocketAddr,
    /// Accept every credential as a valid account.
    #[arg(long)]
    accept_any: bool,
    /// A credential (API key or bearer token) to accept; repeatable.
    #[arg(long = "credential", value_name = "K")]
    credentials: Vec<String>,
    /// Delay before answering each request, in milliseconds.
    #[arg(long, default_value_t = 0, value_name = "N")]
    latency_ms: u64,
    /// Delay between SSE events, in milliseconds.
    #[arg(long, default_value_t = 0, value_name = "N")]
    chunk_delay_ms: u64,
    /// Report this 5h and 7d utilization (a fraction) in unified quota headers.
    #[arg(long, value_name = "FRACTION")]
    utilization: Option<f64>,
    /// Every `--credential` answers a long reply: this many SSE `text_delta` events
    /// (a JSON reply carries the same text whole), for measuring what a hop costs
    /// per relayed event. Other credentials (with `--accept-any`) answer as usual.
    #[arg(long, value_name = "N")]
    stream_deltas: Option<usize>,
    /// About how many bytes of text each `--stream-deltas` event carries (whole
    /// six-byte words, at least one).
    #[arg(long, default_value_t = 36, value_name = "B", requires = "stream_deltas")]
    delta_bytes: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = Config {
        accept_any: args.accept_any,
        latency_ms: args.latency_ms,
        chunk_delay_ms: args.chunk_delay_ms,
        default_quota: args.utilization.map(|u| Quota::unified(u, u)),
        record: false,
    };
    if !config.accept_any && args.credentials.is_empty() {
        eprintln!("poolgate-mock-upstream: no --credential and no --accept-any: every request gets a 401");
    }
    let upstream = match MockUpstream::bind(args.listen, config).await {
        Ok(upstream) => upstream,
        Err(e) => {
            eprintln!("poolgate-mock-upstream: failed to listen on `{}`: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    for credential in &args.credentials {
        let account = upstream.account(credential);
        if let Some(deltas) = args.stream_deltas {
            account.set_default(Step::LongStream { deltas, delta_bytes: args.delta_bytes });
        }
    }
    println!("listening on {}", upstream.base_url());
    // Scripts wait for the line above through a pipe, where stdout is block-buffered.
    let _ = std::io::stdout().flush();
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("poolgate-mock-upstream: cannot wait for ctrl-c ({e}); serving forever");
        std::future::pending::<()>().await;
    }
    ExitCode::SUCCESS
}
