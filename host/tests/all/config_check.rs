//! `poolgate check` and `poolgate serve` refuse a bad config the same way: every
//! problem at once, each with its key path and line, and a non-zero exit.

use crate::bounded;

use std::process::Command;

use bounded::OutputWithin as _;

fn run(args: &[&str], config: &str) -> (bool, String) {
    run_with(args, config, &[])
}

/// `poolgate <args> --config <config>` with `env` set: whether it succeeded
/// and what it printed, the file's path shown as `cfg`.
fn run_with(args: &[&str], config: &str, env: &[(&str, &str)]) -> (bool, String) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("pg-check-{}-{}-{n}", std::process::id(), args[0]));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("poolgate.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(args)
        .arg("--config")
        .arg(&path)
        .env_remove("POOLGATE_LISTEN")
        .env("GOOD_KEY", "k")
        .envs(env.iter().copied())
        .output_within(std::time::Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text.replace(&format!("{}", path.display()), "cfg"))
}

const BAD: &str = r#"[server]
listen = "127.0.0.1:0"
decisions_kept = -5
colour = "blue"

[[accounts]]
id = "a"
api_key_env = "POOLGATE_CHECK_UNSET"

[[accounts]]
id = "a"
api_key_env = "GOOD_KEY"
max_in_flight = 0

[[policy.chain]]
plugin = "builtin:does-not-exist"

[[policy.chain]]
plugin = "./missing.wasm"
"#;

#[test]
fn check_reports_every_problem_with_its_line_and_fails() {
    let (ok, out) = run(&["check"], BAD);
    assert!(!ok);
    for needle in [
        "cfg:3: server.decisions_kept: -5 is out of range; allowed: 0 to 100000",
        "cfg:4: server.colour: unknown key",
        "cfg:8: accounts[0].api_key_env: environment variable POOLGATE_CHECK_UNSET is not set",
        "cfg:11: accounts[1].id: duplicate account id `a` (also accounts[0])",
        "cfg:13: accounts[1].max_in_flight: 0 is out of range",
        "cfg:16: policy.chain[0].plugin: unknown built-in `builtin:does-not-exist`",
        "policy.chain[1].plugin: no plugin file at",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    assert!(out.contains("has 7 problems"), "{out}");
}

#[test]
fn serve_refuses_to_start_on_the_same_problems() {
    let (ok, out) = run(&["serve"], BAD);
    assert!(!ok);
    assert!(out.contains("cfg:4: server.colour: unknown key"), "{out}");
    assert!(!out.contains("listening"), "{out}");
}

#[test]
fn a_plugin_that_rejects_its_options_is_located_in_the_file() {
    let cfg = "[[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n\n[[policy.chain]]\nplugin = \"builtin:headroom\"\nconfig = { floor = 7.0 }\n";
    let (ok, out) = run(&["check"], cfg);
    assert!(!ok);
    assert!(out.contains("cfg:5: policy.chain[0] (`builtin:headroom`)"), "{out}");
    assert!(out.contains("option `floor` = 7 is out of range"), "{out}");
}

#[test]
fn a_good_config_checks_out() {
    let cfg = "[[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n";
    let (ok, out) = run(&["check"], cfg);
    assert!(ok, "{out}");
    assert!(out.contains("chain:    builtin:skip-exhausted → builtin:headroom"), "{out}");
}

#[test]
fn serve_refuses_header_settings_it_cannot_honour_naming_the_key() {
    let cfg = "[server]\nlisten = \"127.0.0.1:0\"\nmax_header_bytes = 10\n\n\
               [gateway]\nforward_headers = [\"x-team-*\", \"X-Upper\", \"cookie\", \"x-trace*\", 5]\n\n\
               [[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n";
    let (ok, out) = run(&["serve"], cfg);
    assert!(!ok, "{out}");
    assert!(out.contains("cfg:3: server.max_header_bytes: 10 is out of range; allowed: 1024 to 1048576"), "{out}");
    assert!(out.contains("cfg:6: gateway.forward_headers: expected strings, found integer"), "{out}");
    assert!(!out.contains("listening"), "{out}");
    let cfg = cfg.replace("max_header_bytes = 10", "max_header_bytes = 65536").replace(", 5]", "]");
    let (ok, out) = run(&["serve"], &cfg);
    assert!(!ok, "{out}");
    for needle in [
        "cfg:6: gateway.forward_headers: `X-Upper` is not a lowercase header name",
        "cfg:6: gateway.forward_headers: `cookie` is never forwarded",
        "cfg:6: gateway.forward_headers: `x-trace*`: a prefix ends in `-*`; write `x-trace-*`",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

/// `check` judges what `serve` would run: the file with the command line's
/// and the environment's overrides applied, and the checks `serve` makes of
/// them — an address beyond loopback needs client keys — so a file `check`
/// passes is one `serve` (and a reload) accepts.
#[test]
fn check_judges_the_file_as_serve_would_run_it() {
    let open = "[server]\nlisten = \"0.0.0.0:8787\"\n\n[[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n";
    for cmd in ["check", "serve"] {
        let (ok, out) = run(&[cmd], open);
        assert!(!ok, "{cmd}: {out}");
        assert!(
            out.contains("cfg:2: server.listen: `0.0.0.0:8787` is not a loopback address and no client keys"),
            "{out}"
        );
    }
    // The file alone is fine; the environment's listen is not.
    let closed = "[[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n";
    assert!(run(&["check"], closed).0);
    let (ok, out) = run_with(&["check"], closed, &[("POOLGATE_LISTEN", "0.0.0.0:0")]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("--listen: `0.0.0.0:0` (from --listen or POOLGATE_LISTEN) is not a loopback address"),
        "{out}"
    );
    let (ok, out) = run_with(&["check", "--listen", "[::]:0"], closed, &[]);
    assert!(!ok, "{out}");
    let (ok, out) = run_with(&["check", "--listen", "127.0.0.1:9999"], closed, &[]);
    assert!(ok, "{out}");
    assert!(out.contains("listen:   127.0.0.1:9999"), "{out}");
    let (ok, out) = run_with(&["check", "--listen", "nowhere"], closed, &[]);
    assert!(!ok && out.contains("`nowhere` (from --listen or POOLGATE_LISTEN) is not an address with a port"), "{out}");
}

/// `chain = []` is an error naming the key, at start and in `check`: an empty
/// chain ranks nothing, and quietly routing by the default chain instead would
/// hide the mistake. (Leaving `chain` out is how the default is had.)
#[test]
fn an_empty_chain_is_refused_naming_the_key() {
    let cfg = "[policy]\nchain = []\n\n[[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n";
    for cmd in ["check", "serve"] {
        let (ok, out) = run(&[cmd], cfg);
        assert!(!ok, "{cmd}: {out}");
        assert!(out.contains("cfg:2: policy.chain: an empty chain ranks nothing"), "{out}");
    }
}

/// A stage whose `configure` never ends — it sleeps 200 ms at a time, forever,
/// which no per-wait timer cuts — with `configure_timeout_ms = 1000`: its
/// configure phase is bounded at twice that plus 2 s of slack (4 s).
fn stuck_configure() -> String {
    let guest = poolgate::artifacts::test_guest("misbehave").expect("the misbehave guest");
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[[accounts]]\nid = \"a\"\napi_key_env = \"GOOD_KEY\"\n\n\
         [policy]\nconfigure_timeout_ms = 1000\n\n\
         [[policy.chain]]\nplugin = \"builtin:headroom\"\n\n\
         [[policy.chain]]\nplugin = \"{guest}\"\nname = \"stuck\"\n\
         config = {{ fault = \"pass\", configure = \"reload-nap\", ms = 200, bytes = 1048576 }}\n"
    )
}

/// `serve` and `check` give up on a `configure` that never ends within its
/// bound, naming the stage and the phase, instead of never becoming ready.
/// The limit asserted is the 4 s bound plus 26 s for compiling the guest and
/// starting on a busy 2-core machine; without the bound, `serve` never
/// became ready and `check` ran for 180 s.
#[test]
fn serve_and_check_give_up_on_a_configure_that_never_ends_naming_stage_and_phase() {
    let config = stuck_configure();
    for command in ["check", "serve"] {
        let started = poolgate::clock::machine_instant();
        let (ok, out) = run(&[command], &config);
        let took = started.elapsed();
        assert!(!ok, "{command}: {out}");
        assert!(!out.contains("listening"), "{command}: {out}");
        assert!(out.contains("policy.chain[1] (`stuck`)"), "{command} names the stage: {out}");
        assert!(out.contains("configure"), "{command} names the phase: {out}");
        assert!(took < std::time::Duration::from_secs(30), "{command} took {took:?}: {out}");
    }
}
