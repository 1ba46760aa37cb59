//! `[ledger]` and `[prices]`: where the usage ledger is kept and what tokens
//! cost (`crate::ledger`).
//!
//! The ledger file is on by default, like the state file: in the state
//! directory, named after the config file (so two gateways on one machine
//! never share one), never beside the config (which may be read-only).
//! Replicas share a PostgreSQL database instead (`url`), so a budget holds
//! over all of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ledger::prices::{Price, Prices};

/// `[ledger]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// The SQLite file: unset, the default ([`LedgerConfig::locate_file`]);
    /// `""`, no ledger; else this path (relative to the config's directory).
    pub file: Option<String>,
    /// A PostgreSQL database (`postgres://user:password@host:port/db`)
    /// instead of the file: the store replicas share.
    pub url: Option<String>,
    /// Longest an answered request's entry waits before it is written, ms:
    /// what a SIGKILL can lose at most.
    pub flush_ms: u64,
    /// Most entries kept waiting while the store cannot be written; beyond
    /// it new entries are dropped and counted.
    pub queue_max: usize,
    /// The file in force, resolved when the config file was loaded.
    #[serde(skip)]
    pub file_path: Option<PathBuf>,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig { file: None, url: None, flush_ms: 1_000, queue_max: 100_000, file_path: None }
    }
}

impl LedgerConfig {
    /// Resolves [`LedgerConfig::file`] for a config loaded from
    /// `config_path`: a path given is relative to the config's directory;
    /// `""` is none; unset is `ledger-<hash>.sqlite` in the state directory.
    /// With a `url`, there is no file (and one named is refused by
    /// [`check`]).
    pub fn locate_file(&mut self, config_path: &Path) {
        self.file_path = match self.url {
            Some(_) => None,
            None => super::state::locate(self.file.as_deref(), config_path, Some("ledger"), "sqlite"),
        };
    }

    /// Whether there is a ledger: a database, or a file.
    pub fn on(&self) -> bool {
        self.url.is_some() || self.file_path.is_some()
    }

    /// The setting that names the store, for an error about it.
    pub fn setting(&self) -> &'static str {
        if self.url.is_some() { "ledger.url" } else { "ledger.file" }
    }
}

/// One `[prices."pattern"]`: USD per million tokens. Cache reads and writes
/// left out are priced as Anthropic prices them against input: reads at a
/// tenth, (5-minute) writes at 1.25×.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Plain input tokens.
    pub input: f64,
    /// Output tokens.
    pub output: f64,
    /// Input tokens read from the prompt cache (default: input × 0.1).
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Input tokens written to the prompt cache (default: input × 1.25).
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl PriceConfig {
    /// The price, with the cache defaults filled in.
    pub fn price(&self) -> Price {
        Price {
            input: self.input,
            output: self.output,
            cache_read: self.cache_read.unwrap_or(self.input * 0.1),
            cache_write: self.cache_write.unwrap_or(self.input * 1.25),
        }
    }
}

/// The prices in force: the defaults with `[prices]` over them.
pub fn prices(table: &BTreeMap<String, PriceConfig>) -> Prices {
    Prices::with(&table.iter().map(|(k, v)| (k.clone(), v.price())).collect())
}

/// The meaning of `[prices]` (each pattern a name or `prefix*`) and of the
/// keys' limits: a model pattern is a name or `prefix*`; a budget needs the
/// ledger (kept only in memory, it would reset with every restart).
pub fn check(config: &super::Config, add: &mut impl FnMut(String, String)) {
    if let Some(url) = &config.ledger.url {
        if config.ledger.file.is_some() {
            add(
                "ledger.url".into(),
                "the ledger is kept in one store: a PostgreSQL url or a SQLite file, not both (remove `file`)".into(),
            );
        }
        if let Err(why) = crate::ledger::postgres::check_url(url) {
            add("ledger.url".into(), why);
        }
    }
    for (pattern, p) in &config.prices {
        if let Some(why) = crate::ledger::prices::check(pattern, &p.price()) {
            add(format!("prices.\"{pattern}\""), why);
        }
    }
    for (i, key) in config.server.client_keys.iter().enumerate() {
        for problem in key.limits.problems() {
            let (field, why) = problem.split_once(": ").unwrap_or(("", &problem));
            add(format!("server.client_keys[{i}].{field}"), why.to_string());
        }
        let l = &key.limits;
        let usd = [l.budget_usd_day, l.budget_usd_week, l.budget_usd_month].iter().any(Option::is_some);
        let priced = prices(&config.prices);
        for f in config.fallback.iter().filter(|f| usd && priced.of(&f.model).is_none()) {
            add(
                format!("server.client_keys[{i}]"),
                format!(
                    "key `{}` has a USD budget, and fallback `{}`'s model `{}` has no price: add it to [prices]",
                    key.name, f.name, f.model
                ),
            );
        }
        if key.has_budget() && !config.ledger.on() {
            add(
                format!("server.client_keys[{i}]"),
                format!(
                    "key `{}` has a budget, which needs the usage ledger to hold across a restart, \
                     and there is none ([ledger] file is \"\", or no state directory): set a file or a url, or remove the budget",
                    key.name
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_file_is_off_with_an_empty_path_relative_to_the_config_and_by_default_per_config() {
        let mut l = LedgerConfig { file: Some("".into()), ..LedgerConfig::default() };
        l.locate_file(Path::new("/etc/poolgate/poolgate.toml"));
        assert_eq!(l.file_path, None);
        l.file = Some("usage/ledger.sqlite".into());
        l.locate_file(Path::new("/etc/poolgate/poolgate.toml"));
        assert_eq!(l.file_path.as_deref(), Some(Path::new("/etc/poolgate/usage/ledger.sqlite")));
        l.file = None;
        l.locate_file(Path::new("/etc/poolgate/a.toml"));
        let a = l.file_path.clone().unwrap();
        l.locate_file(Path::new("/etc/poolgate/b.toml"));
        let b = l.file_path.clone().unwrap();
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with("ledger-"));
        assert_eq!(a.extension().unwrap(), "sqlite");
    }

    #[test]
    fn a_url_stands_for_the_file() {
        let mut l = LedgerConfig { url: Some("postgres://u@h/db".into()), ..LedgerConfig::default() };
        l.locate_file(Path::new("/etc/poolgate/a.toml"));
        assert_eq!((l.file_path.as_deref(), l.on(), l.setting()), (None, true, "ledger.url"));
        l.url = None;
        l.locate_file(Path::new("/etc/poolgate/a.toml"));
        assert_eq!((l.on(), l.setting()), (true, "ledger.file"));
    }

    #[test]
    fn cache_prices_left_out_follow_the_input_price() {
        let p = PriceConfig { input: 2.0, output: 8.0, cache_read: None, cache_write: Some(3.0) }.price();
        assert_eq!((p.cache_read, p.cache_write), (0.2, 3.0));
    }
}
