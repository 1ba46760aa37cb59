//! The hops measured side by side in one run: direct (the mock alone),
//! poolgate, HAProxy (when on PATH) and the bare hyper pass-through, all in
//! front of the same mock. Each has an HTTP/1.1 URL and a prior-knowledge
//! HTTP/2 one (the same port but for HAProxy, which needs a `proto h2` bind).

use std::path::PathBuf;

use anyhow::Result;

use crate::procs::{self, Proc, Setup};

/// What starting a hop needs.
pub struct Ctx {
    /// `poolgate`.
    pub bin: PathBuf,
    /// `poolgate-mock-upstream`.
    pub mock_bin: PathBuf,
    /// `poolgate-passthrough`.
    pub passthrough: PathBuf,
    /// Where configs and the gateway's state go.
    pub dir: PathBuf,
    pub setup: Setup,
    pub haproxy: bool,
    /// HAProxy with `option http-no-delay`.
    pub haproxy_no_delay: bool,
}

/// One hop of a run.
pub struct Hop {
    pub name: &'static str,
    pub url: String,
    pub h2_url: String,
    /// The process whose CPU and memory are the hop's (the mock's for direct).
    pub pid: u32,
    _proc: Option<Proc>,
}

/// The hops' names, in the order of the table's columns.
pub const NAMES: [&str; 4] = ["direct", "poolgate", "haproxy", "passthrough"];

/// Starts poolgate, HAProxy (if wanted) and the pass-through in front of
/// `upstream`; with `direct`, the mock itself comes first.
pub fn start(ctx: &Ctx, upstream: &Proc, tag: &str, direct: bool) -> Result<Vec<Hop>> {
    let mut hops = Vec::new();
    if direct {
        let url = upstream.url.clone();
        hops.push(Hop { name: "direct", h2_url: url.clone(), url, pid: upstream.pid(), _proc: None });
    }
    let gw = procs::gateway(&ctx.bin, &upstream.url, &ctx.dir.join(tag), &ctx.setup)?;
    hops.push(Hop { name: "poolgate", url: gw.url.clone(), h2_url: gw.url.clone(), pid: gw.pid(), _proc: Some(gw) });
    if ctx.haproxy {
        let (hp, h2_url) = procs::haproxy(&upstream.url, &ctx.dir, ctx.haproxy_no_delay)?;
        hops.push(Hop { name: "haproxy", url: hp.url.clone(), h2_url, pid: hp.pid(), _proc: Some(hp) });
    }
    let pt = procs::passthrough(&ctx.passthrough, &upstream.url)?;
    hops.push(Hop { name: "passthrough", url: pt.url.clone(), h2_url: pt.url.clone(), pid: pt.pid(), _proc: Some(pt) });
    Ok(hops)
}
