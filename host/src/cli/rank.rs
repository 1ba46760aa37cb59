//! `poolgate rank`: one case through the configured chain.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail};

use crate::case::load_cases;
use crate::policy::{Chain, MemoryState, PolicyEngine};

/// Arguments of `poolgate rank`.
#[derive(clap::Args)]
pub struct Args {
    /// The gateway config whose `[[policy.chain]]` to run (default chain if omitted).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The JSON case: accounts, request facts, `now_ms`.
    #[arg(long, short)]
    input: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let config = super::load_config(args.config.as_ref())?;
    let mut cases = load_cases(&args.input)?;
    if cases.len() != 1 {
        bail!("{} holds {} cases; `rank` takes exactly one", args.input.display(), cases.len());
    }
    let (_, case) = cases.remove(0);
    let engine = PolicyEngine::new(config.cache_dir())?;
    let decision = crate::policy::block_on(async {
        let state = Arc::new(MemoryState::default());
        let chain = Chain::load(&engine, config.stage_specs()?, case.pool(), state, config.breaker()).await?;
        for (req, account, outcome) in case.observations() {
            chain.observe(&req, account, &outcome).await;
        }
        anyhow::Ok(chain.rank(case.request(), case.candidates(config.policy.freshness_ms)).await)
    })?;
    println!("{}", serde_json::to_string_pretty(&decision)?);
    Ok(ExitCode::SUCCESS)
}
