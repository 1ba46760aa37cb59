//! `poolgate rank`: one case through the configured chain.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;

use crate::case::load_case;
use crate::policy::{Chain, MemoryState, PolicyEngine};

/// Arguments of `poolgate rank`.
#[derive(clap::Args)]
pub struct Args {
    /// The gateway config whose `[[policy.chain]]` to run (default chain if omitted).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The JSON case: accounts, request facts, `now_ms` — or a fixture file or
    /// directory holding several (then pick one with `--case`).
    #[arg(long, short)]
    input: PathBuf,
    /// Which case of a multi-case input: its number (1 = first, as `plugin test`
    /// lists them) or its `name`.
    #[arg(long)]
    case: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let config = super::load_config(args.config.as_ref())?;
    let (_, case) = load_case(&args.input, args.case.as_deref())?;
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
    // A fixture says what it expects: say whether this chain meets it (a
    // fixture written for one plugin may not hold for a whole chain, so this
    // informs, it does not fail).
    if case.expect.is_some() {
        let failures = crate::fixtures::check(&case, &decision);
        if failures.is_empty() {
            eprintln!("expect: met");
        } else {
            eprintln!("expect: not met by this chain\n  {}", failures.join("\n  "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
