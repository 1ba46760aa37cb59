//! Streamed requests with realistic events: the mock answers every loadgen
//! credential with Anthropic SSE of `--deltas` text deltas of `--delta-bytes`
//! bytes each (`content_block_delta` / `text_delta` JSON, plus the 7 framing
//! events), at two lengths (50 and 500 by default), each behind its own set of
//! hops. At concurrency 32, rounds interleave hops and lengths; a hop's CPU per
//! streamed request is its process's CPU over its phases / its requests, and
//! its CPU per relayed event the slope between the two lengths. At concurrency
//! 1, the time to a stream's first byte, interleaved in 4 blocks; added = hop −
//! direct. Before any figure, one stream through each hop is checked whole
//! (wire's SSE grammar, as the chaos run reads them) with every delta there.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use poolgate_chaos::grammar::{self, Ending};

use crate::hops::{self, Ctx, Hop};
use crate::measure::{self, Phase, med};
use crate::procs::{self, Reply};
use crate::request::Request;
use crate::table::Table;

async fn check(client: &reqwest::Client, hop: &Hop, req: &Request, deltas: usize) -> Result<()> {
    let text = measure::text(client, &hop.url, req).await?;
    let seen = text.matches("\"text_delta\"").count();
    if grammar::messages(&text) != Ending::Whole || seen != deltas {
        bail!("{}: a {deltas}-delta stream arrived broken ({seen} deltas)", hop.name);
    }
    Ok(())
}

pub async fn run(ctx: &Ctx, args: &crate::Args, table: &mut Table) -> Result<()> {
    let (lo, hi) = (args.deltas[0], args.deltas[1]);
    let (up_lo, up_hi) = (
        procs::mock(&ctx.mock_bin, Reply::Long { deltas: lo, bytes: args.delta_bytes, gap_ms: args.delta_gap_ms })?,
        procs::mock(&ctx.mock_bin, Reply::Long { deltas: hi, bytes: args.delta_bytes, gap_ms: args.delta_gap_ms })?,
    );
    let sets = [hops::start(ctx, &up_lo, "lo", true)?, hops::start(ctx, &up_hi, "hi", true)?];
    let client = measure::client()?;
    let req = Arc::new(Request::new(args.bare_request, true));
    for (set, deltas) in sets.iter().zip([lo, hi]) {
        for hop in set {
            check(&client, hop, &req, deltas).await?;
        }
    }
    // [length][hop]: (cpu seconds, requests, wall seconds, read and write syscalls)
    let mut acc = vec![vec![(0.0, 0u64, 0.0, 0u64, 0u64); sets[0].len()]; 2];
    for _ in 0..args.rounds {
        for h in 0..sets[0].len() {
            for (l, set) in sets.iter().enumerate() {
                let (phase, io) = (Phase::start(set[h].pid)?, measure::syscalls(set[h].pid)?);
                let (_, n) = measure::throughput(&client, &set[h].url, 32, args.stream_seconds, &req).await?;
                let (cpu, io2) = (phase.seconds()?, measure::syscalls(set[h].pid)?);
                let a = &mut acc[l][h];
                *a = (a.0 + cpu, a.1 + n, a.2 + args.stream_seconds, a.3 + io2.0 - io.0, a.4 + io2.1 - io.1);
            }
        }
    }
    table.section(format!(
        "Streams: {lo} and {hi} text deltas of {} B (+7 framing events) {} ms apart, c=32, {} round(s) of {} s per hop and length",
        args.delta_bytes, args.delta_gap_ms, args.rounds, args.stream_seconds
    ));
    let names: Vec<&str> = sets[0].iter().map(|h| h.name).collect();
    let ms = |l: usize| -> Vec<(&str, f64)> {
        names.iter().zip(&acc[l]).map(|(n, a)| (*n, a.0 * 1000.0 / a.1.max(1) as f64)).collect()
    };
    let (ms_lo, ms_hi) = (ms(0), ms(1));
    table.add(format!("CPU per streamed request, {lo} deltas, ms (direct: the mock's)"), &ms_lo, 4, true);
    table.add(format!("CPU per streamed request, {hi} deltas, ms (direct: the mock's)"), &ms_hi, 4, true);
    let per_event: Vec<(&str, f64)> =
        ms_lo.iter().zip(&ms_hi).map(|((n, a), (_, b))| (*n, (b - a) * 1000.0 / (hi - lo) as f64)).collect();
    table.add("CPU per relayed event, µs ((hi − lo) / Δdeltas)", &per_event, 3, true);
    for (l, d) in [(0, lo), (1, hi)] {
        let rps: Vec<(&str, f64)> = names.iter().zip(&acc[l]).map(|(n, a)| (*n, a.1 as f64 / a.2)).collect();
        table.add(format!("streams per second at c=32, {d} deltas"), &rps, 0, true);
    }
    // Where the time goes: one write system call per relayed event or fewer.
    // /proc/<pid>/io counts read/write/readv/writev only, not send/recv: tokio
    // reads with recv, HAProxy uses send/recv (its 0 means "not counted").
    for (l, d) in [(0, lo), (1, hi)] {
        let per: Vec<(&str, f64)> =
            names.iter().zip(&acc[l]).map(|(n, a)| (*n, a.4 as f64 / a.1.max(1) as f64)).collect();
        table.add(
            format!("write/writev syscalls per streamed request, {d} deltas (HAProxy: send, not counted)"),
            &per,
            1,
            false,
        );
    }
    ttfb(&client, &sets[0], args, &req, table).await
}

/// Time to first byte at concurrency 1 through the shorter streams' hops.
async fn ttfb(
    client: &reqwest::Client,
    hops: &[Hop],
    args: &crate::Args,
    req: &Request,
    table: &mut Table,
) -> Result<()> {
    let block = (args.ttfb_requests / 4).max(25);
    let mut v = vec![(Vec::new(), Vec::new()); hops.len()];
    for _ in 0..4 {
        for (hop, (p50, p99)) in hops.iter().zip(&mut v) {
            let (a, b) = measure::latency(client, &hop.url, block, req, true)
                .await
                .with_context(|| format!("time to first byte through {}", hop.name))?;
            p50.push(a);
            p99.push(b);
        }
    }
    table
        .section(format!("Time to first byte of a stream, c=1, {} streams per hop in 4 interleaved blocks", block * 4));
    let fig: Vec<(&str, f64, f64)> = hops.iter().zip(&v).map(|(h, (a, b))| (h.name, med(a), med(b))).collect();
    table.add("TTFB p50, µs", &fig.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(), 1, false);
    table.add("TTFB p99, µs", &fig.iter().map(|f| (f.0, f.2)).collect::<Vec<_>>(), 1, false);
    let (d50, d99) = (fig[0].1, fig[0].2);
    table.add("added TTFB p50, µs", &fig[1..].iter().map(|f| (f.0, f.1 - d50)).collect::<Vec<_>>(), 1, true);
    table.add("added TTFB p99, µs", &fig[1..].iter().map(|f| (f.0, f.2 - d99)).collect::<Vec<_>>(), 1, true);
    Ok(())
}
