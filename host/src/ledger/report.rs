//! The questions a usage report asks — a time range, optionally one key,
//! grouped by any of key, team, model, account and day — and its rows, as
//! JSON or CSV. Plain data: a store answers a [`Query`] in its own SQL, or
//! reads its entries and sums them here ([`summarize`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::segment::Filed;

/// What a report's rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dim {
    /// The client key's name.
    Key,
    /// The key's team tag.
    Team,
    /// The model asked for.
    Model,
    /// The account (or fallback) that served.
    Account,
    /// The UTC day the request arrived (`YYYY-MM-DD`).
    Day,
}

impl Dim {
    /// Its name in a query string and in a row.
    pub fn name(self) -> &'static str {
        match self {
            Dim::Key => "key",
            Dim::Team => "team",
            Dim::Model => "model",
            Dim::Account => "account",
            Dim::Day => "day",
        }
    }

    /// The dimension called `name`.
    pub fn parse(name: &str) -> Option<Dim> {
        [Dim::Key, Dim::Team, Dim::Model, Dim::Account, Dim::Day].into_iter().find(|d| d.name() == name)
    }
}

/// A report's question.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// From this time on (ms since the epoch, included).
    pub from_ms: u64,
    /// Up to this time (excluded).
    pub to_ms: u64,
    /// Only this key's entries.
    pub key: Option<String>,
    /// Grouped by these, in this order (none: one row for everything).
    pub by: Vec<Dim>,
}

/// One group's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The group: a value per dimension asked for.
    #[serde(flatten)]
    pub group: BTreeMap<&'static str, String>,
    /// Requests answered.
    pub requests: u64,
    /// Plain input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// What they cost, nano-USD (models with a price only).
    pub cost_nano_usd: u64,
    /// Requests whose model has no price (their tokens are counted, their
    /// cost is not).
    pub unpriced: u64,
    /// Requests whose answer reported no usage (a stream cut before its
    /// end, an error): counted as requests, with no tokens.
    pub usage_unknown: u64,
}

impl Row {
    /// Every kind of token together.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }
}

/// The rows `query` asks for, from `entries` (any order; those outside the
/// range or of another key are left out): one per group, in the groups'
/// order, none for a group with no entry.
pub fn summarize(entries: impl IntoIterator<Item = Filed>, query: &Query) -> Vec<Row> {
    let mut groups: BTreeMap<Vec<String>, Row> = BTreeMap::new();
    let wanted =
        |e: &Filed| (query.from_ms..query.to_ms).contains(&e.at_ms) && query.key.as_ref().is_none_or(|k| *k == e.key);
    for e in entries.into_iter().filter(wanted) {
        let group: Vec<String> = (query.by.iter())
            .map(|d| match d {
                Dim::Key => e.key.clone(),
                Dim::Team => e.team.clone(),
                Dim::Model => e.model.clone(),
                Dim::Account => e.account.clone(),
                Dim::Day => super::calendar::rfc3339(e.at_ms)[..10].to_string(),
            })
            .collect();
        let row = groups.entry(group).or_default();
        let u = &e.usage;
        row.requests += 1;
        row.input_tokens += u.input_tokens;
        row.output_tokens += u.output_tokens;
        row.cache_read_input_tokens += u.cache_read_input_tokens;
        row.cache_creation_input_tokens += u.cache_creation_input_tokens;
        row.cost_nano_usd += e.cost_nano.unwrap_or(0);
        row.unpriced += u64::from(e.cost_nano.is_none() && e.usage_known);
        row.usage_unknown += u64::from(!e.usage_known);
    }
    groups
        .into_iter()
        .map(|(values, mut row)| {
            row.group = query.by.iter().map(|d| d.name()).zip(values).collect();
            row
        })
        .collect()
}

/// USD, from nano-USD, for people (JSON carries the exact integer too).
pub fn usd(nano: u64) -> f64 {
    nano as f64 / 1e9
}

/// Rows as JSON: each row's fields, plus `cost_usd`.
pub fn json(rows: &[Row]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["cost_usd"] = serde_json::json!(usd(r.cost_nano_usd));
            v
        })
        .collect();
    serde_json::Value::Array(rows)
}

/// Rows as CSV (RFC 4180): the dimensions asked for, then the totals.
pub fn csv(by: &[Dim], rows: &[Row]) -> String {
    let mut out = String::new();
    for d in by {
        out.push_str(d.name());
        out.push(',');
    }
    out.push_str("requests,input_tokens,output_tokens,cache_read_input_tokens,cache_creation_input_tokens,cost_usd,unpriced,usage_unknown\r\n");
    for r in rows {
        for d in by {
            out.push_str(&field(r.group.get(d.name()).map_or("", String::as_str)));
            out.push(',');
        }
        let _ = write!(
            out,
            "{},{},{},{},{},{:.9},{},{}\r\n",
            r.requests,
            r.input_tokens,
            r.output_tokens,
            r.cache_read_input_tokens,
            r.cache_creation_input_tokens,
            usd(r.cost_nano_usd),
            r.unpriced,
            r.usage_unknown
        );
    }
    out
}

/// One CSV field: quoted when it holds a comma, a quote or a line break; a
/// leading `=`, `+`, `-`, `@`, tab or carriage return is prefixed with `'`
/// so a spreadsheet never runs a key's name as a formula.
fn field(s: &str) -> String {
    let s = match s.starts_with(['=', '+', '-', '@', '\t', '\r']) && s != "-" {
        true => format!("'{s}"),
        false => s.to_string(),
    };
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_needs_it_and_never_starts_a_formula() {
        let row = Row {
            group: BTreeMap::from([("key", "a,\"b\"".to_string()), ("model", "\t=cmd()".to_string())]),
            requests: 2,
            output_tokens: 5,
            cost_nano_usd: 1_500_000_000,
            ..Row::default()
        };
        let text = csv(&[Dim::Key, Dim::Model], &[row]);
        let lines: Vec<&str> = text.split("\r\n").collect();
        assert!(lines[0].starts_with("key,model,requests,"));
        assert_eq!(lines[1], "\"a,\"\"b\"\"\",'\t=cmd(),2,0,5,0,0,1.500000000,0,0");
    }

    #[test]
    fn dimensions_parse_by_name() {
        assert_eq!(Dim::parse("team"), Some(Dim::Team));
        assert_eq!(Dim::parse("nope"), None);
    }
}
