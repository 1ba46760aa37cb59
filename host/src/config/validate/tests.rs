//! The three passes on small files: each problem with its key path and line.

use super::shape::suggest;
use super::*;
use crate::config::schema;

fn problems(text: &str) -> Vec<String> {
    match parse(text, "t.toml") {
        Ok((c, idx)) => {
            meaning(&c, &idx, "t.toml", Some(&crate::config::Overrides::default())).err().map_or_else(Vec::new, |p| {
                p.items.iter().map(|i| format!("{}@{:?}: {}", i.path, i.line, i.message)).collect()
            })
        }
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
fn a_ledger_url_is_a_postgres_url_stands_alone_and_makes_a_budget_possible() {
    let budget = "[[server.client_keys]]\nname = \"c\"\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\nbudget_tokens_day = 5\n\n";
    let p = problems(&format!("{budget}[ledger]\nfile = \"\"\nurl = \"postgres://u:pw-secret@h:notaport/db\"\n"));
    assert!(p.iter().any(|l| l.starts_with("ledger.url@Some(8)") && l.contains("does not parse")), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("ledger.url") && l.contains("not both")), "{p:?}");
    assert!(!p.iter().any(|l| l.contains("pw-secret")), "the password is never repeated: {p:?}");
    let p = problems("[ledger]\nurl = \"mysql://u@h/db\"\n");
    assert!(p.iter().any(|l| l.starts_with("ledger.url") && l.contains("not a PostgreSQL URL")), "{p:?}");
    for scheme in ["postgres", "postgresql"] {
        let p = problems(&format!("{budget}[ledger]\nurl = \"{scheme}://u:pw@127.0.0.1:5432/db\"\n"));
        assert!(p.is_empty(), "a budget on the database's ledger: {p:?}");
    }
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
        all.contains("accounts[0].api_key_env@Some(4): environment variable POOLGATE_TEST_SURELY_UNSET_VAR is not set"),
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
fn the_send_timeout_is_a_whole_number_of_ms_from_one_second_to_an_hour() {
    for bad in ["0", "999", "3600001", "-5", "\"60s\"", "1.5"] {
        let p = problems(&format!("[server]\nsend_timeout_ms = {bad}\n"));
        assert_eq!(p.len(), 1, "{bad}: {p:?}");
        assert!(p[0].starts_with("server.send_timeout_ms@Some(2): "), "{bad}: {p:?}");
    }
    for good in ["1000", "60000", "3600000"] {
        assert!(problems(&format!("[server]\nsend_timeout_ms = {good}\n")).is_empty(), "{good}");
    }
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
    assert!(all.contains("policy.chain[3].name@Some(15): duplicate stage name `same` (also policy.chain[2])"), "{all}");
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
        p.iter().any(|s| s.starts_with("policy.breaker.failures@Some(2): 10001 is out of range; allowed: 0 to 10000")),
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
    let text = include_str!("../../../../examples/poolgate.toml");
    if let Err(p) = parse(text, "examples/poolgate.toml") {
        panic!("{p}");
    }
}

#[test]
fn suggestions_are_close_matches_only() {
    assert_eq!(suggest("listn", schema::SERVER), Some("listen"));
    assert_eq!(suggest("zzzzzz", schema::SERVER), None);
}

#[test]
fn telemetry_that_cannot_export_is_refused_at_its_line_and_a_header_value_never_repeated() {
    let p = problems("[telemetry]\nendpoint = \"collector:4318\"\n");
    assert!(p.iter().any(|l| l.starts_with("telemetry.endpoint@Some(2)") && l.contains("URL")), "{p:?}");
    let p = problems("[telemetry]\nendpoint = \"http://c:4318\"\nprotocol = \"http/json\"\n");
    assert!(p.iter().any(|l| l.starts_with("telemetry.protocol@Some(3)")), "{p:?}");
    let p = problems("[telemetry]\nendpoint = \"http://c:4318\"\nheaders = { \"api-key\" = \"sec\\nret\" }\n");
    assert!(p.iter().any(|l| l.starts_with("telemetry.headers")) && !p.iter().any(|l| l.contains("sec")), "{p:?}");
    let p = problems("[telemetry]\nendpoint = \"http://c:4318\"\nsampling = 2.0\n");
    assert!(p.iter().any(|l| l.starts_with("telemetry.sampling@Some(3)")), "{p:?}");
    assert!(problems("[telemetry]\nendpoint = \"http://c:4318\"\nsampling = 0.01\n").is_empty());
}
