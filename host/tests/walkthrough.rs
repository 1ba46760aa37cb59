//! The walk-through of docs/writing-plugins.md §1.1, run word for word in each
//! language, so that it cannot rot: in an empty directory outside the checkout,
//! with the `poolgate` binary and the language's tools only, `plugin new` →
//! the docs' code and fixture → `plugin build --config` → `plugin test` → the
//! stage added to a running gateway's config → requests follow the new rule.
//!
//! The Rust walk-through runs with an empty `CARGO_HOME` and
//! `CARGO_NET_OFFLINE=true`: the skeleton carries the SDK, which depends on no
//! crate. Each test prints how long the swap took (config saved → first request
//! ranked by the new plugin); the README quotes those figures.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use poolgate_mock_upstream::MockUpstream;
use support::{Gateway, send_message, tempdir};

const ADMIN: &str = "walk-admin";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The docs' code block after the marker `<!-- walkthrough:<key> ... -->`, and
/// what the marker says after the key.
fn docs_block(key: &str) -> (String, String) {
    let docs = std::fs::read_to_string(repo().join("docs/writing-plugins.md")).unwrap();
    let marker = format!("<!-- walkthrough:{key}");
    let at = docs.find(&marker).unwrap_or_else(|| panic!("docs/writing-plugins.md has no {marker} -->"));
    let rest = &docs[at + marker.len()..];
    let (args, rest) = rest.split_once("-->").unwrap();
    let body = rest.split_once("```").unwrap().1;
    let body = body.split_once('\n').unwrap().1; // past the language tag
    let code = body.split_once("\n```").unwrap().0;
    (args.trim().to_string(), format!("{code}\n"))
}

/// Runs `cmd`, killing it after `limit`; panics with its output unless it succeeds.
fn run(mut cmd: Command, what: &str, limit: Duration) -> String {
    let out_path = std::env::temp_dir().join(format!("pg-walk-out-{}-{}", std::process::id(), rand()));
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = cmd
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "{what}: still running after {limit:?}:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        }
        #[allow(clippy::disallowed_methods, reason = "a bounded poll of a child process, on the test's own thread")]
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    assert!(status.success(), "{what} failed ({status}):\n{text}");
    text
}

fn rand() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
}

/// `poolgate <args>` in `dir`, with what the language needs and nothing else.
fn poolgate(args: &[&str], dir: &Path, lang: &str, home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_poolgate"));
    cmd.args(args).current_dir(dir);
    for var in ["CARGO_TARGET_DIR", "CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "RUSTC_WRAPPER", "POOLGATE_CONFIG"] {
        cmd.env_remove(var);
    }
    match lang {
        // Offline with an empty cargo home: no registry, no index, no crates.
        "rust" => {
            let cargo_home = home.join("cargo-home");
            std::fs::create_dir_all(&cargo_home).unwrap();
            cmd.env("CARGO_HOME", cargo_home).env("CARGO_NET_OFFLINE", "true");
        }
        // componentize-js installed once for every plugin (.ci/setup installs
        // the pinned packages under examples/plugins/js).
        "js" => {
            cmd.env("POOLGATE_JS_TOOLCHAIN", repo().join("examples/plugins/js/node_modules"));
        }
        _ => {}
    }
    cmd
}

fn gateway_config(base: &str, cache: &Path, stage: &str) -> String {
    let mut s =
        format!("[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[policy]\ncache_dir = \"{}\"\n\n", cache.display());
    for (id, alias) in [("a", "zeta"), ("b", "alpha"), ("c", "mid")] {
        s += &format!(
            "[[accounts]]\nid = \"{id}\"\nalias = \"{alias}\"\napi_key_env = \"KEY_{}\"\nbase_url = \"{base}\"\n\n",
            id.to_uppercase()
        );
    }
    s + stage
}

async fn served_by(gw: &Gateway) -> (String, String) {
    let r = send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    let h = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    (h("x-poolgate-account"), h("x-poolgate-reason"))
}

async fn walk(lang: &str, source: &str) {
    let home = tempdir::Dir::new(&format!("walk-{lang}"));
    assert!(!home.0.starts_with(repo()), "the walk-through runs outside the checkout");
    let work = home.0.join("work");
    std::fs::create_dir_all(&work).unwrap();

    // A gateway already running, with the default chain.
    let mock = MockUpstream::start().await;
    for key in ["key-a", "key-b", "key-c"] {
        mock.account(key);
    }
    let gw_dir = tempdir::Dir::new(&format!("walk-gw-{lang}"));
    let config = gw_dir.0.join("poolgate.toml");
    let cache = home.0.join("gateway-cache");
    std::fs::write(&config, gateway_config(&mock.base_url(), &cache, "")).unwrap();
    let env = [("KEY_A", "key-a"), ("KEY_B", "key-b"), ("KEY_C", "key-c"), ("PG_ADMIN", ADMIN)];
    let gw = Gateway::start_file(&config, &env, gw_dir);
    assert_eq!(served_by(&gw).await.0, "a", "the default chain takes pool order");

    // plugin new, then the docs' code and fixture.
    run(
        poolgate(&["plugin", "new", "alias-first", "--lang", lang], &work, lang, &home.0),
        "plugin new",
        Duration::from_secs(30),
    );
    let plugin = work.join("alias-first");
    let (args, code) = docs_block(lang);
    assert!(args.starts_with(source), "the docs' {lang} block is for {args}, not {source}");
    let file = plugin.join(source);
    match args.split_once(" class ") {
        // Replace from `class <Name>` to the end of the file.
        Some((_, class)) => {
            let text = std::fs::read_to_string(&file).unwrap();
            let at = text.find(&format!("class {class}")).unwrap_or_else(|| panic!("no class {class} in {source}"));
            std::fs::write(&file, format!("{}{code}", &text[..at])).unwrap();
        }
        None => std::fs::write(&file, code).unwrap(),
    }
    std::fs::write(plugin.join("fixtures/basic.json"), docs_block("fixture").1).unwrap();

    // Build (compiling into the gateway's cache) and test.
    let config_arg = config.display().to_string();
    let built = run(
        poolgate(&["plugin", "build", ".", "--config", &config_arg], &plugin, lang, &home.0),
        &format!("{lang}: plugin build"),
        Duration::from_secs(600),
    );
    assert!(built.contains("verdict    compatible"), "{built}");
    let wasm = plugin.join("target/alias-first.wasm");
    let tested = run(
        poolgate(&["plugin", "test", "target/alias-first.wasm", "fixtures"], &plugin, lang, &home.0),
        &format!("{lang}: plugin test"),
        Duration::from_secs(120),
    );
    assert!(tested.contains("1 passed, 0 failed"), "{tested}");

    // Deploy: add the stage to the running gateway's config and save it.
    let stage = format!("[[policy.chain]]\nplugin = \"{}\"\nname = \"alias-first\"\n", wasm.display());
    let saved = Instant::now();
    std::fs::write(&config, gateway_config(&mock.base_url(), &cache, &stage)).unwrap();
    let swap = loop {
        let (_, reason) = served_by(&gw).await;
        if reason == "alias_first" {
            break saved.elapsed();
        }
        assert!(saved.elapsed() < Duration::from_secs(30), "{lang}: the new chain never took over:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for _ in 0..20 {
        assert_eq!(served_by(&gw).await, ("b".to_string(), "alias_first".to_string()), "alpha sorts first");
    }
    let reload_line = gw.log().lines().find(|l| l.contains("configuration reloaded")).map(str::to_string);
    let reload_line = reload_line.unwrap_or_else(|| panic!("no reload line in the log:\n{}", gw.log()));
    assert!(reload_line.contains("stage `alias-first` added") && reload_line.contains("took_ms"), "{reload_line}");
    let compiled_here = gw.log().lines().any(|l| l.contains("compiled plugin") && l.contains("alias-first.wasm"));
    assert!(!compiled_here, "plugin build --config compiled it into the gateway's cache:\n{}", gw.log());
    eprintln!(
        "{lang}: swap took {:.0} ms (config saved → first request ranked by alias-first)",
        swap.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_walkthrough_deploys_offline() {
    walk("rust", "src/lib.rs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_walkthrough_deploys() {
    walk("python", "app.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_walkthrough_deploys() {
    walk("js", "ranker.js").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_walkthrough_deploys() {
    walk("c", "ranker.c").await;
}
