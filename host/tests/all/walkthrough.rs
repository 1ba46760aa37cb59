//! The walk-through of docs/writing-plugins.md §1.1, run word for word in each
//! language, so that it cannot rot: in an empty directory outside the checkout,
//! with the `poolgate` binary and the language's tools only, `plugin new` →
//! the docs' code and fixture → `plugin build --config --out` (build, fixtures,
//! deploy) → the stage added to a running gateway's config → requests follow
//! the new rule; then, while it serves, an edit its fixture rejects (never
//! deployed: every request meanwhile is ranked by the tested component), the
//! edit with its fixture (deployed, ranking requests without a compile in the
//! gateway), and a build with nothing changed (no build, no compile).
//!
//! The Rust walk-through runs with an empty `CARGO_HOME` and
//! `CARGO_NET_OFFLINE=true`: the skeleton carries the SDK, which depends on no
//! crate. Each test prints how long the swap took (config saved → first request
//! ranked by the new plugin); the README quotes those figures.

use crate::support;

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
fn run(cmd: Command, what: &str, limit: Duration) -> String {
    let (ok, text) = outcome(cmd, what, limit);
    assert!(ok, "{what} failed:\n{text}");
    text
}

/// Runs `cmd`, killing it after `limit`: whether it succeeded, and its output.
fn outcome(mut cmd: Command, what: &str, limit: Duration) -> (bool, String) {
    let out_path = std::env::temp_dir().join(format!("pg-walk-out-{}-{}", std::process::id(), rand()));
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = cmd
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let started = poolgate::clock::machine_instant();
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
    (status.success(), format!("({status})\n{text}"))
}

fn rand() -> u32 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
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

    // Build, test and deploy to the path the chain will name, compiling into
    // the gateway's cache.
    let deployed = home.0.join("plugins/alias-first.wasm");
    let build = |what: &str| {
        let args = [
            "plugin",
            "build",
            ".",
            "--config",
            &config.display().to_string(),
            "--out",
            &deployed.display().to_string(),
        ]
        .map(str::to_string);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        outcome(
            poolgate(&args, &plugin, lang, &home.0),
            &format!("{lang}: plugin build ({what})"),
            Duration::from_secs(600),
        )
    };
    let (ok, built) = build("first");
    assert!(ok && built.contains("verdict    compatible") && built.contains("1 fixture cases passed"), "{built}");
    assert!(built.contains(&format!("deployed {}", deployed.display())), "{built}");
    let tested = run(
        poolgate(&["plugin", "test", &deployed.display().to_string(), "fixtures"], &plugin, lang, &home.0),
        &format!("{lang}: plugin test"),
        Duration::from_secs(120),
    );
    assert!(tested.contains("1 passed, 0 failed"), "{tested}");

    // Deploy: add the stage to the running gateway's config and save it.
    let stage = format!("[[policy.chain]]\nplugin = \"{}\"\nname = \"alias-first\"\n", deployed.display());
    let saved = poolgate::clock::machine_instant();
    std::fs::write(&config, gateway_config(&mock.base_url(), &cache, &stage)).unwrap();
    let swap = first_ranked(&gw, "alias_first", saved, lang).await;
    for _ in 0..20 {
        assert_eq!(served_by(&gw).await, ("b".to_string(), "alias_first".to_string()), "alpha sorts first");
    }
    let reload_line = gw.log().lines().find(|l| l.contains("configuration reloaded")).map(str::to_string);
    let reload_line = reload_line.unwrap_or_else(|| panic!("no reload line in the log:\n{}", gw.log()));
    assert!(reload_line.contains("stage `alias-first` added") && reload_line.contains("took_ms"), "{reload_line}");
    eprintln!(
        "{lang}: swap took {:.0} ms (config saved → first request ranked by alias-first)",
        swap.as_secs_f64() * 1e3
    );

    // Rebuild while it serves. An edit its fixture rejects is never deployed:
    // the gateway keeps serving the tested component throughout the build.
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.matches("alias_first").count(), 1, "the {lang} code names its reason once");
    std::fs::write(&file, text.replace("alias_first", "alias_next")).unwrap();
    let before = std::fs::read(&deployed).unwrap();
    let watching = watch_reasons(gw.url.clone());
    let started = poolgate::clock::machine_instant();
    let (ok, refused) = build("an edit the fixture rejects");
    let rejected = started.elapsed();
    let reasons = watching.stop().await;
    assert!(!ok && refused.contains("not deployed: 1 of 1 fixture cases failed"), "{refused}");
    assert_eq!(
        std::fs::read(&deployed).unwrap(),
        before,
        "{lang}: a failed fixture leaves the deployed file as it was"
    );
    assert!(!reasons.is_empty() && reasons.iter().all(|r| r == "alias_first"), "{lang}: served {reasons:?} meanwhile");

    // The fixture follows the edit: tested, deployed, and ranking requests
    // without a compile in the gateway.
    let fixture = plugin.join("fixtures/basic.json");
    let expected = std::fs::read_to_string(&fixture).unwrap();
    std::fs::write(&fixture, expected.replace("alias_first", "alias_next")).unwrap();
    let started = poolgate::clock::machine_instant();
    let (ok, rebuilt) = build("the edit with its fixture");
    let build_time = started.elapsed();
    assert!(ok && rebuilt.contains("deployed"), "{rebuilt}");
    let rebuild = first_ranked(&gw, "alias_next", started, lang).await;
    let compiled_here = gw.log().lines().any(|l| l.contains("compiled plugin") && l.contains("alias-first.wasm"));
    assert!(!compiled_here, "plugin build --config compiled it into the gateway's cache:\n{}", gw.log());

    // Nothing changed: no build, no compile, no reload.
    let started = poolgate::clock::machine_instant();
    let (ok, again) = build("unchanged");
    let unchanged = started.elapsed();
    assert!(ok && again.contains("unchanged since its last build") && again.contains("already deployed"), "{again}");
    eprintln!(
        "{lang}: rebuild while serving: an edit its fixture rejects {:.1} s (built, compiled, refused); the \
         fixture fixed → first request ranked by it {:.1} s (build, test, deploy {:.1} s); unchanged {:.2} s",
        rejected.as_secs_f64(),
        rebuild.as_secs_f64(),
        build_time.as_secs_f64(),
        unchanged.as_secs_f64()
    );
}

/// Waits until a request is ranked with `reason`; how long since `since`.
async fn first_ranked(gw: &Gateway, reason: &str, since: Instant, lang: &str) -> Duration {
    loop {
        let (_, got) = served_by(gw).await;
        if got == reason {
            return since.elapsed();
        }
        assert!(since.elapsed() < Duration::from_secs(600), "{lang}: `{reason}` never took over:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends requests one after another until stopped; the reasons they got.
struct Watch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

fn watch_reasons(url: String) -> Watch {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let client = Gateway::client();
        let mut reasons = Vec::new();
        while stopped.try_recv().is_err() {
            let r = send_message(&client, &url, "claude-sonnet-4-5").await.unwrap();
            assert_eq!(r.status(), 200);
            reasons.push(r.headers().get("x-poolgate-reason").and_then(|v| v.to_str().ok()).unwrap_or("").to_string());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        reasons
    });
    Watch { stop, task }
}

impl Watch {
    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.task.await.unwrap()
    }
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

/// #23: an `observe` that fails names its cause in every language, and the
/// case that replayed it fails `plugin build`, so the component is not
/// deployed. The skeleton as written, with one line of its `observe` broken.
async fn observe_failure(lang: &str, source: &str, from: &str, to: &str, cause: &[&str]) {
    let home = tempdir::Dir::new(&format!("observe-{lang}"));
    run(
        poolgate(&["plugin", "new", "oops", "--lang", lang], &home.0, lang, &home.0),
        "plugin new",
        Duration::from_secs(30),
    );
    let plugin = home.0.join("oops");
    let file = plugin.join(source);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(from), "the {lang} skeleton has `{from}`:\n{text}");
    std::fs::write(&file, text.replacen(from, to, 1)).unwrap();
    let case = r#"{"name": "observe runs", "now_ms": 1760000000000, "accounts": [{"id": "a"}, {"id": "b", "in_flight": 1}],
        "observe": [{"at_ms": 1759999400000, "account": "b"}], "expect": {"order": ["a", "b"]}}"#;
    std::fs::write(plugin.join("fixtures/observe.json"), case).unwrap();
    let (ok, out) = outcome(
        poolgate(&["plugin", "build", "."], &plugin, lang, &home.0),
        &format!("{lang}: plugin build"),
        Duration::from_secs(600),
    );
    assert!(!ok && out.contains("not deployed: 1 of 3 fixture cases failed"), "{out}");
    let failure = out.lines().find(|l| l.contains("observe #1 (account b) failed")).unwrap_or_else(|| panic!("{out}"));
    for c in cause {
        assert!(failure.contains(c), "{lang}: the observe failure names `{c}`: {failure}");
    }
    assert!(!plugin.join("dist").exists(), "nothing deployed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observe_failure_names_its_cause_in_rust() {
    let from = "    fn rank(&mut self,";
    let to = "    fn observe(&mut self, _req: &Request, _account: &AccountInfo, _outcome: &Outcome) {\n        \
              let seen: Vec<u32> = Vec::new();\n        let _ = seen[3];\n    }\n\n    fn rank(&mut self,";
    observe_failure("rust", "src/lib.rs", from, to, &["panicked at src/lib.rs", "index out of bounds"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observe_failure_names_its_cause_in_python() {
    let from = "    def observe(self, req, account, ended):\n        pass";
    let to = "    def observe(self, req, account, ended):\n        {}[\"missing\"]";
    observe_failure("python", "app.py", from, to, &["it logged: KeyError: 'missing' at observe (/0/app.py:"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observe_failure_names_its_cause_in_javascript() {
    let from = "  observe(req, account, ended) {},";
    let to = "  observe(req, account, ended) {\n    const seen = null;\n    seen.count += 1;\n  },";
    observe_failure("js", "ranker.js", from, to, &["it logged: TypeError:", "seen is null at observe (ranker.js:"])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observe_failure_names_its_cause_in_c() {
    let from = "if (ended == NULL) fail(\"observe: no outcome\");";
    let to = "fail(\"observe: cannot learn from this outcome\");";
    observe_failure(
        "c",
        "ranker.c",
        from,
        to,
        &["it logged: observe: cannot learn", "exports_poolgate_policy_ranker_observe"],
    )
    .await;
}
