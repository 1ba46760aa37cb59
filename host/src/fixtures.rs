//! The fixture harness behind `poolgate plugin test`: run JSON cases through a
//! plugin on the real WASM path and compare the decision with what each case
//! expects.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::case::Case;
use crate::policy::{
    BreakerConfig, Chain, Decision, Limits, MemoryState, PluginRef, PluginSpec, PolicyEngine, StageSpec,
};

/// The verdict on one case.
#[derive(Debug)]
pub struct CaseResult {
    /// The file the case came from.
    pub file: PathBuf,
    /// The case's name (or its position).
    pub name: String,
    /// Why it failed; empty when it passed.
    pub failures: Vec<String>,
    /// The decision, when the chain could be loaded.
    pub decision: Option<Decision>,
}

impl CaseResult {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

fn spec(plugin: &PluginRef, config: Option<&serde_json::Value>, timeout: Duration, freshness_ms: u64) -> StageSpec {
    StageSpec {
        name: plugin.to_string(),
        plugin: PluginSpec {
            scope: plugin.default_scope(),
            plugin: plugin.clone(),
            config_json: config.map_or_else(|| "{}".to_string(), |c| c.to_string()),
            limits: Limits { deadline: timeout, freshness_ms, ..Limits::default() },
            max_idle: 1,
            max_instances: 1,
        },
    }
}

/// The chain a case runs: its own `chain` (where `self` is `plugin`), or `plugin`
/// alone with the case's `config`.
pub fn stages_for(case: &Case, plugin: &PluginRef, timeout: Duration) -> Vec<StageSpec> {
    let freshness = case.freshness();
    match &case.chain {
        Some(stages) => stages
            .iter()
            .map(|s| {
                let p = if s.plugin == "self" { plugin.clone() } else { PluginRef::parse(&s.plugin) };
                spec(&p, s.config.as_ref(), timeout, freshness)
            })
            .collect(),
        None => vec![spec(plugin, case.config.as_ref(), timeout, freshness)],
    }
}

/// Runs one case: a fresh chain and state store, the observations in order, then
/// the ranking. Also answers how each `observe` that failed failed (one line
/// each): a case whose `observe` trapped fails, whatever its ranking.
pub async fn run_case(
    engine: &Arc<PolicyEngine>,
    plugin: &PluginRef,
    case: &Case,
    timeout: Duration,
) -> Result<(Decision, Vec<String>)> {
    let chain = Chain::load(
        engine,
        stages_for(case, plugin, timeout),
        case.pool(),
        Arc::new(MemoryState::default()),
        BreakerConfig::default(),
    )
    .await?;
    let mut observe_failures = Vec::new();
    for (i, (req, account, outcome)) in case.observations().into_iter().enumerate() {
        let id = case.accounts.get(account as usize).map_or("?", |a| a.id.as_str());
        for e in chain.observe(&req, account, &outcome).await {
            observe_failures.push(format!(
                "observe #{} (account {id}) failed in stage `{}` ({}): {}",
                i + 1,
                e.stage,
                e.cause.as_str(),
                e.message
            ));
        }
    }
    let decision = chain.rank(case.request(), case.candidates(case.freshness())).await;
    Ok((decision, observe_failures))
}

/// Compares a decision with a case's `expect`; each mismatch is one line.
pub fn check(case: &Case, decision: &Decision) -> Vec<String> {
    let mut failures = Vec::new();
    let Some(expect) = &case.expect else {
        return vec!["the case has no `expect`".into()];
    };
    if let Some(order) = &expect.order
        && &decision.order != order
    {
        failures.push(format!("order: expected {}, got {}", order.join(" > "), decision.order.join(" > ")));
    }
    if let Some(head) = &expect.head
        && decision.order.head() != Some(head.as_str())
    {
        failures.push(format!(
            "head: expected {head}, got {} (order {})",
            decision.order.head().unwrap_or("nothing"),
            decision.order.join(" > ")
        ));
    }
    if let Some(reason) = &expect.reason
        && &decision.reason != reason
    {
        failures.push(format!("reason: expected {reason}, got {}", decision.reason));
    }
    if let Some(fragment) = &expect.detail_contains {
        // The decision's detail, or any stage's: a modifier that did not act
        // (affinity skipped, skip-exhausted dropping) reports only on its stage.
        // The deciding stage's detail is also the decision's: list it once.
        let mut details: Vec<&str> = Vec::new();
        for d in
            decision.detail.as_deref().into_iter().chain(decision.stages.iter().filter_map(|s| s.detail.as_deref()))
        {
            if !details.contains(&d) {
                details.push(d);
            }
        }
        if !details.iter().any(|d| d.contains(fragment.as_str())) {
            failures.push(format!("detail: expected one to contain {fragment:?}, got {details:?}"));
        }
    }
    failures
}

/// Runs every case and judges it, on the same asynchronous path `serve` runs
/// plugins on. Call from synchronous code (the CLI, tests).
pub fn run_all(
    engine: &Arc<PolicyEngine>,
    plugin: &PluginRef,
    cases: &[(PathBuf, Case)],
    timeout: Duration,
) -> Vec<CaseResult> {
    crate::policy::block_on(async {
        let mut results = Vec::with_capacity(cases.len());
        for (i, (file, case)) in cases.iter().enumerate() {
            let name = case.name.clone().unwrap_or_else(|| format!("case #{}", i + 1));
            results.push(match run_case(engine, plugin, case, timeout).await {
                Ok((decision, mut failures)) => {
                    failures.extend(check(case, &decision));
                    CaseResult { file: file.clone(), name, failures, decision: Some(decision) }
                }
                Err(e) => CaseResult {
                    file: file.clone(),
                    name,
                    failures: vec![format!("chain failed to load: {e:#}")],
                    decision: None,
                },
            });
        }
        results
    })
}

/// Runs the fixtures at `path` against `plugin`, failing with a summary when any
/// case fails (for tests).
pub fn assert_fixtures(engine: &Arc<PolicyEngine>, plugin: &str, path: &std::path::Path) -> Result<usize> {
    let cases = crate::case::load_cases(path)?;
    if cases.is_empty() {
        bail!("no cases in {}", path.display());
    }
    let results = run_all(
        engine,
        &PluginRef::parse(plugin),
        &cases,
        Duration::from_millis(crate::policy::DEFAULT_DEADLINE_MS * 4),
    );
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{} — {}: {}", r.file.display(), r.name, r.failures.join("; ")))
        .collect();
    if !failed.is_empty() {
        bail!("{} of {} cases failed:\n{}", failed.len(), results.len(), failed.join("\n"));
    }
    Ok(results.len())
}
