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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The share of each window already used at the start, by its name
    /// (`5h`, `7d`, `7d_opus`); unnamed windows start unused.
    pub used: BTreeMap<String, f64>,
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
            used: BTreeMap::new(),
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
        let window = |name: &str, budget: u64, period: Duration, elapsed: Duration| WindowSpec {
            budget_tokens: budget,
            used: self.used.get(name).copied().unwrap_or(0.0).clamp(0.0, 1.0),
            resets_in: Some(period.saturating_sub(elapsed).max(Duration::from_secs(1))),
        };
        let five_elapsed = Duration::from_secs(self.five_hour_elapsed_minutes * 60);
        let seven_elapsed = Duration::from_secs(self.seven_day_elapsed_hours * 3600);
        let mut spec = AccountSpec::new(name, self.five_hour_tokens, self.seven_day_tokens);
        spec.five_hour = window("5h", self.five_hour_tokens, HOURS_5, five_elapsed);
        spec.seven_day = window("7d", self.seven_day_tokens, DAYS_7, seven_elapsed);
        spec.buckets = self
            .buckets
            .iter()
            .map(|(family, &tokens)| BucketSpec {
                name: family.clone(),
                family: family.clone(),
                window: window(&format!("7d_{family}"), tokens, DAYS_7, seven_elapsed),
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

    /// These plans with where each account of a running gateway stands now:
    /// `status` is its `GET /status` answer; each account's 5h and 7d
    /// readings set how far into those windows it is and how much of each
    /// window (buckets too) is used. What a window holds is not in a status
    /// (only shares are): the sizes stay these plans'.
    pub fn with_status(mut self, status: &serde_json::Value) -> Result<Plans> {
        let now = status["now_ms"].as_u64().context("not a /status answer: no `now_ms`")?;
        let accounts = status["accounts"].as_array().context("not a /status answer: no `accounts`")?;
        for a in accounts {
            let Some(id) = a["id"].as_str() else { continue };
            let mut plan = self.accounts.get(id).cloned().unwrap_or_else(|| self.defaults.clone());
            for w in a["windows"].as_array().into_iter().flatten() {
                let (Some(name), Some(used)) = (w["name"].as_str(), w["utilization"].as_f64()) else { continue };
                plan.used.insert(name.to_string(), used);
                let left_ms = w["resets_at_ms"].as_u64().map(|r| r.saturating_sub(now));
                match (name, left_ms) {
                    ("5h", Some(left)) => plan.five_hour_elapsed_minutes = 299u64.saturating_sub(left / 60_000),
                    ("7d", Some(left)) => plan.seven_day_elapsed_hours = 167u64.saturating_sub(left / 3_600_000),
                    _ => {}
                }
            }
            self.accounts.insert(id.to_string(), plan);
        }
        Ok(self)
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

    #[test]
    fn a_running_gateways_status_sets_where_each_account_starts() {
        let now = 1_767_571_200_000u64;
        let status = serde_json::json!({"now_ms": now, "accounts": [
            {"id": "a", "windows": [
                {"name": "5h", "utilization": 0.4, "resets_at_ms": now + 60 * 60_000},
                {"name": "7d", "utilization": 0.9, "resets_at_ms": now + 24 * 3_600_000},
                {"name": "7d_opus", "utilization": 1.0}]},
            {"id": "b", "windows": []}]});
        let plans = Plans::default().with_status(&status).unwrap();
        let a = plans.of("a", 0, 2);
        assert_eq!((a.five_hour_elapsed_minutes, a.seven_day_elapsed_hours), (239, 143));
        let spec = a.spec("a");
        assert_eq!((spec.five_hour.used, spec.seven_day.used, spec.buckets[0].window.used), (0.4, 0.9, 1.0));
        assert_eq!(spec.five_hour.resets_in, Some(Duration::from_secs(61 * 60)), "within a minute of the status");
        assert_eq!(plans.of("b", 1, 2).five_hour_elapsed_minutes, 0, "named now: not staggered");
        assert!(Plans::default().with_status(&serde_json::json!({})).is_err());
    }
}
