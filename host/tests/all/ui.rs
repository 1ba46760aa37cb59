//! The web page (`/ui`) in a real browser: `tests/e2e/ui/ui.mjs` drives
//! Debian's Chromium with playwright-core against the real binary over the
//! mock upstream — sign in (a wrong token refused), every account shown, an
//! SDK request in the decisions within a second with its stages' reasons, a
//! key's usage moving, a cooldown shown and cleared from the page, a reload
//! from the page taking effect, the page at phone width. What the page
//! cannot do itself, the script asks of this test (`NEED …`). Screenshots
//! are kept in `target/tmp/ui/`. `./test.sh` installs Chromium and
//! playwright-core and sets `POOLGATE_REQUIRE_BROWSER`; without it, and
//! without a browser, the test says so and passes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use poolgate_mock_upstream::{MockUpstream, Step};

use crate::support::{self, Gateway, config};

const ADMIN: &str = "ui-admin";

fn browser() -> Option<(String, std::path::PathBuf)> {
    let chromium = std::env::var("POOLGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let script_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/ui");
    let ready = std::path::Path::new(&chromium).exists() && script_dir.join("node_modules/playwright-core").exists();
    ready.then_some((chromium, script_dir))
}

/// What the script asked for, done.
async fn serve_need(need: &str, mock: &MockUpstream, gw: &Gateway) {
    match need {
        "sdk-request" => {
            let code = "import anthropic, sys\n\
                        c = anthropic.Anthropic(base_url=sys.argv[1], api_key='dev-key', max_retries=0)\n\
                        c.messages.create(model='claude-sonnet-4-5', max_tokens=32, messages=[{'role': 'user', 'content': 'hi'}])";
            let out = Command::new("python3").args(["-c", code, &gw.url]).output().unwrap();
            assert!(out.status.success(), "the SDK request failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        "cooldown a" => {
            // Both accounts answer one 429 with a long retry-after: whichever
            // the request tries, `a` ends up cooling.
            for key in ["key-a", "key-b"] {
                mock.account(key).push(Step::RateLimited { unified: false, retry_after: Some("600".into()) });
            }
            let _ = support::messages(gw, "dev-key", "claude-sonnet-4-5", false).await;
        }
        "edit-config" => {
            let text = std::fs::read_to_string(gw.config_path()).unwrap();
            let renamed = text.replacen("id = \"a\"\n", "id = \"a\"\nalias = \"renamed\"\n", 1);
            assert_ne!(text, renamed);
            std::fs::write(gw.config_path(), renamed).unwrap();
        }
        other => panic!("the page's script asked for `{other}`"),
    }
}

/// Runs the page's script with `envs`, doing what it asks with `need`, until
/// it says `DONE` or fails (120 s at most): what it said, and its stderr.
async fn run_script(dir: &std::path::Path, envs: &[(&str, String)], need: impl AsyncFn(&str)) -> (String, String) {
    let mut script = Command::new("node")
        .arg(dir.join("ui.mjs"))
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs the page's script");
    let mut to_script = script.stdin.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = script.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut said = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.recv().await {
            said.push(line.clone());
            if let Some(what) = line.strip_prefix("NEED ") {
                need(what).await;
                writeln!(to_script, "OK").unwrap();
            }
            if line == "DONE" {
                return;
            }
        }
    })
    .await;
    let _ = script.kill();
    let out = script.wait_with_output().unwrap();
    (said.join("\n"), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_a_real_browser() {
    let Some((chromium, dir)) = browser() else {
        assert!(
            std::env::var_os("POOLGATE_REQUIRE_BROWSER").is_none(),
            "POOLGATE_REQUIRE_BROWSER is set but Chromium or playwright-core is missing (./test.sh installs both)"
        );
        eprintln!("skipped: no Chromium and playwright-core (./test.sh installs them)");
        return;
    };
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    mock.account("key-b");
    let keys = "[[server.client_keys]]\nname = \"dev\"\nkey_env = \"DEV_KEY\"\n[ledger]\nflush_ms = 100\n";
    let env = [("KEY_A", "key-a"), ("KEY_B", "key-b"), ("DEV_KEY", "dev-key"), ("PG_ADMIN", ADMIN)];
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], keys), &env);
    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&artifacts).unwrap();

    let envs = [
        ("GATEWAY_URL", gw.url.clone()),
        ("ADMIN_TOKEN", ADMIN.into()),
        ("ACCOUNTS", r#"["a","b"]"#.into()),
        ("UI_ARTIFACTS", artifacts.display().to_string()),
        ("CHROMIUM", chromium),
    ];
    let (said, out) = run_script(&dir, &envs, async |need| serve_need(need, &mock, &gw).await).await;
    assert!(said.ends_with("DONE") && !said.contains("PAGE ERROR"), "the page's script failed:\n{said}\n{out}");
    for shot in ["ui-laptop.png", "ui-phone.png"] {
        assert!(artifacts.join(shot).metadata().is_ok_and(|m| m.len() > 10_000), "{shot} in {}", artifacts.display());
    }
    let figure = said.lines().find_map(|l| l.strip_prefix("FIGURE decision_shown_ms ")).unwrap();
    eprintln!("a decision reached the page {figure} ms after its request");
}

/// `poolgate demo --traffic`: the link it prints opens the page signed in
/// (its one-time ticket leaves the address) and the page moves as the
/// demo's traffic flows. Its screenshot is the README's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_link_opens_its_pool_moving_live() {
    let Some((chromium, dir)) = browser() else {
        assert!(std::env::var_os("POOLGATE_REQUIRE_BROWSER").is_none(), "no Chromium or playwright-core");
        eprintln!("skipped: no Chromium and playwright-core (./test.sh installs them)");
        return;
    };
    let mut demo = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["demo", "--traffic", "--listen", "127.0.0.1:0", "--duration", "60"])
        .env("XDG_CACHE_HOME", concat!(env!("CARGO_TARGET_TMPDIR"), "/xdg-cache"))
        .env_remove("POOLGATE_LOG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("poolgate runs");
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = demo.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // From a clean clone the demo compiles its built-ins first (see `demo`).
    let link = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(60)).ok())
        .find_map(|l| l.trim().contains("/ui#ticket=").then(|| l.trim().to_string()))
        .expect("the demo prints its page's link");
    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&artifacts).unwrap();
    let envs = [("DEMO_LINK", link), ("UI_ARTIFACTS", artifacts.display().to_string()), ("CHROMIUM", chromium)];
    let (said, out) = run_script(&dir, &envs, async |what| panic!("the demo's run asked for {what}")).await;
    let _ = demo.kill();
    let _ = demo.wait();
    assert!(said.ends_with("DONE") && !said.contains("PAGE ERROR"), "the page's script failed:\n{said}\n{out}");
    assert!(artifacts.join("ui-demo.png").metadata().is_ok_and(|m| m.len() > 10_000));
}
