//! Hot swap under load: steady traffic through the real binary while the chain is
//! swapped 100 times — between built-ins, between versions of a `.wasm` replaced
//! in place, and to an invalid plugin or an invalid config. No client request may
//! fail, every valid swap must show in the decisions as the very next generation
//! (the one reload its write set off: the watcher neither missed it nor took it
//! twice), and every invalid one must be refused by one reload with the running
//! chain kept. How long each took is printed, not asserted: a busy machine
//! stretches any time; a bound on it belongs in a benchmark. The time limits
//! left here are liveness guards, far above what any machine needs.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use poolgate_mock_upstream::MockUpstream;
use serde_json::Value;
use support::{Gateway, message, tempdir};

const ADMIN: &str = "swap-admin";

/// How long a test waits for something that must happen at all (a reload the
/// watcher or a signal sets off) before it fails: a guard against a hang, not
/// a measure of promptness.
const LIVENESS: Duration = Duration::from_secs(30);

fn builtin_bytes(name: &str) -> &'static [u8] {
    poolgate::artifacts::BUILTINS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b).unwrap()
}

/// Replaces `path` atomically, as a deploy tool would.
fn write_atomic(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn config(base: &str, chain: &[(&str, Option<&str>)]) -> String {
    let mut s = "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n".to_string();
    for i in 0..4 {
        s.push_str(&format!("[[accounts]]\nid = \"acct-{i}\"\nalias = \"{i}-seat\"\napi_key_env = \"KEY_{i}\"\nbase_url = \"{base}\"\n\n"));
    }
    for (plugin, name) in chain {
        s.push_str(&format!("[[policy.chain]]\nplugin = \"{plugin}\"\n"));
        if let Some(n) = name {
            s.push_str(&format!("name = \"{n}\"\n"));
        }
        s.push('\n');
    }
    s
}

/// What a swap should look like once live: the stage names, and optionally the
/// reason the (single) plugin stage gives.
#[derive(Clone, Debug)]
struct Expect {
    stages: Vec<String>,
    reason: Option<&'static str>,
}

async fn status(url: &str) -> Value {
    support::admin_json(url, "/status", ADMIN).await
}

async fn newest_decision(url: &str) -> Option<Value> {
    let v: Value = Gateway::client()
        .get(format!("{url}/admin/decisions?limit=1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v.as_array()?.first().cloned()
}

fn matches(d: &Value, e: &Expect) -> bool {
    let Some(stages) = d["attempts"][0]["decision"]["stages"].as_array() else { return false };
    let names: Vec<&str> = stages.iter().filter_map(|s| s["stage"].as_str()).collect();
    names == e.stages.iter().map(String::as_str).collect::<Vec<_>>()
        && e.reason.is_none_or(|r| stages.last().and_then(|s| s["reason"].as_str()) == Some(r))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_swaps_under_traffic_lose_no_request() {
    let mock = MockUpstream::start().await;
    for i in 0..4 {
        mock.account(&format!("key-{i}"));
    }
    let dir = tempdir::Dir::new("swap");
    let cfg_path = dir.0.join("poolgate.toml");
    let ranker: PathBuf = dir.0.join("ranker.wasm");
    let ranker_s = ranker.to_str().unwrap().to_string();
    write_atomic(&ranker, builtin_bytes("headroom"));
    std::fs::write(&cfg_path, config(&mock.base_url(), &[("builtin:headroom", None)])).unwrap();
    let env: Vec<(String, String)> =
        (0..4).map(|i| (format!("KEY_{i}"), format!("key-{i}"))).chain([("PG_ADMIN".into(), ADMIN.into())]).collect();
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let gw = Gateway::start_file(&cfg_path, &env_ref, dir);
    let url = gw.url.clone();

    // Steady traffic: four clients, streaming and not, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (url, stop, ok, failed) = (url.clone(), stop.clone(), ok.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            let client = Gateway::client();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let stream = (n + c).is_multiple_of(2);
                let r =
                    client.post(format!("{url}/v1/messages")).json(&message("claude-sonnet-4-5", stream)).send().await;
                match r {
                    Ok(r) if r.status() == 200 => match r.bytes().await {
                        Ok(b) if !stream || String::from_utf8_lossy(&b).contains("message_stop") => {
                            ok.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    },
                    Ok(r) => {
                        eprintln!("client {c}: status {}", r.status());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        eprintln!("client {c}: {e}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }

    // The gateway compiles every built-in in the background after it starts;
    // from then on a swap is a reload, not a first compile (which on two busy
    // cores with an empty cache can alone take longer than the second allowed).
    let warming = poolgate::clock::machine_instant();
    while status(&url).await["builtins_ready"] != true {
        assert!(warming.elapsed() < Duration::from_secs(120), "built-ins never finished compiling:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Plugins whose reason is fixed are checked by it too; the ladders' reason
    // depends on which rung decided, so only their stage name is checked.
    let builtins: [(&str, Option<&'static str>); 4] = [
        ("builtin:fill-first", Some("fill_first")),
        ("builtin:headroom-first", None),
        ("builtin:expiry-first", None),
        ("builtin:headroom", Some("headroom")),
    ];
    let versions: [(&str, &'static str); 3] =
        [("headroom", "headroom"), ("fill-first", "fill_first"), ("prefer-primary", "")];
    let mut worst = Duration::ZERO;
    let (mut valid, mut refused) = (0, 0);
    for swap in 0..100usize {
        let before = status(&url).await;
        let generation = before["config"]["generation"].as_u64().unwrap();
        let failures = before["config"]["last_reload"]["consecutive_failures"].as_u64().unwrap_or(0);
        let expect = match swap % 5 {
            // Another built-in chain.
            0 | 2 => {
                let (plugin, reason) = builtins[(swap / 5) % builtins.len()];
                let chain: Vec<(&str, Option<&str>)> = if swap % 10 == 0 {
                    vec![("builtin:skip-exhausted", None), (plugin, None)]
                } else {
                    vec![(plugin, None)]
                };
                write_atomic(&cfg_path, config(&mock.base_url(), &chain).as_bytes());
                let stages = chain.iter().map(|(p, _)| p.to_string()).collect();
                Some(Expect { stages, reason })
            }
            // A user plugin: a new version replaces the .wasm in place.
            1 => {
                let (bytes, reason) = versions[(swap / 5) % versions.len()];
                write_atomic(&ranker, builtin_bytes(bytes));
                let chain = [(ranker_s.as_str(), Some("ranker"))];
                write_atomic(&cfg_path, config(&mock.base_url(), &chain).as_bytes());
                Some(Expect { stages: vec!["ranker".into()], reason: Some(reason) })
            }
            // An invalid plugin: the running chain must stay.
            3 => {
                write_atomic(&ranker, b"\0asm garbage, not a component");
                let chain = [(ranker_s.as_str(), Some("ranker"))];
                write_atomic(
                    &cfg_path,
                    config(&mock.base_url(), &chain).replace("[server]", "[server]\n# broken plugin").as_bytes(),
                );
                None
            }
            // An invalid config.
            _ => {
                write_atomic(
                    &cfg_path,
                    b"[server]\nlisten = \"127.0.0.1:1\"\nmax_body_mb = \"huge\"\n[[accounts]]\nid = \n",
                );
                None
            }
        };
        let started = poolgate::clock::machine_instant();
        match expect {
            Some(e) => {
                valid += 1;
                let seen = loop {
                    if let Some(d) = newest_decision(&url).await
                        && d["generation"].as_u64().unwrap_or(0) > generation
                        && matches(&d, &e)
                    {
                        break d["generation"].as_u64().unwrap();
                    }
                    assert!(started.elapsed() < LIVENESS, "swap {swap} ({e:?}) never became visible:\n{}", gw.log());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                assert_eq!(
                    seen,
                    generation + 1,
                    "swap {swap} ({e:?}) was not taken by the one reload its write set off:\n{}",
                    gw.log()
                );
            }
            None => {
                refused += 1;
                loop {
                    let st = status(&url).await;
                    let last = &st["config"]["last_reload"];
                    if last["ok"] == false && last["consecutive_failures"].as_u64().unwrap_or(0) > failures {
                        assert_eq!(
                            st["config"]["generation"].as_u64().unwrap(),
                            generation,
                            "swap {swap}: a refused reload changed the generation"
                        );
                        assert_eq!(
                            last["consecutive_failures"].as_u64().unwrap(),
                            failures + 1,
                            "swap {swap}: the invalid change was not refused by one reload:\n{}",
                            gw.log()
                        );
                        assert!(!last["errors"].as_array().unwrap().is_empty());
                        // The history `/status` keeps (the web page's list)
                        // leads with the same refusal.
                        assert_eq!(st["config"]["reloads"][0], *last, "swap {swap}");
                        break;
                    }
                    assert!(started.elapsed() < LIVENESS, "swap {swap}: invalid change never refused:\n{}", gw.log());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        worst = worst.max(started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "100 swaps ({valid} valid, {refused} refused), slowest took {worst:?}; {ok} requests served, {failed} failed"
    );
    assert_eq!(failed, 0, "client requests failed during the swaps");
    assert!(ok > 200, "traffic kept flowing ({ok} requests)");
    let metrics = Gateway::client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    // One reload per change, no more, no fewer: each valid write made exactly
    // one generation, each invalid one exactly one refusal.
    assert!(metrics.contains(&format!("poolgate_reloads_total{{result=\"error\"}} {refused}")), "{metrics}");
    assert!(metrics.contains(&format!("poolgate_reloads_total{{result=\"ok\"}} {valid}")), "{metrics}");
    assert_eq!(status(&url).await["config"]["generation"], 1 + valid, "the first generation, then one per valid swap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_the_admin_endpoint_reload_and_state_survives() {
    let mock = MockUpstream::start().await;
    for i in 0..4 {
        mock.account(&format!("key-{i}"));
    }
    let dir = tempdir::Dir::new("hup");
    let cfg_path = dir.0.join("poolgate.toml");
    std::fs::write(&cfg_path, config(&mock.base_url(), &[("builtin:headroom", None)])).unwrap();
    let env: Vec<(String, String)> =
        (0..4).map(|i| (format!("KEY_{i}"), format!("key-{i}"))).chain([("PG_ADMIN".into(), ADMIN.into())]).collect();
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let gw = Gateway::start_file(&cfg_path, &env_ref, dir);
    // Learn something about acct-0: it answers 429 once and cools.
    mock.account("key-0")
        .push(poolgate_mock_upstream::Step::RateLimited { unified: false, retry_after: Some("300".into()) });
    let r = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("m", false)).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // Admin reload: synchronous, answers with the new generation.
    let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["generation"], 2);
    // A refused one names the problem with its line, and keeps generation 2.
    let good = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(&cfg_path, good.replace("[server]", "[server]\nlisten = 8")).unwrap();
    let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 422);
    let body: Value = r.json().await.unwrap();
    let errors = body["errors"].to_string();
    assert!(errors.contains(":2: server.listen: expected a string"), "{errors}");
    std::fs::write(&cfg_path, &good).unwrap();
    // The watcher picks the restored file up by itself.
    let started = poolgate::clock::machine_instant();
    let settled = loop {
        let st = status(&gw.url).await;
        if st["config"]["last_reload"]["trigger"] == "file-watch" && st["config"]["last_reload"]["ok"] == true {
            break st["config"]["generation"].as_u64().unwrap();
        }
        assert!(started.elapsed() < LIVENESS, "the watcher did not reload the restored file:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // SIGHUP reloads the unchanged file.
    std::process::Command::new("kill").args(["-HUP", &gw.pid().to_string()]).status().unwrap();
    let started = poolgate::clock::machine_instant();
    loop {
        let st = status(&gw.url).await;
        if st["config"]["generation"].as_u64().unwrap() > settled {
            assert_eq!(st["config"]["last_reload"]["trigger"], "sighup");
            assert_eq!(st["config"]["last_reload"]["ok"], true);
            // The account's learned cooldown survived every reload.
            let a0 = st["accounts"].as_array().unwrap().iter().find(|a| a["id"] == "acct-0").unwrap().clone();
            assert_eq!(a0["cooldown"]["reason"], "transient", "{a0}");
            break;
        }
        assert!(started.elapsed() < LIVENESS, "SIGHUP did not reload:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A config file caught empty (a write in progress, or a mistake) is refused
/// on reload: the running configuration — accounts, admin token — stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_config_file_is_refused_and_the_running_one_stays() {
    let mock = MockUpstream::start().await;
    for i in 0..4 {
        mock.account(&format!("key-{i}"));
    }
    let dir = tempdir::Dir::new("empty-reload");
    let path = dir.0.join("poolgate.toml");
    std::fs::write(&path, config(&mock.base_url(), &[("builtin:headroom", None)])).unwrap();
    let env = [("KEY_0", "key-0"), ("KEY_1", "key-1"), ("KEY_2", "key-2"), ("KEY_3", "key-3"), ("PG_ADMIN", ADMIN)];
    let gw = Gateway::start_file(&path, &env, dir);
    std::fs::write(&path, "").unwrap();
    let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert!(!r.status().is_success(), "an empty file was applied");
    assert!(r.text().await.unwrap().contains("is empty"));
    let st = status(&gw.url).await;
    assert_eq!(st["accounts"].as_array().map(Vec::len), Some(4), "the running configuration stays: {st}");
    let r = support::send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
}

/// The file of the reload tests below: one account, a stage with options, and
/// (when `keys`) two client keys.
fn guarded_config(base: &str, keys: bool, admin: bool, chain: &str) -> String {
    let mut s = String::from("[server]\nlisten = \"127.0.0.1:1\"\n");
    if admin {
        s.push_str("admin_token_env = \"PG_ADMIN\"\n");
    }
    if keys {
        s.push_str("\n[[server.client_keys]]\nname = \"alice\"\nkey_env = \"ALICE_KEY\"\n");
        s.push_str("\n[[server.client_keys]]\nname = \"ci\"\nkey_env = \"CI_KEY\"\n");
    }
    s.push_str(&format!("\n[[accounts]]\nid = \"acct-0\"\napi_key_env = \"KEY_0\"\nbase_url = \"{base}\"\n\n{chain}"));
    s
}

const HEADROOM: &str = "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"headroom\"\n";

/// A reload is judged as a start would judge the file — with the command
/// line's overrides — and more: it cannot leave a listener beyond loopback
/// without client keys, drop the admin token, or empty the chain. Each is
/// refused with the reason (to the admin POST, in /status and the log), and
/// the gateway keeps what it ran: a request without a key is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_would_open_or_weaken_the_gateway_is_refused() {
    let dir = tempdir::Dir::new("guarded-reload");
    let path = dir.0.join("poolgate.toml");
    let base = "http://127.0.0.1:9";
    std::fs::write(&path, guarded_config(base, true, true, HEADROOM)).unwrap();
    let env = [("KEY_0", "key-0"), ("PG_ADMIN", ADMIN), ("ALICE_KEY", "alice-key"), ("CI_KEY", "ci-key")];
    // Beyond loopback: in a network namespace of its own.
    let gw = Gateway::start_in_netns(&path, &env, dir);
    let auth = format!("authorization: Bearer {ADMIN}");
    let no_key = ["-X", "POST", "-H", "content-type: application/json", "-d", "{}"];
    assert_eq!(gw.curl(&no_key, "/v1/messages").0, 401);
    let reload = |gw: &Gateway| gw.curl(&["-X", "POST", "-H", &auth], "/admin/reload");

    // Every client key removed: refused, naming the key and the address.
    std::fs::write(&path, guarded_config(base, false, true, HEADROOM)).unwrap();
    let (status, body) = reload(&gw);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("server.client_keys") && body.contains("10.9.0.1"), "{body}");
    assert_eq!(gw.curl(&no_key, "/v1/messages").0, 401, "the gateway stays closed");
    // The same by SIGHUP (and by the file watcher, which saw the write).
    std::process::Command::new("kill").args(["-HUP", &gw.pid().to_string()]).status().unwrap();
    support::eventually("SIGHUP's refusal in the log", Duration::from_secs(10), async || {
        gw.log().contains("trigger=\"sighup\"") || gw.log().contains("trigger=sighup")
    })
    .await;
    assert_eq!(gw.curl(&no_key, "/v1/messages").0, 401, "the gateway stays closed");
    let (_, st) = gw.curl(&["-H", &auth], "/status");
    let st: Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["config"]["last_reload"]["ok"], false, "{st}");
    assert_eq!(st["config"]["generation"], 1, "{st}");

    // The admin token dropped: refused.
    std::fs::write(&path, guarded_config(base, true, false, HEADROOM)).unwrap();
    let (status, body) = reload(&gw);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("admin token"), "{body}");

    // `chain = []`: refused, naming the key; the default chain never slips in.
    std::fs::write(&path, guarded_config(base, true, true, "[policy]\nchain = []\n")).unwrap();
    let (status, body) = reload(&gw);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("policy.chain: an empty chain ranks nothing"), "{body}");
    let (_, st) = gw.curl(&["-H", &auth], "/status");
    let st: Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["chain"].as_array().map(|c| c.len()), Some(1), "{st}");

    // A good file still reloads, and the log says what changed in words.
    let mut good = guarded_config(base, true, true, HEADROOM);
    good = good.replacen("\n[[server.client_keys]]\nname = \"ci\"\nkey_env = \"CI_KEY\"\n", "", 1);
    good.push_str("[policy.chain.config]\nfloor = 0.05\n");
    std::fs::write(&path, good).unwrap();
    let (status, body) = reload(&gw);
    assert_eq!(status, 200, "{body}");
    // (The file watcher may have applied the same change first; either
    // reload's line says it. The log is read from the child's stderr by
    // another thread: wait for the line rather than race it.)
    let said = |log: &str, what: &str| log.lines().any(|l| l.contains("configuration reloaded") && l.contains(what));
    let both = |log: &str| {
        said(log, "client keys 2 → 1 (removed ci)") && said(log, "stage `headroom`: options changed (floor)")
    };
    let started = poolgate::clock::machine_instant();
    while !both(&gw.log()) && started.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let log = gw.log();
    assert!(both(&log), "{log}");
    // The file's listen differs from --listen, which every reload re-applies.
    assert!(!log.contains("server.listen"), "--listen is re-applied on reload:\n{log}");
    assert_eq!(gw.curl(&no_key, "/v1/messages").0, 401);
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A reload warns that `server.listen` changed (it takes effect only at the
/// next restart) when the file's address really changed — and only then:
/// with `--listen`, which every reload re-applies, the file's own address is
/// not in force, and a reload says nothing of it (see the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_warns_of_a_new_listen_address_only_when_it_really_changed() {
    let mock = MockUpstream::start().await;
    mock.account("key-0");
    let dir = tempdir::Dir::new("listen-change");
    let path = dir.0.join("poolgate.toml");
    let (first, second) = (free_port(), free_port());
    let file = |port: u16| {
        let mut c = guarded_config(&mock.base_url(), false, true, HEADROOM);
        c = c.replace("listen = \"127.0.0.1:1\"", &format!("listen = \"127.0.0.1:{port}\""));
        assert!(c.contains(&format!(":{port}\"")), "{c}");
        c
    };
    std::fs::write(&path, file(first)).unwrap();
    let gw = Gateway::start_file_as_written(&path, &[("KEY_0", "key-0"), ("PG_ADMIN", ADMIN)], dir);
    assert_eq!(gw.url, format!("http://127.0.0.1:{first}"));
    let reload = async || {
        let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    };
    let warned = |log: &str| log.lines().any(|l| l.contains("server.listen") && l.contains("next restart"));
    // The same address: nothing to warn of.
    reload().await;
    assert!(!warned(&gw.log()), "{}", gw.log());
    // A new one: warned, and the gateway stays where it listens.
    std::fs::write(&path, file(second)).unwrap();
    reload().await;
    // The log is written off the request path: the line may land just after
    // the reload's answer.
    support::eventually("a warning for the new listen address", Duration::from_secs(10), async || warned(&gw.log()))
        .await;
    let st = status(&gw.url).await;
    assert_eq!(st["config"]["last_reload"]["ok"], true, "{st}");
}
