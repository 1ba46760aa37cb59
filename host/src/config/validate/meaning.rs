//! The meaning pass: what a well-shaped config can still get wrong — duplicate
//! ids and stage names, credentials that cannot be read, unknown built-ins,
//! missing plugin files, limits that contradict each other.

use std::collections::HashMap;
use std::path::Path;

use super::{LineIndex, Problem, Problems};
use crate::config::{AccountConfig, Config, StageConfig};

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
    overrides: Option<&crate::config::Overrides>,
) -> Result<crate::config::Resolved, Problems> {
    let mut items = Vec::new();
    let mut add = |path: String, message: String| {
        let line = index.get(&path).copied().or_else(|| {
            let parent = path.rsplit_once('.').map(|(p, _)| p.to_string());
            parent.and_then(|p| index.get(&p).copied())
        });
        items.push(Problem { path, line, message });
    };
    crate::config::serving::check(config, index, overrides, &mut add);
    for h in &config.gateway.forward_headers {
        if let Err(why) = crate::config::headers::check_addition(h) {
            add("gateway.forward_headers".into(), why);
        }
    }
    account_ids(&config.accounts, &mut add);
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
    plugin_files(&config.policy.chain, &mut add);
    crate::config::state::check(&config.state, &config.oauth, &mut add);
    crate::config::ledger::check(config, &mut add);
    crate::config::telemetry::check(&config.telemetry, &mut add);
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
    crate::config::server::check(&config.server, &mut add);
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

/// Account ids: present and distinct, since decisions, `/status` and the
/// seats' files name accounts by id.
fn account_ids(accounts: &[AccountConfig], add: &mut impl FnMut(String, String)) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, a) in accounts.iter().enumerate() {
        let here = format!("accounts[{i}]");
        if a.id.trim().is_empty() {
            add(format!("{here}.id"), "must not be empty".into());
        } else if let Some(first) = seen.insert(a.id.as_str(), i) {
            add(format!("{here}.id"), format!("duplicate account id `{}` (also accounts[{first}])", a.id));
        }
    }
}

/// Each stage's plugin: a built-in that exists, or a `.wasm` file that does.
fn plugin_files(chain: &[StageConfig], add: &mut impl FnMut(String, String)) {
    let builtins = crate::policy::builtin_names();
    for (i, st) in chain.iter().enumerate() {
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
}

/// Problems with the stages' names: each must be a valid name
/// ([`check_stage_name`]) and distinct, since a stage's name travels in a
/// response header (`x-poolgate-policy-error: <stage>:<cause>`), log fields and
/// metric labels, and tells stages apart in decisions and `/status`.
fn stage_names(chain: &[StageConfig], add: &mut impl FnMut(String, String)) {
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
