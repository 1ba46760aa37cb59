//! The JSON case format shared by `poolgate rank` and `poolgate plugin test`: a
//! pool of accounts with their state, the request facts, the clock, optionally the
//! outcomes observed before, and (for tests) what the decision must be.
//!
//! ```json
//! {
//!   "name": "headroom picks the emptiest seat",
//!   "now_ms": 1760000000000,
//!   "request": { "model": "claude-sonnet-4-5", "session": "s1" },
//!   "accounts": [
//!     { "id": "a", "windows": [ { "name": "5h", "utilization": 0.7 } ] },
//!     { "id": "b", "windows": [ { "name": "5h", "utilization": 0.2 } ] }
//!   ],
//!   "expect": { "order": ["b", "a"], "reason": "headroom" }
//! }
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::account::{AccountSnapshot, model_family};
use crate::policy::Candidates;
use crate::policy::types as wit;

/// One case.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// A short name, printed by the test harness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Why the case exists (where it comes from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The clock, ms since the epoch.
    pub now_ms: u64,
    /// The request facts.
    #[serde(default)]
    pub request: CaseRequest,
    /// The pool, in pool order.
    pub accounts: Vec<AccountSnapshot>,
    /// Outcomes reported before the request is ranked, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observe: Vec<Observation>,
    /// The plugin's options (for `plugin test`; `{}` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
    /// How old a quota reading may be and still count as fresh, ms: what the
    /// operator's `[policy] freshness_ms` would say (15 minutes when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freshness_ms: Option<u64>,
    /// A whole chain to run instead of the plugin under test; a stage whose plugin
    /// is `self` is the plugin under test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Vec<CaseStage>>,
    /// What the decision must be (for `plugin test`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expect>,
}

/// A chain stage inside a case.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseStage {
    /// `builtin:<name>`, a `.wasm` path, or `self`.
    pub plugin: String,
    /// The stage's options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

/// The request facts of a case.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    /// Request number.
    #[serde(default = "one")]
    pub id: u64,
    /// The model asked for.
    #[serde(default)]
    pub model: String,
    /// The session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// `messages`, `count_tokens`, `chat_completions` or `models`.
    #[serde(default)]
    pub api: Api,
    /// Failover attempt (0 = first try).
    #[serde(default)]
    pub attempt: u32,
    /// Whether the body can be replayed.
    #[serde(default = "yes")]
    pub replayable: bool,
}

fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}

impl Default for CaseRequest {
    fn default() -> Self {
        CaseRequest { id: 1, model: String::new(), session: None, api: Api::Messages, attempt: 0, replayable: true }
    }
}

/// The API shape, as cases spell it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/v1/messages`.
    #[default]
    Messages,
    /// `/v1/messages/count_tokens`.
    CountTokens,
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/models`.
    Models,
}

impl Api {
    /// The WIT value.
    pub fn to_wit(self) -> wit::ApiShape {
        match self {
            Api::Messages => wit::ApiShape::Messages,
            Api::CountTokens => wit::ApiShape::CountTokens,
            Api::ChatCompletions => wit::ApiShape::ChatCompletions,
            Api::Models => wit::ApiShape::Models,
        }
    }
}

/// An outcome reported before ranking.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// When the request ended.
    pub at_ms: u64,
    /// The account id that served (or failed).
    pub account: String,
    /// The session of that request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The model of that request.
    #[serde(default)]
    pub model: String,
    /// How it ended.
    #[serde(default)]
    pub outcome: CaseOutcome,
}

/// How an observed request ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseOutcome {
    /// 2xx.
    #[default]
    Success,
    /// 429.
    RateLimited,
    /// 529.
    Overloaded,
    /// 5xx.
    UpstreamError,
    /// Connection or stream failure.
    Failed,
}

impl CaseOutcome {
    /// The WIT value.
    pub fn to_wit(self) -> wit::Outcome {
        match self {
            CaseOutcome::Success => wit::Outcome::Success,
            CaseOutcome::RateLimited => wit::Outcome::RateLimited(None),
            CaseOutcome::Overloaded => wit::Outcome::Overloaded,
            CaseOutcome::UpstreamError => wit::Outcome::UpstreamError(500),
            CaseOutcome::Failed => wit::Outcome::Failed,
        }
    }
}

/// What a test case expects.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The full final order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
    /// Just the head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// The decision's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A substring of the decision's detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail_contains: Option<String>,
}

impl Case {
    /// Parses one case from JSON text.
    pub fn parse(text: &str) -> Result<Case> {
        let case: Case = serde_json::from_str(text)?;
        case.check()?;
        Ok(case)
    }

    fn check(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for a in &self.accounts {
            if a.id.is_empty() {
                bail!("an account has an empty id");
            }
            if !seen.insert(&a.id) {
                bail!("account id `{}` appears twice", a.id);
            }
        }
        for o in &self.observe {
            if !seen.contains(&o.account) {
                bail!("observe names account `{}`, which is not in the pool", o.account);
            }
        }
        Ok(())
    }

    /// The pool table for `configure`.
    pub fn pool(&self) -> Vec<wit::AccountInfo> {
        self.accounts.iter().map(|a| crate::policy::view::pool_entry(&a.id, a.alias(), a.primary)).collect()
    }

    /// The request record.
    pub fn request(&self) -> wit::Request {
        let r = &self.request;
        wit::Request {
            id: r.id,
            now_ms: self.now_ms,
            model: r.model.clone(),
            session: r.session.clone(),
            api: r.api.to_wit(),
            attempt: r.attempt,
            replayable: r.replayable,
            decided_by: None,
        }
    }

    /// The freshness the case runs with: its own `freshness_ms`, else the
    /// host's default.
    pub fn freshness(&self) -> u64 {
        self.freshness_ms.unwrap_or(crate::account::DEFAULT_FRESHNESS_MS)
    }

    /// The candidates as the chain's first stage receives them (before the
    /// usable-first partition), with their windows.
    pub fn candidates(&self, freshness_ms: u64) -> Candidates {
        let family = model_family(&self.request.model);
        let accounts = self.accounts.iter().enumerate().map(|(i, a)| (i as u32, a));
        crate::policy::view::candidates(accounts, family, self.now_ms, freshness_ms)
    }

    /// The observations as (request, pool index, outcome).
    pub fn observations(&self) -> Vec<(wit::Request, u32, wit::Outcome)> {
        self.observe
            .iter()
            .enumerate()
            .map(|(n, o)| {
                let idx = self.accounts.iter().position(|a| a.id == o.account).unwrap_or(0) as u32;
                let req = wit::Request {
                    id: 1_000_000 + n as u64,
                    now_ms: o.at_ms,
                    model: o.model.clone(),
                    session: o.session.clone(),
                    api: wit::ApiShape::Messages,
                    attempt: 0,
                    replayable: true,
                    decided_by: None,
                };
                (req, idx, o.outcome.to_wit())
            })
            .collect()
    }
}

/// Reads the cases in `path`: a `.json` file holding one case or an array of cases,
/// or a directory of such files (sorted by name). Each case is returned with the
/// file it came from.
pub fn load_cases(path: &Path) -> Result<Vec<(PathBuf, Case)>> {
    load_all(path)
}

/// The one case of `path` that `selector` picks: its 1-based number (as `plugin
/// test` counts them) or its `name`. Without a selector the file must hold a
/// single case; otherwise the error lists them.
pub fn load_case(path: &Path, selector: Option<&str>) -> Result<(PathBuf, Case)> {
    let mut cases = load_all(path)?;
    let listing = |cases: &[(PathBuf, Case)]| {
        cases
            .iter()
            .enumerate()
            .map(|(i, (file, c))| {
                let file = file.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
                format!("  {:>3}  {file}: {}", i + 1, c.name.as_deref().unwrap_or("(no name)"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    match selector {
        None if cases.len() == 1 => Ok(cases.remove(0)),
        None if cases.is_empty() => bail!("{} holds no cases", path.display()),
        None => bail!(
            "{} holds {} cases; pick one with --case <number or name>:\n{}",
            path.display(),
            cases.len(),
            listing(&cases)
        ),
        Some(sel) => {
            let at = match sel.parse::<usize>() {
                Ok(n) if (1..=cases.len()).contains(&n) => Some(n - 1),
                Ok(_) => None,
                Err(_) => cases.iter().position(|(_, c)| c.name.as_deref() == Some(sel)),
            };
            match at {
                Some(i) => Ok(cases.swap_remove(i)),
                None => bail!("{} has no case `{sel}`; its cases are:\n{}", path.display(), listing(&cases)),
            }
        }
    }
}

fn load_all(path: &Path) -> Result<Vec<(PathBuf, Case)>> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))? {
            let p = entry?.path();
            if p.extension().is_some_and(|e| e == "json") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))?;
        let items = match value {
            serde_json::Value::Array(items) => items,
            one => vec![one],
        };
        for (i, item) in items.into_iter().enumerate() {
            let case: Case = serde_json::from_value(item)
                .with_context(|| format!("{} case #{}: not a valid case", file.display(), i + 1))?;
            case.check().with_context(|| format!("{} case #{}", file.display(), i + 1))?;
            cases.push((file.clone(), case));
        }
    }
    Ok(cases)
}
