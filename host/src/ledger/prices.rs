//! What a request cost: its usage priced by model, with cache reads and
//! writes priced apart from plain input.
//!
//! Prices are USD per million tokens, matched to the model by name: an exact
//! name wins, else the pattern `prefix*` with the longest prefix — so
//! `claude-opus-4-5*` beats `claude-opus-4*` for `claude-opus-4-5-20251101`.
//! The defaults are Anthropic's list prices for the Claude models when this
//! table was written (5-minute cache writes); `[prices]` in the config adds
//! models or replaces any default, and a model no pattern matches is counted
//! with no cost (its tokens still are), never guessed.
//!
//! Costs are kept in **nano-USD** (10⁻⁹ USD) as integers, so sums over a
//! month of entries are exact: a price with up to three decimals per million
//! tokens is a whole number of nano-USD per token × 1000.

use std::collections::BTreeMap;

use poolgate_wire::usage::Usage;
use serde::{Deserialize, Serialize};

/// USD per million tokens, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Plain input tokens.
    pub input: f64,
    /// Output tokens.
    pub output: f64,
    /// Input tokens read from the prompt cache.
    pub cache_read: f64,
    /// Input tokens written to the prompt cache.
    pub cache_write: f64,
}

const fn price(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Price {
    Price { input, output, cache_read, cache_write }
}

/// The defaults: Anthropic's list prices (USD / MTok; cache writes at the
/// 5-minute rate). `[prices]` replaces any of them.
pub const DEFAULTS: &[(&str, Price)] = &[
    ("claude-opus-4*", price(15.0, 75.0, 1.5, 18.75)),
    ("claude-opus-4-5*", price(5.0, 25.0, 0.5, 6.25)),
    ("claude-sonnet-4*", price(3.0, 15.0, 0.3, 3.75)),
    ("claude-3-7-sonnet*", price(3.0, 15.0, 0.3, 3.75)),
    ("claude-haiku-4-5*", price(1.0, 5.0, 0.1, 1.25)),
    ("claude-3-5-haiku*", price(0.8, 4.0, 0.08, 1.0)),
    ("claude-3-haiku*", price(0.25, 1.25, 0.03, 0.3)),
];

/// The prices in force: the defaults with the config's `[prices]` over them.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    by_pattern: BTreeMap<String, Price>,
}

impl Default for Prices {
    fn default() -> Self {
        Prices::with(&BTreeMap::new())
    }
}

impl Prices {
    /// The defaults, with `overrides` (pattern → price) added or replacing.
    pub fn with(overrides: &BTreeMap<String, Price>) -> Prices {
        let mut by_pattern: BTreeMap<String, Price> = DEFAULTS.iter().map(|(p, v)| (p.to_string(), *v)).collect();
        by_pattern.extend(overrides.iter().map(|(p, v)| (p.clone(), *v)));
        Prices { by_pattern }
    }

    /// The price of `model`: its exact name, else the longest matching
    /// `prefix*`; `None` when nothing matches.
    pub fn of(&self, model: &str) -> Option<&Price> {
        if let Some(p) = self.by_pattern.get(model) {
            return Some(p);
        }
        self.by_pattern
            .iter()
            .filter_map(|(pattern, p)| Some((pattern.strip_suffix('*')?, p)))
            .filter(|(prefix, _)| model.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, p)| p)
    }

    /// What `usage` of `model` cost, in nano-USD; `None` for a model with
    /// no price.
    pub fn cost_nano(&self, model: &str, usage: &Usage) -> Option<u64> {
        let p = self.of(model)?;
        let part = |tokens: u64, usd_per_mtok: f64| (tokens as f64 * usd_per_mtok * 1_000.0).round() as u64;
        Some(
            part(usage.input_tokens, p.input)
                + part(usage.output_tokens, p.output)
                + part(usage.cache_read_input_tokens, p.cache_read)
                + part(usage.cache_creation_input_tokens, p.cache_write),
        )
    }
}

/// Why a `[prices]` entry is refused, if it is: a pattern is a name or one
/// `prefix*`; a price is finite and not negative.
pub fn check(pattern: &str, p: &Price) -> Option<String> {
    let stars = pattern.matches('*').count();
    if pattern.is_empty() || stars > 1 || (stars == 1 && !pattern.ends_with('*')) {
        return Some(format!("`{pattern}` is not a model name or `prefix*`"));
    }
    for (kind, v) in
        [("input", p.input), ("output", p.output), ("cache_read", p.cache_read), ("cache_write", p.cache_write)]
    {
        if !v.is_finite() || v < 0.0 {
            return Some(format!("{kind} = {v} is not a price (USD per million tokens, 0 or more)"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_specific_pattern_prices_a_model() {
        let prices = Prices::default();
        assert_eq!(prices.of("claude-opus-4-5-20251101").unwrap().input, 5.0);
        assert_eq!(prices.of("claude-opus-4-1-20250805").unwrap().input, 15.0);
        assert_eq!(prices.of("claude-sonnet-4-5").unwrap().output, 15.0);
        assert!(prices.of("gpt-4o").is_none());
        let mine = BTreeMap::from([("claude-sonnet-4-5".to_string(), price(1.0, 2.0, 0.0, 0.0))]);
        assert_eq!(Prices::with(&mine).of("claude-sonnet-4-5").unwrap().input, 1.0, "an exact name wins");
        assert_eq!(Prices::with(&mine).of("claude-sonnet-4-5-2").unwrap().input, 3.0);
    }

    #[test]
    fn cache_reads_and_writes_are_priced_apart_and_sums_are_exact() {
        let usage = Usage {
            input_tokens: 1_000,
            output_tokens: 2_000,
            cache_read_input_tokens: 100_000,
            cache_creation_input_tokens: 10_000,
        };
        // 1000×3 + 2000×15 + 100000×0.3 + 10000×3.75 = 100,500 µUSD.
        assert_eq!(Prices::default().cost_nano("claude-sonnet-4-5", &usage), Some(100_500_000));
        assert_eq!(Prices::default().cost_nano("unknown", &usage), None);
        let haiku = Usage { cache_read_input_tokens: 1, ..Usage::default() };
        assert_eq!(Prices::default().cost_nano("claude-3-5-haiku-latest", &haiku), Some(80));
    }

    #[test]
    fn a_bad_entry_says_why() {
        let ok = price(1.0, 1.0, 1.0, 1.0);
        assert!(check("claude-x*", &ok).is_none());
        assert!(check("claude-*-x", &ok).unwrap().contains("prefix*"));
        assert!(check("m", &price(-1.0, 1.0, 1.0, 1.0)).unwrap().contains("input = -1"));
        assert!(check("m", &price(1.0, f64::NAN, 1.0, 1.0)).unwrap().contains("output"));
    }
}
