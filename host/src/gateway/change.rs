//! What a reload changed, in one line for the log: an operator who edits the
//! config or replaces a `.wasm` wants to see that it took, and what it took —
//! in words they read ("client keys 2 → 1", "stage `headroom`: options
//! changed (spread)"), never "nothing changed" when something did.
//!
//! Values are shown only where they are plain settings: anything that could
//! hold a credential or a URL with a password is named, not printed, and a
//! plugin's own options are named by key (the plugin may keep anything there).

use serde_json::Value;

use super::generation::Generation;
use crate::config::Config;
use crate::policy::{StageSpec, StageStatus};

/// A one-line summary of how `now` differs from `was`, e.g.
/// ``stage `ranker`: ranker.wasm 3f2a9c1b → 77d0e4a2; client keys 2 → 1 (removed ci); [gateway] queue_max 256 → 512``.
pub fn describe(was: &Generation, now: &Generation) -> String {
    let mut parts = Vec::new();
    stages(&was.chain.status(0), &now.chain.status(0), &mut parts);
    stage_settings(&was.config, &now.config, &mut parts);
    accounts(&was.config, &now.config, &mut parts);
    server(&was.config, &now.config, &mut parts);
    let (w, n) = (&was.config, &now.config);
    let sections: [(&str, Value, Value); 7] = [
        ("[gateway]", json(&w.gateway), json(&n.gateway)),
        ("[cooldowns]", json(&w.cooldowns), json(&n.cooldowns)),
        ("[policy]", policy_without_chain(w), policy_without_chain(n)),
        ("[oauth]", json(&w.oauth), json(&n.oauth)),
        ("[models]", json(&w.models), json(&n.models)),
        ("[state]", json(&w.state), json(&n.state)),
        ("[[fallback]]", json(&w.fallback), json(&n.fallback)),
    ];
    for (section, before, after) in sections {
        diff(section, "", &before, &after, &mut parts);
    }
    if parts.is_empty() { "nothing changed".to_string() } else { parts.join("; ") }
}

fn json(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn policy_without_chain(c: &Config) -> Value {
    let mut p = json(&c.policy);
    if let Some(o) = p.as_object_mut() {
        o.remove("chain");
    }
    p
}

/// Keys whose values are never printed: credentials and what could carry one.
fn secret_key(key: &str) -> bool {
    ["url", "token", "secret", "password", "sha256", "key"].iter().any(|s| key.contains(s))
}

/// A value as a short phrase, or `None` when it should only be named.
fn shown(v: &Value) -> Option<String> {
    let text = match v {
        Value::Null => "unset".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("`{}`", s.escape_debug()),
        Value::Array(_) | Value::Object(_) => return None,
    };
    (text.len() <= 60).then_some(text)
}

/// Appends what differs between `was` and `now` under `section`, key by key:
/// `[gateway] queue_max 256 → 512`, `[policy] breaker.failures 5 → 3`,
/// `[state] url changed`, `[[fallback]] 1 → 2 entries`.
fn diff(section: &str, path: &str, was: &Value, now: &Value, out: &mut Vec<String>) {
    if was == now {
        return;
    }
    let here = |p: &str| if p.is_empty() { section.to_string() } else { format!("{section} {p}") };
    match (was, now) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                diff(section, &sub, a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() != b.len() => {
            out.push(format!("{} {} → {} entries", here(path), a.len(), b.len()));
        }
        _ => {
            let last = path.rsplit('.').next().unwrap_or(path);
            match (shown(was), shown(now)) {
                (Some(a), Some(b)) if !secret_key(last) => out.push(format!("{} {a} → {b}", here(path))),
                _ => out.push(format!("{} changed", here(path))),
            }
        }
    }
}

/// `[server]`: the client keys by count and name (never a key or its hash),
/// the admin token as set / changed / removed, the rest key by key.
fn server(was: &Config, now: &Config, out: &mut Vec<String>) {
    let (w, n) = (&was.server, &now.server);
    let names = |c: &Config| c.server.client_keys.iter().map(|k| k.name.clone()).collect::<Vec<_>>();
    let (before, after) = (names(was), names(now));
    if w.client_keys != n.client_keys {
        let added: Vec<&str> = after.iter().filter(|k| !before.contains(k)).map(String::as_str).collect();
        let removed: Vec<&str> = before.iter().filter(|k| !after.contains(k)).map(String::as_str).collect();
        let mut line = format!("client keys {} → {}", before.len(), after.len());
        let mut what = Vec::new();
        if !added.is_empty() {
            what.push(format!("added {}", added.join(", ")));
        }
        if !removed.is_empty() {
            what.push(format!("removed {}", removed.join(", ")));
        }
        if what.is_empty() {
            what.push("a key replaced".to_string());
        }
        line.push_str(&format!(" ({})", what.join("; ")));
        out.push(line);
    }
    let admin = |s: &crate::config::ServerConfig| (s.admin_token_env.clone(), s.admin_token_sha256.clone());
    match (admin(w), admin(n)) {
        (a, b) if a == b => {}
        ((None, None), _) => out.push("admin token set".into()),
        (_, (None, None)) => out.push("admin token removed".into()),
        _ => out.push("admin token changed".into()),
    }
    let rest = |s: &crate::config::ServerConfig| {
        let mut v = json(s);
        if let Some(o) = v.as_object_mut() {
            for k in ["client_keys", "admin_token_env", "admin_token_sha256"] {
                o.remove(k);
            }
        }
        v
    };
    diff("[server]", "", &rest(w), &rest(n), out);
}

/// Accounts added, removed, and what changed in each kept one.
fn accounts(was: &Config, now: &Config, out: &mut Vec<String>) {
    let ids = |c: &Config| -> Vec<String> { c.accounts.iter().map(|a| a.id.clone()).collect() };
    let (before, after) = (ids(was), ids(now));
    let added: Vec<&str> = after.iter().filter(|a| !before.contains(a)).map(String::as_str).collect();
    let removed: Vec<&str> = before.iter().filter(|a| !after.contains(a)).map(String::as_str).collect();
    if !added.is_empty() {
        out.push(format!("accounts added: {}", added.join(", ")));
    }
    if !removed.is_empty() {
        out.push(format!("accounts removed: {}", removed.join(", ")));
    }
    for a in &was.accounts {
        if let Some(b) = now.accounts.iter().find(|b| b.id == a.id) {
            diff(&format!("account `{}`:", a.id), "", &json(a), &json(b), out);
        }
    }
}

/// Per stage kept by name: its options (named by key), deadline, memory,
/// scope and instances.
fn stage_settings(was: &Config, now: &Config, out: &mut Vec<String>) {
    let (Ok(before), Ok(after)) = (was.stage_specs(), now.stage_specs()) else { return };
    for s in &after {
        let Some(w) = before.iter().find(|w| w.name == s.name) else { continue };
        let mut what = Vec::new();
        let options = |spec: &StageSpec| serde_json::from_str::<Value>(&spec.plugin.config_json).unwrap_or_default();
        let (o1, o2) = (options(w), options(s));
        if o1 != o2 {
            let mut keys = Vec::new();
            diff("", "", &o1, &o2, &mut keys);
            // Named, not shown: a plugin's options are its own business.
            let named: Vec<String> = keys
                .iter()
                .filter_map(|k| k.trim().split(' ').next().map(|k| k.split('.').next().unwrap_or(k).to_string()))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            what.push(format!("options changed ({})", named.join(", ")));
        }
        let (lw, ls) = (&w.plugin.limits, &s.plugin.limits);
        if lw.deadline != ls.deadline {
            what.push(format!("timeout {} → {} ms", lw.deadline.as_millis(), ls.deadline.as_millis()));
        }
        if lw.memory_bytes != ls.memory_bytes {
            what.push(format!("memory {} → {} MiB", lw.memory_bytes >> 20, ls.memory_bytes >> 20));
        }
        if lw.configure_deadline != ls.configure_deadline {
            what.push(format!(
                "configure timeout {} → {} ms",
                lw.configure_deadline.as_millis(),
                ls.configure_deadline.as_millis()
            ));
        }
        if lw.freshness_ms != ls.freshness_ms {
            what.push(format!("freshness {} → {} ms", lw.freshness_ms, ls.freshness_ms));
        }
        if w.plugin.scope != s.plugin.scope {
            what.push(format!("state scope `{}` → `{}`", w.plugin.scope, s.plugin.scope));
        }
        if w.plugin.max_idle != s.plugin.max_idle {
            what.push(format!("instances {} → {}", w.plugin.max_idle, s.plugin.max_idle));
        }
        if w.plugin.max_instances != s.plugin.max_instances {
            what.push(format!("max instances {} → {}", w.plugin.max_instances, s.plugin.max_instances));
        }
        if !what.is_empty() {
            out.push(format!("stage `{}`: {}", s.name, what.join(", ")));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diffs(a: Value, b: Value) -> Vec<String> {
        let mut out = Vec::new();
        diff("[s]", "", &a, &b, &mut out);
        out
    }

    #[test]
    fn settings_are_shown_key_by_key_and_secrets_only_named() {
        assert_eq!(
            diffs(json!({"a": 1, "b": {"c": true}}), json!({"a": 2, "b": {"c": false}})),
            ["[s] a 1 → 2", "[s] b.c true → false"]
        );
        assert_eq!(diffs(json!({"url": "redis://:pw@h"}), json!({"url": "redis://:other@h"})), ["[s] url changed"]);
        assert_eq!(diffs(json!({"list": [1]}), json!({"list": [1, 2]})), ["[s] list 1 → 2 entries"]);
        assert_eq!(diffs(json!({"x": null}), json!({"x": "on"})), ["[s] x unset → `on`"]);
        assert!(diffs(json!({"a": 1}), json!({"a": 1})).is_empty());
    }

    #[test]
    fn client_keys_by_count_and_name() {
        let mut was = Config::default();
        let key = |name: &str| crate::config::ClientKey {
            name: name.into(),
            sha256: Some("ab".into()),
            key_env: None,
            ..Default::default()
        };
        was.server.client_keys = vec![key("alice"), key("ci")];
        let mut now = was.clone();
        now.server.client_keys.pop();
        now.server.admin_token_env = Some("ADMIN".into());
        now.server.max_body_mb = 16;
        let mut out = Vec::new();
        server(&was, &now, &mut out);
        assert_eq!(out, ["client keys 2 → 1 (removed ci)", "admin token set", "[server] max_body_mb 32 → 16"]);
    }

    #[test]
    fn a_stage_whose_options_changed_says_so() {
        let text = |spread: u32| {
            format!(
                "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"headroom\"\n[policy.chain.config]\nspread \
                 = {spread}\n"
            )
        };
        let load = |t: String| crate::config::validate::parse(&t, "t.toml").unwrap().0;
        let mut out = Vec::new();
        stage_settings(&load(text(1)), &load(text(2)), &mut out);
        assert_eq!(out, ["stage `headroom`: options changed (spread)"]);
    }
}
