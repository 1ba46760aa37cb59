//! Memory per open stream: `N` streams held open at once through each hop
//! (1,000 and 10,000 by default) from a mock whose events trickle out, the
//! hop's RSS idle, at the height (all open, each past its first event), and
//! `--settle` seconds after the client dropped them all (glibc gives freed
//! arenas back slowly: ~120 s is what it needs for the figure to settle).
//!
//! The open-file limit here is 20,000 per process: 10,000 streams on HTTP/1.1
//! would need 20,000 descriptors in the hop (client side and upstream side).
//! As the soak does (bench/chaos/src/soak.rs), client streams are multiplexed
//! over prior-knowledge HTTP/2 connections, `--per-conn` (100) to a
//! connection; each hop reaches the mock over HTTP/1.1, one connection per
//! stream. HAProxy allows 100 concurrent streams per HTTP/2 connection by
//! default, hence 100.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures_util::StreamExt;

use crate::hops::{self, Ctx, Hop};
use crate::measure::{fds, status_kib};
use crate::procs::{self, Reply};
use crate::request::Request;
use crate::table::Table;

/// Streams held open, and the connections they ride on.
struct Held {
    _streams: Vec<reqwest::Response>,
    _clients: Vec<reqwest::Client>,
}

fn h2_client() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().http2_prior_knowledge().tcp_nodelay(true).no_proxy().build()?)
}

/// Opens `n` streams over HTTP/2 to `url`, each read up to its first chunk.
async fn open(url: &str, n: usize, per_conn: usize, req: &Request) -> Result<Held> {
    let clients: Vec<_> = (0..n.div_ceil(per_conn)).map(|_| h2_client()).collect::<Result<_>>()?;
    let mut pending = futures_util::stream::iter((0..n).map(|i| {
        let b = req.to(&clients[i / per_conn], url);
        async move {
            let mut r = b.send().await?;
            if !r.status().is_success() {
                bail!("status {}", r.status());
            }
            r.chunk().await?;
            Ok::<_, anyhow::Error>(r)
        }
    }))
    .buffer_unordered(512);
    let mut streams = Vec::with_capacity(n);
    while let Some(r) = pending.next().await {
        streams.push(r?);
    }
    drop(pending);
    Ok(Held { _streams: streams, _clients: clients })
}

/// (idle, height, after) RSS in KiB, open seconds, fds at the height.
#[derive(Default, Clone, Copy)]
struct Fig {
    idle: u64,
    height: u64,
    after: u64,
    open_s: f64,
    fds: usize,
    fds_after: usize,
}

async fn hold(hop: &Hop, n: usize, args: &crate::Args, req: &Request) -> Result<Fig> {
    let mut f = Fig { idle: status_kib(hop.pid, "VmRSS:")?, ..Fig::default() };
    let t = Instant::now();
    let held = open(&hop.h2_url, n, args.per_conn, req).await?;
    f.open_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.height = status_kib(hop.pid, "VmRSS:")?.max(status_kib(hop.pid, "VmHWM:")?);
    f.fds = fds(hop.pid);
    drop(held);
    Ok(f)
}

pub async fn run(ctx: &Ctx, args: &crate::Args, table: &mut Table) -> Result<()> {
    let slow = procs::mock(&ctx.mock_bin, Reply::Normal { chunk_delay_ms: args.hold_event_ms })?;
    let req = Request::new(args.bare_request, true);
    for &n in &args.streams {
        let hops = hops::start(ctx, &slow, &format!("mem{n}"), false)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut figs = Vec::new();
        for hop in &hops {
            figs.push(hold(hop, n, args, &req).await?);
        }
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        for (hop, f) in hops.iter().zip(&mut figs) {
            f.after = status_kib(hop.pid, "VmRSS:")?;
            f.fds_after = fds(hop.pid);
        }
        table.section(format!(
            "{n} concurrent open streams, HTTP/2 from the client ({} per connection), HTTP/1.1 to the mock; after = {} s after closing",
            args.per_conn, args.settle
        ));
        let by = |g: &dyn Fn(&Fig) -> f64| -> Vec<(&str, f64)> {
            hops.iter().zip(&figs).map(|(h, f)| (h.name, g(f))).collect()
        };
        table.add(format!("RSS idle, MiB ({n})"), &by(&|f| f.idle as f64 / 1024.0), 1, false);
        table.add(format!("RSS at the height, MiB ({n})"), &by(&|f| f.height as f64 / 1024.0), 1, true);
        table.add(format!("RSS after close, MiB ({n})"), &by(&|f| f.after as f64 / 1024.0), 1, true);
        table.add(
            format!("KiB per open stream ({n}), (height − idle) / N"),
            &by(&|f| f.height.saturating_sub(f.idle) as f64 / n as f64),
            1,
            true,
        );
        table.add(format!("fds at the height ({n})"), &by(&|f| f.fds as f64), 0, false);
        table.add(format!("fds after close ({n})"), &by(&|f| f.fds_after as f64), 0, false);
        table.add(format!("seconds to open all ({n})"), &by(&|f| f.open_s), 1, false);
    }
    Ok(())
}
