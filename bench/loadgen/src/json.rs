//! JSON requests (the loadgen's first figures, kept as they were): latency at
//! concurrency 1 interleaved in 4 blocks over the hops (so drift on a shared
//! machine hits every path; median of blocks), then throughput at concurrency
//! 32, one phase per hop, and the CPU per request of each hop's process in
//! each phase (for direct, the mock's).

use std::sync::Arc;

use anyhow::Result;

use crate::hops::{self, Ctx};
use crate::measure::{self, Phase, med};
use crate::procs::{self, Reply};
use crate::request::Request;
use crate::table::Table;

#[derive(Default)]
struct Fig {
    p50: Vec<f64>,
    p99: Vec<f64>,
    c1_cpu: f64,
    c1_n: u64,
    rps: f64,
    c32_ms: f64,
}

pub async fn run(ctx: &Ctx, args: &crate::Args, table: &mut Table) -> Result<()> {
    let up = procs::mock(&ctx.mock_bin, Reply::Normal { chunk_delay_ms: 0 })?;
    let hops = hops::start(ctx, &up, "json", true)?;
    let client = measure::client()?;
    let req = Arc::new(Request::new(args.bare_request, args.sse));
    let mut fig: Vec<Fig> = hops.iter().map(|_| Fig::default()).collect();
    let block = (args.requests / 4).max(100);
    for _ in 0..4 {
        for (hop, f) in hops.iter().zip(&mut fig) {
            let phase = Phase::start(hop.pid)?;
            let (a, b) = measure::latency(&client, &hop.url, block, &req, false).await?;
            f.c1_cpu += phase.seconds()?;
            f.c1_n += (block + block / 10) as u64;
            f.p50.push(a);
            f.p99.push(b);
        }
    }
    for (hop, f) in hops.iter().zip(&mut fig) {
        let phase = Phase::start(hop.pid)?;
        let (rps, n) = measure::throughput(&client, &hop.url, 32, args.seconds, &req).await?;
        f.c32_ms = phase.seconds()? * 1000.0 / n.max(1) as f64;
        f.rps = rps;
    }
    let kind = if args.sse { "SSE (short)" } else { "JSON" };
    table.section(format!(
        "{kind} requests: c=1 {} per path in 4 interleaved blocks (median of blocks); c=32 {} s per path",
        block * 4,
        args.seconds
    ));
    let by =
        |f: &dyn Fn(&Fig) -> f64| -> Vec<(&str, f64)> { hops.iter().zip(&fig).map(|(h, x)| (h.name, f(x))).collect() };
    let (d50, d99) = (med(&fig[0].p50), med(&fig[0].p99));
    table.add("p50 at c=1, µs", &by(&|f| med(&f.p50)), 1, false);
    table.add("p99 at c=1, µs", &by(&|f| med(&f.p99)), 1, false);
    let added = |f: &dyn Fn(&Fig) -> f64| -> Vec<(&str, f64)> { by(f).into_iter().skip(1).collect() };
    table.add("added p50 at c=1, µs", &added(&|f| med(&f.p50) - d50), 1, true);
    table.add("added p99 at c=1, µs", &added(&|f| med(&f.p99) - d99), 1, true);
    table.add(
        "CPU per request at c=1, ms (direct: the mock's)",
        &by(&|f| f.c1_cpu * 1000.0 / f.c1_n.max(1) as f64),
        4,
        true,
    );
    table.add("CPU per request at c=32, ms (direct: the mock's)", &by(&|f| f.c32_ms), 4, true);
    table.add("throughput at c=32, req/s", &by(&|f| f.rps), 0, true);
    Ok(())
}
