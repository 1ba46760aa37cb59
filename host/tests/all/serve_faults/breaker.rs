//! Hostile guests hot-swapped in under load, and the breaker's probe: a
//! probe whose request goes away, or that finds no free instance, is handed
//! on rather than left half-open.

use super::*;

/// The hostile guests, swapped in one after another under steady load and
/// swapped back out: not one request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_hot_swapped_in_under_load_lose_no_request() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("swap-hostile");
    let path = dir.0.join("poolgate.toml");
    let memories = dir.0.join("many-memories.wasm");
    std::fs::write(&memories, support::hostile_components::many_memories(12, 16)).unwrap();
    let head = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n\
         [[accounts]]\nid = \"a\"\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n\
         [[accounts]]\nid = \"b\"\napi_key_env = \"KEY_B\"\nbase_url = \"{base}\"\n\n",
        base = mock.base_url()
    );
    // A `configure` that loops is cut at this bound, and counted then: a
    // reload away from it must answer before (see below).
    let head = format!("{head}[policy]\nconfigure_timeout_ms = 60000\n\n");
    std::fs::write(&path, format!("{head}[[policy.chain]]\nplugin = \"builtin:headroom\"\n")).unwrap();
    mock.account("key-a");
    mock.account("key-b");
    let gw = Gateway::start_file(&path, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)], dir);

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (url, stop) = (gw.url.clone(), stop.clone());
        tokio::spawn(async move {
            let client = Gateway::client();
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let r = send_message(&client, &url, MODEL).await;
                statuses.push(r.map(|r| r.status().as_u16()).unwrap_or(0));
            }
            statuses
        })
    };
    let guest = misbehave();
    let hostile_options = [
        "fault = \"trap\"",
        "fault = \"sleep\", ms = 10000",
        "fault = \"pass\", observe = \"loop\"",
        "fault = \"pass\", configure = \"sleep-after-first\", ms = 3000",
        "fault = \"state-flood\", bytes = 65536",
        "fault = \"huge-reason\", bytes = 65536",
        "fault = \"print-flood\", bytes = 1048576",
        "fault = \"exit\"",
        "fault = \"log-loop\", bytes = 1048576",
        "fault = \"pass\", configure = \"log-loop-after-first\", bytes = 1048576",
        "fault = \"trap\", every = 2",
    ];
    let mut swaps = Vec::new();
    for options in hostile_options {
        swaps.push(hostile(&guest, options, 25));
        swaps.push("[[policy.chain]]\nplugin = \"builtin:headroom\"\n".to_string());
    }
    swaps.push(hostile(memories.to_str().unwrap(), "", 25));
    // Its timeout is a liveness guard, past the configure bound above (so
    // that a reload which waited for the cut is reported by the order below).
    poolgate::https::install_crypto();
    let reloads = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let mut slowest = Duration::ZERO;
    for (i, stages) in swaps.iter().enumerate() {
        let cut_before = hostile_configure_failures(&gw).await;
        std::fs::write(&path, format!("{head}{stages}")).unwrap();
        let took = poolgate::clock::machine_instant();
        let r = reloads.post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await;
        let r = r.unwrap_or_else(|e| panic!("swap {i}: {e}:\n{}", gw.log()));
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(json!({}));
        assert_eq!(status, 200, "swap {i} refused: {body}\n{}", gw.log());
        slowest = slowest.max(took.elapsed());
        // A reload away from a plugin whose `configure` is slow or loops must
        // not wait for it (nor for a file-watch reload of the same file that
        // rebuilt it): unchanged stages are kept, never configured again.
        // Shown by order: the looping `configure` is still running, not yet
        // cut and counted, when the reload away from it has answered.
        if i > 0 && swaps[i - 1].contains("configure = ") {
            assert_eq!(
                hostile_configure_failures(&gw).await,
                cut_before,
                "swap {i} answered only after the configure it left was cut:\n{}",
                gw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("{} swaps, the slowest answered in {slowest:?}", swaps.len());
    stop.store(true, Ordering::Release);
    let statuses = load.await.unwrap();
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert!(statuses.len() >= 100, "only {} requests", statuses.len());
    assert_eq!(failed, 0, "{failed} of {} requests failed during the swaps", statuses.len());
}

/// A model it answers slowly (`slow_model`).
const SLOW: &str = "claude-sonnet-4-5";

/// Sends `FINE` requests until the hostile stage ranks one (reason `reversed`)
/// or `within` passes; whether it did.
async fn ranked_again(gw: &Gateway, within: Duration) -> bool {
    let client = Gateway::client();
    let started = poolgate::clock::machine_instant();
    while started.elapsed() < within {
        let r = send_message(&client, &gw.url, FINE).await.unwrap();
        assert_eq!(r.status(), 200);
        if header(&r, "x-poolgate-reason") == "reversed" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The breaker's probe rides on a request whose client goes away mid-call: the
/// request's future is dropped with the probe in it. The probe must come back,
/// so that the next request probes the (healthy) stage and closes the breaker
/// — not leave it half-open and bypassed until the next reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_probe_whose_request_goes_away_hands_the_probe_on() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy.breaker]\nfailures = 3\ncooldown_ms = 300\nmax_cooldown_ms = 300\n\n\
         [[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\ntimeout_ms = 400\n\
         config = {{ fault = \"trap\", on_model = \"{MODEL}\", slow_model = \"{SLOW}\", ms = 300 }}\n",
        misbehave()
    );
    let gw = start(&mock, tempdir::Dir::new("probe-cancel"), &stages);
    let client = Gateway::client();
    for _ in 0..3 {
        assert_eq!(send_message(&client, &gw.url, MODEL).await.unwrap().status(), 200);
    }
    assert_eq!(hostile_stage(&gw).await["breaker"]["state"], "open");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The probe: a request the plugin takes 300 ms over (within its 500 ms
    // budget), whose client leaves after 100 ms.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(100)).build().unwrap();
    assert!(send_message(&impatient, &gw.url, SLOW).await.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        ranked_again(&gw, Duration::from_secs(3)).await,
        "the stage stayed bypassed after its probe's request went away: {:#}",
        hostile_stage(&gw).await
    );
    let stage = hostile_stage(&gw).await;
    assert_eq!(stage["breaker"]["state"], "closed", "{stage:#}");
    assert_eq!(stage["breaker"]["trips"], 1, "the lost probe counted as no failure: {stage:#}");
}

/// The probe finds no free instance: every instance was thrown away by the
/// failures that opened the breaker, and rebuilding takes a while (a slow
/// `configure`). That is a `busy` skip, not the plugin's fault: the probe
/// passes to a later request, which closes the breaker once an instance is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_probe_that_finds_no_free_instance_hands_the_probe_on() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy]\ninstances = 3\n\n\
         [policy.breaker]\nfailures = 3\ncooldown_ms = 300\nmax_cooldown_ms = 300\n\n\
         [[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\n\
         config = {{ fault = \"trap\", on_model = \"{MODEL}\", configure = \"sleep-after-first\", ms = 1000 }}\n",
        misbehave()
    );
    let gw = start(&mock, tempdir::Dir::new("probe-busy"), &stages);
    let started = poolgate::clock::machine_instant();
    while hostile_stage(&gw).await["idle_instances"] != 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "the pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Three traps throw away all three instances and open the breaker; each
    // replacement takes a second to build.
    let client = Gateway::client();
    for _ in 0..3 {
        assert_eq!(send_message(&client, &gw.url, MODEL).await.unwrap().status(), 200);
    }
    assert_eq!(hostile_stage(&gw).await["breaker"]["state"], "open");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(
        ranked_again(&gw, Duration::from_secs(5)).await,
        "the stage stayed bypassed after its probe found no instance: {:#}",
        hostile_stage(&gw).await
    );
    let d = decisions(&gw).await;
    assert!(rank_errors(&d).iter().any(|(c, _)| c == "busy"), "a probe met the empty pool: {:?}", rank_errors(&d));
    let stage = hostile_stage(&gw).await;
    assert_eq!((stage["breaker"]["state"].as_str(), stage["breaker"]["trips"].as_u64()), (Some("closed"), Some(1)));
}
