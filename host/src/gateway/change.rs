//! What a reload changed, in one line for the log: an operator who edits the
//! config or replaces a `.wasm` wants to see that it took, and what it took.

use super::generation::Generation;
use crate::policy::StageStatus;

/// A one-line summary of how `now` differs from `was`, e.g.
/// ``stage `ranker`: ranker.wasm 3f2a9c1b → 77d0e4a2; accounts added: c; [cooldowns] changed``.
pub fn describe(was: &Generation, now: &Generation) -> String {
    let mut parts = Vec::new();
    stages(&was.chain.status(0), &now.chain.status(0), &mut parts);
    let ids = |g: &Generation| -> Vec<String> { g.config.accounts.iter().map(|a| a.id.clone()).collect() };
    let (before, after) = (ids(was), ids(now));
    let added: Vec<&str> = after.iter().filter(|a| !before.contains(a)).map(String::as_str).collect();
    let removed: Vec<&str> = before.iter().filter(|a| !after.contains(a)).map(String::as_str).collect();
    if !added.is_empty() {
        parts.push(format!("accounts added: {}", added.join(", ")));
    }
    if !removed.is_empty() {
        parts.push(format!("accounts removed: {}", removed.join(", ")));
    }
    let changed: Vec<&str> = was
        .config
        .accounts
        .iter()
        .filter_map(|a| {
            let b = now.config.accounts.iter().find(|b| b.id == a.id)?;
            (toml::to_string(a).ok() != toml::to_string(b).ok()).then_some(a.id.as_str())
        })
        .collect();
    if !changed.is_empty() {
        parts.push(format!("accounts changed: {}", changed.join(", ")));
    }
    let (w, n) = (&was.config, &now.config);
    let sections = [
        ("[server]", toml::to_string(&w.server).ok() != toml::to_string(&n.server).ok()),
        ("[gateway]", toml::to_string(&w.gateway).ok() != toml::to_string(&n.gateway).ok()),
        ("[cooldowns]", toml::to_string(&w.cooldowns).ok() != toml::to_string(&n.cooldowns).ok()),
        ("[policy]", {
            let strip = |c: &crate::config::Config| {
                let mut p = c.policy.clone();
                p.chain.clear();
                toml::to_string(&p).ok()
            };
            strip(w) != strip(n)
        }),
    ];
    for (name, differs) in sections {
        if differs {
            parts.push(format!("{name} changed"));
        }
    }
    if parts.is_empty() { "nothing changed".to_string() } else { parts.join("; ") }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(8)]
}

fn stages(was: &[StageStatus], now: &[StageStatus], parts: &mut Vec<String>) {
    for s in now {
        match was.iter().find(|w| w.name == s.name) {
            None => parts.push(format!("stage `{}` added ({} {})", s.name, s.plugin, short(&s.sha256))),
            Some(w) if w.sha256 != s.sha256 || w.plugin != s.plugin => parts.push(format!(
                "stage `{}`: {} {} → {} {}",
                s.name,
                w.plugin,
                short(&w.sha256),
                s.plugin,
                short(&s.sha256)
            )),
            Some(_) => {}
        }
    }
    for w in was.iter().filter(|w| !now.iter().any(|s| s.name == w.name)) {
        parts.push(format!("stage `{}` removed", w.name));
    }
    let order = |v: &[StageStatus]| v.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    let (a, b) = (order(was), order(now));
    let kept_a: Vec<&String> = a.iter().filter(|x| b.contains(x)).collect();
    let kept_b: Vec<&String> = b.iter().filter(|x| a.contains(x)).collect();
    if kept_a != kept_b {
        parts.push(format!("stage order now {}", b.join(" → ")));
    }
}
