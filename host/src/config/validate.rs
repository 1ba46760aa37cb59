//! Validation: every problem in a config file at once, each located by key path
//! and line, saying what is allowed.
//!
//! Three passes, each only when the previous one found the file readable:
//! 1. TOML syntax (with recovery, so several syntax errors show together);
//! 2. shape — unknown keys (with a suggestion), wrong types, out-of-range values —
//!    against [`schema`](super::schema);
//! 3. meaning — duplicate ids, credentials that cannot be read, malformed URLs and
//!    hashes, unknown built-ins, missing plugin files.
//!
//! Loading the chain (compiling each plugin and letting its `configure` judge its
//! options) is the last check; it runs in `Generation::build`, for `poolgate check`
//! and `serve` alike, and its errors name the stage.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::Config;
use super::schema::{self, Field, Kind};

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

/// Byte offset → line, for one file.
struct Lines(Vec<usize>);

impl Lines {
    fn new(text: &str) -> Self {
        Lines(text.match_indices('\n').map(|(i, _)| i).collect())
    }
    fn line(&self, offset: usize) -> usize {
        self.0.partition_point(|&nl| nl < offset) + 1
    }
}

pub use super::LineIndex;

struct Walker<'a> {
    lines: &'a Lines,
    problems: Vec<Problem>,
    index: LineIndex,
}

impl Walker<'_> {
    fn push(&mut self, path: &str, span: Range<usize>, message: String) {
        let line = self.lines.line(span.start);
        self.problems.push(Problem { path: path.to_string(), line: Some(line), message });
    }

    fn table(&mut self, path: &str, table: &DeTable<'_>, fields: &'static [Field]) {
        for (key, value) in table.iter() {
            let name = key.get_ref().as_ref();
            let here = if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
            self.index.insert(here.clone(), self.lines.line(key.span().start));
            match fields.iter().find(|f| f.name == name) {
                Some(field) => self.value(&here, value, field.kind),
                None => {
                    let hint = suggest(name, fields).map_or(String::new(), |s| format!(" (did you mean `{s}`?)"));
                    let allowed: Vec<&str> = fields.iter().map(|f| f.name).collect();
                    self.push(&here, key.span(), format!("unknown key{hint}; allowed here: {}", allowed.join(", ")));
                }
            }
        }
    }

    fn value(&mut self, path: &str, value: &Spanned<DeValue<'_>>, kind: Kind) {
        let span = value.span();
        let v = value.get_ref();
        match kind {
            Kind::Str => {
                if !v.is_str() {
                    self.push(path, span, format!("expected a string, found {}", v.type_str()));
                }
            }
            Kind::Bool => {
                if !v.is_bool() {
                    self.push(path, span, format!("expected true or false, found {}", v.type_str()));
                }
            }
            Kind::OneOf(options) => match v.as_str() {
                Some(s) if options.contains(&s) => {}
                Some(s) => self.push(path, span, format!("`{s}` is not allowed; use one of: {}", options.join(", "))),
                None => {
                    self.push(path, span, format!("expected one of {}, found {}", options.join(", "), v.type_str()))
                }
            },
            Kind::Int(min, max) => match v
                .as_integer()
                .and_then(|i| i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok())
            {
                Some(n) if (min..=max).contains(&n) => {}
                Some(n) => self.push(path, span, format!("{n} is out of range; allowed: {min} to {max}")),
                None => {
                    self.push(path, span, format!("expected an integer from {min} to {max}, found {}", v.type_str()))
                }
            },
            Kind::Float(min, max) => {
                let n = v
                    .as_float()
                    .and_then(|x| x.as_str().replace('_', "").parse::<f64>().ok())
                    .or_else(|| v.as_integer().and_then(|i| i.as_str().replace('_', "").parse::<f64>().ok()));
                match n {
                    Some(n) if (min..=max).contains(&n) => {}
                    Some(n) => self.push(path, span, format!("{n} is out of range; allowed: {min} to {max}")),
                    None => {
                        self.push(path, span, format!("expected a number from {min} to {max}, found {}", v.type_str()))
                    }
                }
            }
            Kind::Strs => match v.as_array() {
                Some(items) => {
                    for item in items.iter().filter(|i| !i.get_ref().is_str()) {
                        self.push(path, item.span(), format!("expected strings, found {}", item.get_ref().type_str()));
                    }
                }
                None => self.push(path, span, format!("expected an array of strings, found {}", v.type_str())),
            },
            Kind::AnyTable => {
                if !v.is_table() {
                    self.push(path, span, format!("expected a table, found {}", v.type_str()));
                }
            }
            Kind::Table(fields) => match v.as_table() {
                Some(t) => self.table(path, t, fields),
                None => self.push(path, span, format!("expected a table ([{path}]), found {}", v.type_str())),
            },
            Kind::Tables(fields, required) => match v.as_array() {
                Some(items) => {
                    for (i, item) in items.iter().enumerate() {
                        let here = format!("{path}[{i}]");
                        self.index.insert(here.clone(), self.lines.line(item.span().start));
                        match item.get_ref().as_table() {
                            Some(t) => {
                                for key in required {
                                    if t.get(*key).is_none() {
                                        self.push(&here, item.span(), format!("missing `{key}`"));
                                    }
                                }
                                self.table(&here, t, fields);
                            }
                            None => self.push(
                                &here,
                                item.span(),
                                format!("expected a table ([[{path}]]), found {}", item.get_ref().type_str()),
                            ),
                        }
                    }
                }
                None => {
                    self.push(path, span, format!("expected an array of tables ([[{path}]]), found {}", v.type_str()))
                }
            },
        }
    }
}

/// The closest allowed key within two edits.
fn suggest(name: &str, fields: &[Field]) -> Option<&'static str> {
    fields
        .iter()
        .map(|f| (distance(name, f.name), f.name))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

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

/// The meaning checks of a parsed config: everything that can be judged without
/// loading plugins. `base` resolves relative paths; `index` locates keys.
///
/// `overrides` (what `--listen`, `POOLGATE_LISTEN` and kin replaced in the
/// file, already applied to `config`) turns on the checks of what `serve`
/// would run — the address it would listen on and who could reach it — and
/// names the flag in their messages; `None` judges the file alone.
pub fn meaning(
    config: &Config,
    index: &LineIndex,
    file: &str,
    overrides: Option<&super::Overrides>,
) -> Result<super::Resolved, Problems> {
    let mut items = Vec::new();
    let mut add = |path: String, message: String| {
        let line = index.get(&path).copied().or_else(|| {
            let parent = path.rsplit_once('.').map(|(p, _)| p.to_string());
            parent.and_then(|p| index.get(&p).copied())
        });
        items.push(Problem { path, line, message });
    };
    super::serving::check(config, index, overrides, &mut add);
    for h in &config.gateway.forward_headers {
        if let Err(why) = super::headers::check_addition(h) {
            add("gateway.forward_headers".into(), why);
        }
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, a) in config.accounts.iter().enumerate() {
        let here = format!("accounts[{i}]");
        if a.id.trim().is_empty() {
            add(format!("{here}.id"), "must not be empty".into());
        } else if let Some(first) = seen.insert(a.id.as_str(), i) {
            add(format!("{here}.id"), format!("duplicate account id `{}` (also accounts[{first}])", a.id));
        }
    }
    // Credentials, client keys, the admin token and base URLs: resolved once,
    // here, and kept for the gateway.
    let resolved = match config.resolve() {
        Ok(r) => Some(r),
        Err(problems) => {
            for (path, message) in problems {
                add(path, message);
            }
            None
        }
    };
    stage_names(&config.policy.chain, &mut add);
    let builtins = crate::policy::builtin_names();
    for (i, st) in config.policy.chain.iter().enumerate() {
        let here = format!("policy.chain[{i}].plugin");
        if st.plugin.starts_with("builtin:") {
            if !builtins.contains(&st.plugin) {
                add(here, format!("unknown built-in `{}`; built-ins are: {}", st.plugin, builtins.join(", ")));
            }
        } else {
            let p = Path::new(&st.plugin);
            if !p.is_file() {
                add(here, format!("no plugin file at {}", p.display()));
            } else if p.extension().is_none_or(|e| e != "wasm") {
                add(here, format!("{} is not a .wasm file", p.display()));
            }
        }
    }
    super::state::check(&config.state, &config.oauth, &mut add);
    let st = &config.policy.state;
    if st.max_total_mb < st.max_scope_mb {
        add(
            "policy.state.max_total_mb".into(),
            format!(
                "{} is below max_scope_mb ({}): one scope could never fill its share",
                st.max_total_mb, st.max_scope_mb
            ),
        );
    }
    super::server::check(&config.server, &mut add);
    let b = &config.policy.breaker;
    if b.max_cooldown_ms < b.cooldown_ms {
        add(
            "policy.breaker.max_cooldown_ms".into(),
            format!("{} is below cooldown_ms ({})", b.max_cooldown_ms, b.cooldown_ms),
        );
    }
    match resolved {
        Some(resolved) if items.is_empty() => Ok(resolved),
        _ => {
            items.sort_by_key(|p| p.line);
            Err(Problems { file: file.to_string(), items })
        }
    }
}

/// Problems with the stages' names: each must be a valid name
/// ([`check_stage_name`]) and distinct, since a stage's name travels in a
/// response header (`x-poolgate-policy-error: <stage>:<cause>`), log fields and
/// metric labels, and tells stages apart in decisions and `/status`.
fn stage_names(chain: &[super::StageConfig], add: &mut impl FnMut(String, String)) {
    let mut names: HashMap<String, usize> = HashMap::new();
    for (i, st) in chain.iter().enumerate() {
        let (name, key) = match &st.name {
            Some(n) => (n.as_str(), format!("policy.chain[{i}].name")),
            None => (st.plugin.as_str(), format!("policy.chain[{i}].plugin")),
        };
        let named = if st.name.is_some() { "" } else { " (a stage without `name` is named by its plugin; set `name`)" };
        if let Err(why) = check_stage_name(name) {
            add(key, format!("{why}{named}"));
        } else if let Some(first) = names.insert(name.to_string(), i) {
            add(
                key,
                format!(
                    "duplicate stage name `{name}` (also policy.chain[{first}]): stages are told apart by name in \
                     decisions, /status and metrics{}",
                    if st.name.is_some() { "" } else { "; give each a `name`" }
                ),
            );
        }
    }
}

/// Longest stage name accepted.
pub const MAX_STAGE_NAME_BYTES: usize = 256;

/// Whether `name` can name a stage: non-empty, printable ASCII (it travels in a
/// response header, where anything else is dropped, and in log lines, where a
/// line break would forge one), no space at either end, and at most
/// [`MAX_STAGE_NAME_BYTES`] long.
pub fn check_stage_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("a stage name must not be empty".into());
    }
    if let Some(c) = name.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "a stage name is printable ASCII (it travels in the x-poolgate-policy-error header and in log lines); \
             this one holds {}",
            c.escape_default()
        ));
    }
    if name.trim() != name {
        return Err(format!("a stage name must not start or end with a space: `{name}`"));
    }
    if name.len() > MAX_STAGE_NAME_BYTES {
        return Err(format!("a stage name is at most {MAX_STAGE_NAME_BYTES} bytes; this one is {}", name.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        match parse(text, "t.toml") {
            Ok((c, idx)) => meaning(&c, &idx, "t.toml", Some(&crate::config::Overrides::default()))
                .err()
                .map_or_else(Vec::new, |p| {
                    p.items.iter().map(|i| format!("{}@{:?}: {}", i.path, i.line, i.message)).collect()
                }),
            Err(p) => p.items.iter().map(|i| format!("{}@{:?}: {}", i.path, i.line, i.message)).collect(),
        }
    }

    #[test]
    fn a_shared_state_backend_needs_a_redis_url_and_a_plain_prefix() {
        let p = problems("[state]\nbackend = \"redis\"\n");
        assert!(p.iter().any(|l| l.starts_with("state.url@Some(1)") && l.contains("needs the server")), "{p:?}");
        let p = problems("[state]\nbackend = \"redis\"\nurl = \"http://:pw-secret@h:1\"\nkey_prefix = \"a*\"\n");
        assert!(p.iter().any(|l| l.starts_with("state.url") && l.contains("not a Redis URL")), "{p:?}");
        assert!(p.iter().any(|l| l.starts_with("state.key_prefix@Some(4)")), "{p:?}");
        assert!(!p.iter().any(|l| l.contains("pw-secret")), "the password is never repeated: {p:?}");
        let p = problems("[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n");
        assert!(p.is_empty(), "{p:?}");
        let p = problems("[state]\nbackend = \"memcached\"\n");
        assert!(p.iter().any(|l| l.starts_with("state.backend") && l.contains("memory, redis")), "{p:?}");
    }

    #[test]
    fn reports_every_shape_problem_at_once_with_path_and_line() {
        let text = r#"
[server]
listn = "127.0.0.1:1"
max_body_mb = 0

[policy]
timeout_ms = "fast"

[[accounts]]
id = "a"
max_in_flight = -1
kind = "token"
"#;
        let p = problems(text);
        // The five shape problems, and — found in the same pass — the account
        // with no credential.
        assert_eq!(p.len(), 6, "{p:#?}");
        let has = |needle: &str| assert!(p.iter().any(|s| s.starts_with(needle)), "no `{needle}` in {p:#?}");
        has("server.listn@Some(3): unknown key (did you mean `listen`?)");
        has("server.max_body_mb@Some(4): 0 is out of range; allowed: 1 to 1024");
        has("policy.timeout_ms@Some(7): expected an integer");
        has("accounts[0].max_in_flight@Some(11): -1 is out of range");
        has("accounts[0].kind@Some(12): `token` is not allowed; use one of: api-key, oauth");
        has("accounts[0].api_key_env@Some(9): no credential: set api_key_env or token_file");
    }

    #[test]
    fn reports_meaning_problems_together() {
        let text = r#"
[[accounts]]
id = "a"
api_key_env = "POOLGATE_TEST_SURELY_UNSET_VAR"

[[accounts]]
id = "a"
token_file = "/nonexistent/token"
base_url = "not a url"

[[policy.chain]]
plugin = "builtin:nope"

[[policy.chain]]
plugin = "/nonexistent/x.wasm"
"#;
        let p = problems(text);
        assert_eq!(p.len(), 6, "{p:#?}");
        let all = p.join("\n");
        assert!(
            all.contains(
                "accounts[0].api_key_env@Some(4): environment variable POOLGATE_TEST_SURELY_UNSET_VAR is not set"
            ),
            "{all}"
        );
        assert!(all.contains("accounts[1].id@Some(7): duplicate account id `a` (also accounts[0])"), "{all}");
        assert!(all.contains("accounts[1].token_file@Some(8): cannot read /nonexistent/token"), "{all}");
        assert!(all.contains("accounts[1].base_url@Some(9)"), "{all}");
        assert!(all.contains("policy.chain[0].plugin@Some(12): unknown built-in `builtin:nope`"), "{all}");
        assert!(all.contains("policy.chain[1].plugin@Some(15): no plugin file at /nonexistent/x.wasm"), "{all}");
    }

    #[test]
    fn the_drain_window_fits_inside_the_grace_period() {
        let p = problems("[server]\ndrain_ms = 30000\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("server.drain_ms@Some(2): 30000 is not below shutdown_grace_ms (30000)"), "{p:?}");
        assert!(problems("[server]\ndrain_ms = 0\nshutdown_grace_ms = 0\n").is_empty(), "no drain, no grace");
        assert!(problems("[server]\ndrain_ms = 1000\nshutdown_grace_ms = 1001\n").is_empty());
        assert_eq!(problems("[server]\ndrain_ms = 1\nshutdown_grace_ms = 0\n").len(), 1);
    }

    #[test]
    fn stage_names_are_checked_and_named_by_their_key() {
        let text = "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"evil\\n2026-01-01 ERROR forged\"\n\n\
                    [[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"\"\n\n\
                    [[policy.chain]]\nplugin = \"builtin:spill\"\nname = \"same\"\n\n\
                    [[policy.chain]]\nplugin = \"builtin:affinity\"\nname = \"same\"\n\n\
                    [[policy.chain]]\nplugin = \"builtin:fill-first\"\n\n\
                    [[policy.chain]]\nplugin = \"builtin:fill-first\"\n\n\
                    [[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"ステージ\\u202e\"\n";
        let p = problems(text);
        let all = p.join("\n");
        assert_eq!(p.len(), 5, "{all}");
        assert!(all.contains("policy.chain[0].name@Some(3): a stage name is printable ASCII"), "{all}");
        assert!(all.contains("this one holds \\n"), "{all}");
        assert!(all.contains("policy.chain[1].name@Some(7): a stage name must not be empty"), "{all}");
        assert!(
            all.contains("policy.chain[3].name@Some(15): duplicate stage name `same` (also policy.chain[2])"),
            "{all}"
        );
        assert!(
            all.contains(
                "policy.chain[5].plugin@Some(21): duplicate stage name `builtin:fill-first` (also policy.chain[4])"
            ) && all.contains("give each a `name`"),
            "{all}"
        );
        assert!(all.contains("policy.chain[6].name@Some(25): a stage name is printable ASCII"), "{all}");
        assert!(check_stage_name("hostile").is_ok() && check_stage_name("builtin:headroom").is_ok());
        assert!(check_stage_name(" padded").is_err() && check_stage_name(&"n".repeat(257)).is_err());
    }

    #[test]
    fn breaker_failures_are_within_what_the_breaker_counts() {
        let p = problems("[policy.breaker]\nfailures = 10001\n");
        assert!(
            p.iter()
                .any(|s| s.starts_with("policy.breaker.failures@Some(2): 10001 is out of range; allowed: 0 to 10000")),
            "{p:?}"
        );
        assert!(problems("[policy.breaker]\nfailures = 40\n").is_empty());
    }

    #[test]
    fn syntax_errors_carry_their_line() {
        let p = problems("[server]\nlisten = \n");
        assert!(p[0].starts_with("(syntax)@Some(2)"), "{p:?}");
    }

    #[test]
    fn a_missing_required_key_is_named() {
        let p = problems("[[accounts]]\nalias = \"x\"\n");
        assert!(p.iter().any(|s| s.starts_with("accounts[0]@Some(") && s.contains("missing `id`")), "{p:?}");
    }

    #[test]
    fn the_commented_example_has_a_valid_shape() {
        let text = include_str!("../../../examples/poolgate.toml");
        if let Err(p) = parse(text, "examples/poolgate.toml") {
            panic!("{p}");
        }
    }

    #[test]
    fn suggestions_are_close_matches_only() {
        assert_eq!(suggest("listn", schema::SERVER), Some("listen"));
        assert_eq!(suggest("zzzzzz", schema::SERVER), None);
    }
}
