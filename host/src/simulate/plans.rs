//! What each simulated account holds: its plan (`--pool pool.toml`).
//!
//! ```toml
//! # Every account of a compared config without a plan of its own.
//! [defaults]
//! five_hour_tokens = 6_000_000
//! seven_day_tokens = 60_000_000
//! buckets = { opus = 20_000_000 }   # per-model weekly buckets (7d_opus)
//!
//! # By account id: a bigger seat, 3 hours into its 5h window at the start.
//! [accounts.seat-max]
//! five_hour_tokens = 12_000_000
//! seven_day_tokens = 120_000_000
//! five_hour_elapsed_minutes = 180
//! seven_day_elapsed_hours = 50
//!
//! # An API key has per-minute limits instead of windows.
//! [accounts.api-overflow]
//! requests_per_minute = 50
//! input_tokens_per_minute = 40_000
//! output_tokens_per_minute = 8_000
//! ```
//!
//! `stagger = true` (the default) spreads the window phases of the accounts on
//! the default plan: the `i`-th of `n` starts `i/n` of the way into its
//! windows. The defaults without a file are the `[defaults]` above. They are not
//! Anthropic's numbers (which are not published): size the plans to what
//! your seats' `/status` shows a window holding, e.g. the tokens served
//! while its utilization rose by a known fraction.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::sim::scenario::{AccountSpec, BucketSpec, WindowSpec};

/// One account's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Plan {
    /// Tokens a 5-hour window holds.
    pub five_hour_tokens: u64,
    /// Tokens a 7-day window holds.
    pub seven_day_tokens: u64,
    /// Per-model weekly buckets: family (`opus`, `sonnet`) → tokens.
    pub buckets: BTreeMap<String, u64>,
    /// How far into its 5-hour window the account is when the simulation starts.
    pub five_hour_elapsed_minutes: u64,
    /// How far into its 7-day window (and its buckets') it is.
    pub seven_day_elapsed_hours: u64,
    /// An API key's requests a minute (API keys have per-minute limits, not
    /// the windows above); 0: no limit.
    pub requests_per_minute: u64,
    /// An API key's input tokens a minute (uncached input and cache writes).
    pub input_tokens_per_minute: u64,
    /// An API key's output tokens a minute.
    pub output_tokens_per_minute: u64,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            five_hour_tokens: 6_000_000,
            seven_day_tokens: 60_000_000,
            buckets: BTreeMap::from([("opus".to_string(), 20_000_000)]),
            five_hour_elapsed_minutes: 0,
            seven_day_elapsed_hours: 0,
            // Anthropic's published tier 4 for Sonnet.
            requests_per_minute: 4_000,
            input_tokens_per_minute: 2_000_000,
            output_tokens_per_minute: 400_000,
        }
    }
}

impl Plan {
    /// The simulated account `name` this plan makes.
    pub fn spec(&self, name: &str) -> AccountSpec {
        let window = |budget: u64, period: Duration, elapsed: Duration| WindowSpec {
            budget_tokens: budget,
            used: 0.0,
            resets_in: Some(period.saturating_sub(elapsed).max(Duration::from_secs(1))),
        };
        let five = window(self.five_hour_tokens, HOURS_5, Duration::from_secs(self.five_hour_elapsed_minutes * 60));
        let seven_elapsed = Duration::from_secs(self.seven_day_elapsed_hours * 3600);
        let mut spec = AccountSpec::new(name, self.five_hour_tokens, self.seven_day_tokens);
        spec.five_hour = five;
        spec.seven_day = window(self.seven_day_tokens, DAYS_7, seven_elapsed);
        spec.buckets = self
            .buckets
            .iter()
            .map(|(family, &tokens)| BucketSpec {
                name: family.clone(),
                family: family.clone(),
                window: window(tokens, DAYS_7, seven_elapsed),
            })
            .collect();
        spec
    }
}

const HOURS_5: Duration = Duration::from_secs(5 * 3600);
const DAYS_7: Duration = Duration::from_secs(7 * 86_400);

/// A pool file: defaults and plans by account id.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Plans {
    /// The plan of an account not named in `accounts`.
    pub defaults: Plan,
    /// Plans by account id.
    pub accounts: BTreeMap<String, Plan>,
    /// Whether accounts on the default plan start at different points of
    /// their windows — the `i`-th of `n` is `i/n` of the way into its 5h and
    /// its 7d window — as seats bought or first used at different times do.
    /// With `false`, every default window starts with the simulation.
    pub stagger: bool,
}

impl Default for Plans {
    fn default() -> Self {
        Plans { defaults: Plan::default(), accounts: BTreeMap::new(), stagger: true }
    }
}

impl Plans {
    /// Reads a pool file, naming the key of a problem.
    pub fn read(path: &std::path::Path) -> Result<Plans> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let plans: Plans = toml::from_str(&text).with_context(|| format!("{}: not a pool file", path.display()))?;
        for (id, p) in
            std::iter::once(("defaults", &plans.defaults)).chain(plans.accounts.iter().map(|(k, v)| (k.as_str(), v)))
        {
            if p.five_hour_tokens == 0 || p.seven_day_tokens == 0 {
                bail!("{}: `{id}`: a window must hold at least one token", path.display());
            }
            if p.five_hour_elapsed_minutes >= 300 || p.seven_day_elapsed_hours >= 168 {
                bail!("{}: `{id}`: the elapsed part must be shorter than the window", path.display());
            }
        }
        Ok(plans)
    }

    /// The plan of account `id`, the `i`-th of `n`.
    pub fn of(&self, id: &str, i: usize, n: usize) -> Plan {
        if let Some(p) = self.accounts.get(id) {
            return p.clone();
        }
        let mut p = self.defaults.clone();
        if self.stagger {
            let (i, n) = (i as u64, n.max(1) as u64);
            p.five_hour_elapsed_minutes = (p.five_hour_elapsed_minutes + 300 * i / n) % 300;
            p.seven_day_elapsed_hours = (p.seven_day_elapsed_hours + 168 * i / n) % 168;
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plans_stagger_the_windows_and_a_named_plan_is_kept_as_written() {
        let plans = Plans::default();
        let phases: Vec<_> = (0..4)
            .map(|i| plans.of("x", i, 4))
            .map(|p| (p.five_hour_elapsed_minutes, p.seven_day_elapsed_hours))
            .collect();
        assert_eq!(phases, [(0, 0), (75, 42), (150, 84), (225, 126)]);
        let spec = plans.of("x", 1, 4).spec("x");
        assert_eq!(spec.seven_day.resets_in, Some(Duration::from_secs(126 * 3600)));
        assert_eq!(spec.five_hour.resets_in, Some(Duration::from_secs(225 * 60)));
        assert_eq!(spec.buckets[0].window.resets_in, Some(Duration::from_secs(126 * 3600)));
        let text = "stagger = false\n[accounts.big]\nfive_hour_tokens = 9\nseven_day_tokens = 90\n";
        let dir = std::env::temp_dir().join(format!("poolgate-plans-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pool.toml"), text).unwrap();
        let plans = Plans::read(&dir.join("pool.toml")).unwrap();
        assert_eq!((plans.of("big", 3, 4).five_hour_tokens, plans.of("other", 3, 4)), (9, Plan::default()));
        std::fs::write(dir.join("pool.toml"), "[defaults]\nfive_hour_elapsed_minutes = 300\n").unwrap();
        let err = Plans::read(&dir.join("pool.toml")).unwrap_err().to_string();
        assert!(err.contains("`defaults`: the elapsed part must be shorter than the window"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
