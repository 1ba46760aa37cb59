//! Validation: every problem in a config file at once, each located by key path
//! and line, saying what is allowed.
//!
//! Three passes, each only when the previous one found the file readable:
//! 1. TOML syntax (with recovery, so several syntax errors show together);
//! 2. shape — unknown keys (with a suggestion), wrong types, out-of-range values —
//!    against [`schema`];
//! 3. meaning — duplicate ids, credentials that cannot be read, malformed URLs and
//!    hashes, unknown built-ins, missing plugin files.
//!
//! Loading the chain (compiling each plugin and letting its `configure` judge its
//! options) is the last check; it runs in `Generation::build`, for `poolgate check`
//! and `serve` alike, and its errors name the stage.
//!
//! The shape pass is in `shape`, the meaning pass in `meaning`; the syntax
//! pass, the recovery that lets the meaning checks run past shape problems,
//! and locating a chain-loading error are here.

mod meaning;
mod shape;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;

use toml::de::DeTable;

use super::Config;
use super::schema;
pub use meaning::{MAX_STAGE_NAME_BYTES, check_stage_name, meaning};
use shape::{Lines, Walker};

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key path, e.g. `accounts[1].max_in_flight`.
    pub path: String,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong and what is allowed.
    pub message: String,
}

/// Every problem found.
#[derive(Debug, Clone, Default)]
pub struct Problems {
    /// The file, for messages.
    pub file: String,
    /// The problems, in file order.
    pub items: Vec<Problem>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.items.len();
        writeln!(f, "{} has {n} problem{}:", self.file, if n == 1 { "" } else { "s" })?;
        for p in &self.items {
            match p.line {
                Some(line) => writeln!(f, "  {}:{line}: {}: {}", self.file, p.path, p.message)?,
                None => writeln!(f, "  {}: {}: {}", self.file, p.path, p.message)?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

pub use super::LineIndex;

/// Parses and checks `text` (from `file`). On success returns the config and the
/// line of every key, for locating later problems.
pub fn parse(text: &str, file: &str) -> Result<(Config, LineIndex), Problems> {
    let lines = Lines::new(text);
    let (root, errors) = DeTable::parse_recoverable(text);
    let mut problems = Problems { file: file.to_string(), items: Vec::new() };
    for e in errors {
        let line = e.span().map(|s| lines.line(s.start));
        problems.items.push(Problem { path: "(syntax)".into(), line, message: e.message().trim().to_string() });
    }
    if !problems.items.is_empty() {
        return Err(problems);
    }
    let mut walker = Walker { lines: &lines, problems: Vec::new(), index: LineIndex::new() };
    walker.table("", root.get_ref(), schema::ROOT);
    if walker.problems.is_empty() {
        return match toml::from_str::<Config>(text) {
            Ok(config) => Ok((config, walker.index)),
            Err(e) => {
                let line = e.span().map(|s| lines.line(s.start));
                problems.items.push(Problem { path: "(config)".into(), line, message: e.message().trim().to_string() });
                Err(problems)
            }
        };
    }
    // Shape problems found: drop the offending keys (and entries missing a
    // required key) and still run the meaning checks on the rest, so one pass
    // reports everything.
    if let Ok(mut table) = text.parse::<toml::Table>() {
        for p in &walker.problems {
            prune(&mut table, &p.path);
        }
        if let Ok(config) = toml::Value::Table(table).try_into::<Config>() {
            let mut config = config;
            config.resolve_paths(Path::new(base_dir(file)));
            if let Err(more) = meaning(&config, &walker.index, file, None) {
                walker.problems.extend(more.items);
            }
        }
    }
    walker.problems.sort_by_key(|p| p.line);
    walker.problems.dedup();
    problems.items = walker.problems;
    Err(problems)
}

fn base_dir(file: &str) -> &str {
    Path::new(file).parent().and_then(|p| p.to_str()).filter(|p| !p.is_empty()).unwrap_or(".")
}

/// Removes the key at `path` (`a.b[2].c`; a bare `a.b[2]` removes that entry).
fn prune(table: &mut toml::Table, path: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut cur = table;
    for part in parts {
        let (key, idx) = split_index(part);
        let next = match (cur.get_mut(key), idx) {
            (Some(toml::Value::Table(t)), None) => t,
            (Some(toml::Value::Array(a)), Some(i)) => match a.get_mut(i) {
                Some(toml::Value::Table(t)) => t,
                _ => return,
            },
            _ => return,
        };
        cur = next;
    }
    match split_index(last) {
        (key, None) => {
            cur.remove(key);
        }
        (key, Some(i)) => {
            if let Some(toml::Value::Array(a)) = cur.get_mut(key)
                && i < a.len()
            {
                // Keep indices stable for the other problems: blank, don't shift.
                a[i] = toml::Value::Table(toml::Table::new());
            }
        }
    }
}

fn split_index(part: &str) -> (&str, Option<usize>) {
    match part.split_once('[') {
        Some((k, rest)) => (k, rest.trim_end_matches(']').parse().ok()),
        None => (part, None),
    }
}

/// Prefixes a chain-loading error with the line of the stage it names.
pub fn locate(message: &str, index: &LineIndex, file: &str) -> String {
    let stage = message
        .split_once("policy.chain[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(n, _)| n.parse::<usize>().ok());
    match stage.and_then(|n| index.get(&format!("policy.chain[{n}]"))) {
        Some(line) => format!("{file}:{line}: {message}"),
        None => format!("{file}: {message}"),
    }
}
