//! Loading a plugin is bounded: `poolgate check`, startup and reload always
//! finish within their limits, whatever the plugin does while it is compiled
//! or configured, and each refusal names the limit. A reload that runs into a
//! limit is refused and the next one works.

use crate::bounded;
use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::Digest as _;

use bounded::OutputWithin as _;
use poolgate_mock_upstream::MockUpstream;
use support::{Gateway, hostile_components, send_message, tempdir};

const ADMIN: &str = "limits-admin";

fn misbehave() -> String {
    poolgate::artifacts::test_guest("misbehave").unwrap().to_string()
}

fn config(base: &str, policy: &str, stage: &str) -> String {
    format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[policy]\ncache_dir = \"\"\n{policy}\n\n\
         [[accounts]]\nid = \"a\"\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n{stage}"
    )
}

fn stage(plugin: &str, options: &str) -> String {
    format!("[[policy.chain]]\nplugin = \"{plugin}\"\nconfig = {{ {options} }}\n")
}

/// Runs `poolgate check` on `text`, killing it after `limit`: (exit ok, output, time).
fn check(dir: &Path, text: &str, limit: Duration) -> (bool, String, Duration) {
    let path = dir.join("check.toml");
    std::fs::write(&path, text).unwrap();
    let started = poolgate::clock::machine_instant();
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("check")
        .arg("--config")
        .arg(&path)
        .env("KEY_A", "key-a")
        .env("PG_ADMIN", ADMIN)
        // Its compiler children inherit the directory: how the test below
        // tells them from those of every other test running beside it.
        .current_dir(dir)
        .output_within(limit);
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text, started.elapsed())
}

#[test]
fn a_configure_that_sleeps_or_spins_is_refused_within_its_budget() {
    let dir = tempdir::Dir::new("limits-configure");
    let policy = "configure_timeout_ms = 300";
    // A spin ends at its fuel or, on a machine slower than fuel's
    // calibration, at its own-time budget a little before: refused either way.
    for (mode, expect) in
        [("sleep", &["configure cut after"][..]), ("spin", &["configure failed", "configure cut after"])]
    {
        let text = config(
            "http://127.0.0.1:9",
            policy,
            &stage(&misbehave(), &format!("fault = \"pass\", configure = \"{mode}\", ms = 60000")),
        );
        let (ok, out, took) = check(&dir.0, &text, Duration::from_secs(20));
        assert!(!ok, "{mode}: accepted:\n{out}");
        assert!(expect.iter().any(|e| out.contains(e)), "{mode}: {out}");
        assert!(took < Duration::from_secs(10), "{mode}: check took {took:?}");
    }
}

#[test]
fn a_plugin_over_the_size_limit_is_refused_naming_the_limit() {
    let dir = tempdir::Dir::new("limits-size");
    let big = dir.0.join("big.wasm");
    let bytes = std::fs::read(misbehave()).unwrap();
    std::fs::write(&big, hostile_components::padded(&bytes, 3 << 20)).unwrap();
    let text = config("http://127.0.0.1:9", "max_plugin_mb = 2", &stage(big.to_str().unwrap(), "fault = \"pass\""));
    let (ok, out, _) = check(&dir.0, &text, Duration::from_secs(60));
    assert!(!ok, "accepted:\n{out}");
    assert!(out.contains("over the plugin size limit of 2 MiB (policy.max_plugin_mb)"), "{out}");
    // The same file under the default limit loads: the padding is a valid section.
    let text = config("http://127.0.0.1:9", "", &stage(big.to_str().unwrap(), "fault = \"pass\""));
    let (ok, out, _) = check(&dir.0, &text, Duration::from_secs(60));
    assert!(ok, "{out}");
}

#[test]
fn a_compile_past_its_budget_is_abandoned_and_refused() {
    let dir = tempdir::Dir::new("limits-compile");
    let slow = dir.0.join("slow.wasm");
    std::fs::write(&slow, hostile_components::slow_to_compile(6_000)).unwrap();
    let text = config("http://127.0.0.1:9", "compile_timeout_ms = 100", &stage(slow.to_str().unwrap(), ""));
    let text = text.replace("config = {  }\n", "");
    let (ok, out, took) = check(&dir.0, &text, Duration::from_secs(60));
    assert!(!ok, "accepted:\n{out}");
    assert!(out.contains("longer than the compile budget of 0.1 s (policy.compile_timeout_ms)"), "{out}");
    assert!(took < Duration::from_secs(5), "check took {took:?}");
    // The compiler child was killed, not left running. Only this check's
    // children count (those working in its directory): other tests compile
    // plugins at the same time.
    let here = dir.0.canonicalize().unwrap();
    let ours = |pid: &str| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == here);
    bounded::eventually_blocking("every compiler process is gone", Duration::from_secs(5), || {
        let ps = Command::new("ps").args(["-eo", "pid=,args="]).output_within(Duration::from_secs(10));
        !String::from_utf8_lossy(&ps.stdout)
            .lines()
            .filter(|l| l.contains("__compile-plugin"))
            .any(|l| ours(l.split_whitespace().next().unwrap_or("")))
    });
}

/// Under `serve`: a reload to a plugin whose configure hangs is refused within
/// the bound while traffic keeps flowing, and the next reload works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_hangs_in_configure_is_refused_and_the_next_one_works() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("limits-reload");
    let path = dir.0.join("poolgate.toml");
    let policy = "configure_timeout_ms = 300";
    std::fs::write(&path, config(&mock.base_url(), policy, "[[policy.chain]]\nplugin = \"builtin:headroom\"\n"))
        .unwrap();
    let gw = Gateway::start_file(&path, &[("KEY_A", "key-a"), ("PG_ADMIN", ADMIN)], dir);
    let reload = || async {
        let started = poolgate::clock::machine_instant();
        let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap(), started.elapsed())
    };
    let hanging = stage(&misbehave(), "fault = \"pass\", configure = \"sleep\", ms = 600000");
    std::fs::write(&path, config(&mock.base_url(), policy, &hanging)).unwrap();
    let (status, body, took) = reload().await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("configure cut after"), "{body}");
    assert!(took < Duration::from_secs(10), "the reload took {took:?}");
    let r = send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200, "the running chain still serves");

    let good = stage(&misbehave(), "fault = \"none\"");
    std::fs::write(&path, config(&mock.base_url(), policy, &good)).unwrap();
    let (status, body, _) = reload().await;
    assert_eq!(status, 200, "the next reload is not wedged: {body}");
}

/// #23: a reload that finds its component being compiled by another process
/// sharing the cache (`plugin inspect --config`, as `plugin build --config`
/// does) waits for that compile instead of starting a second one; when its
/// own, shorter budget runs out it is refused saying so, and it is retried —
/// and loads the other process's result without compiling — once that compile
/// finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_joins_a_compile_under_way_and_is_retried_when_it_finishes() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("limits-join");
    let cache = dir.0.join("cache");
    let slow = dir.0.join("slow.wasm");
    let bytes = hostile_components::slow_to_compile(6_000);
    // The lock of this component's compile, not a built-in's.
    let lock_prefix = format!("{}-", hex::encode(sha2::Sha256::digest(&bytes)));
    std::fs::write(&slow, &bytes).unwrap();
    let cached = format!("cache_dir = {:?}\n", cache.display().to_string());
    let path = dir.0.join("poolgate.toml");
    // This test's own cache, shared by the gateway and the other process.
    let config = |base: &str, policy: &str, stage: &str| config(base, policy, stage).replace("cache_dir = \"\"\n", "");
    // Started with the default budget (the built-ins compile in time on a
    // loaded machine); the reload that meets the other compile has 0.5 s.
    std::fs::write(&path, config(&mock.base_url(), &cached, "")).unwrap();
    let gateway_policy = format!("{cached}compile_timeout_ms = 500");
    let tool = dir.0.join("tool.toml");
    std::fs::write(&tool, config("http://127.0.0.1:9", &format!("{cached}compile_timeout_ms = 300000"), "")).unwrap();
    let gw = Gateway::start_file(&path, &[("KEY_A", "key-a"), ("PG_ADMIN", ADMIN)], dir);

    // Another process starts compiling the component into the shared cache.
    let inspect = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["plugin", "inspect", slow.to_str().unwrap(), "--config", tool.to_str().unwrap()])
        .env("KEY_A", "key-a")
        .env("PG_ADMIN", ADMIN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let compiling = || {
        std::fs::read_dir(&cache).is_ok_and(|d| {
            d.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&lock_prefix) && name.ends_with(".lock")
            })
        })
    };
    support::eventually("the other process holds the compile lock", Duration::from_secs(30), async || compiling())
        .await;

    // The gateway is asked to load it meanwhile: it waits, then gives up at its budget.
    let stage = format!("[[policy.chain]]\nplugin = {:?}\nname = \"slow\"\n", slow.display().to_string());
    std::fs::write(&path, config(&mock.base_url(), &gateway_policy, &stage)).unwrap();
    let status = || async {
        let r = Gateway::client().get(format!("{}/status", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        r.json::<serde_json::Value>().await.unwrap()
    };
    support::eventually(
        "the reload is refused, naming the compile it waited for",
        Duration::from_secs(30),
        async || {
            let s = status().await;
            s["config"]["last_reload"]["ok"] == false
                && s["config"]["last_reload"]["errors"].to_string().contains("being compiled elsewhere")
        },
    )
    .await;
    assert!(compiling(), "the other compile is still under way: the test would not show a join");

    // The other compile finishes; the refused reload is retried and loads it.
    let mut inspect = inspect;
    let done = tokio::task::spawn_blocking(move || inspect.wait().unwrap()).await.unwrap();
    assert!(done.success(), "the other process's compile succeeded");
    support::eventually("the reload is retried and the stage loaded", Duration::from_secs(30), async || {
        let s = status().await;
        s["config"]["last_reload"]["ok"] == true && s["config"]["last_reload"]["trigger"] == "compile-finished"
    })
    .await;
    let r = send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    let log = gw.log();
    let compiled = log.lines().any(|l| l.contains("compiled plugin") && l.contains("slow.wasm"));
    assert!(!compiled, "the gateway compiled it a second time:\n{log}");
    assert!(log.contains("waiting for it"), "{log}");
}
