//! The mixed-language chain (Python filter → Rust built-in → C filter →
//! JavaScript tie-breaker) serving real requests through the gateway binary.

use crate::example_plugins;
use crate::support;

use poolgate_mock_upstream::{MockUpstream, Quota, Window};
use support::{Gateway, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_four_languages_serves_requests_through_the_gateway() {
    let examples = tokio::task::spawn_blocking(example_plugins::build_all_examples).await.unwrap();
    let wasm = |lang: &str| examples.iter().find(|b| b.lang.dir_name() == lang).unwrap().wasm.display().to_string();
    let mock = MockUpstream::start().await;
    let reset = poolgate_mock_upstream::now_s() + 3600;
    // hot: over the Python filter's 90%; warm: over the C filter's 70%;
    // cool and fresh pass both, cool resets sooner.
    for (key, used, reset_s) in
        [("key-hot", 0.95, reset), ("key-warm", 0.8, reset), ("key-cool", 0.3, reset - 600), ("key-fresh", 0.1, reset)]
    {
        mock.account(key).set_quota(Quota {
            status: Some("allowed".into()),
            five_hour: Some(Window { utilization: used, status: "allowed".into(), reset_s }),
            seven_day: Some(Window { utilization: 0.2, status: "allowed".into(), reset_s: reset + 86_400 }),
            ..Default::default()
        });
    }
    let mut cfg = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n[policy]\ncache_dir = {:?}\n\n",
        example_plugins::compile_cache_dir().display().to_string()
    );
    cfg.push_str(&format!(
        "[[policy.chain]]\nname = \"python-filter\"\nplugin = {:?}\ntimeout_ms = 50\nconfig = {{ max_utilization = 0.9, sort = false }}\n\n\
         [[policy.chain]]\nname = \"headroom\"\nplugin = \"builtin:headroom\"\n\n\
         [[policy.chain]]\nname = \"c-filter\"\nplugin = {:?}\nconfig = {{ max_utilization = 0.7, sort = false }}\n\n\
         [[policy.chain]]\nname = \"js-tie-breaker\"\nplugin = {:?}\ntimeout_ms = 50\n\n",
        wasm("python"),
        wasm("c"),
        wasm("js")
    ));
    for id in ["hot", "warm", "cool", "fresh"] {
        cfg.push_str(&format!(
            "[[accounts]]\nid = \"{id}\"\napi_key_env = \"KEY_{id}\"\nbase_url = \"{}\"\n\n",
            mock.base_url()
        ));
    }
    let env = [
        ("KEY_hot", "key-hot"),
        ("KEY_warm", "key-warm"),
        ("KEY_cool", "key-cool"),
        ("KEY_fresh", "key-fresh"),
        ("PG_ADMIN", "mixed"),
    ];
    let gw = tokio::task::spawn_blocking(move || Gateway::start(&cfg, &env)).await.unwrap();

    // The first four requests teach the gateway each account's quota.
    for _ in 0..4 {
        let r = Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .json(&message("claude-sonnet-4-5", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    for stream in [false, true, false, true] {
        let r = Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .json(&message("claude-sonnet-4-5", stream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", gw.log());
        assert_eq!(r.headers()["x-poolgate-account"], "cool", "soonest 5h reset among those the filters keep");
        assert_eq!(r.headers()["x-poolgate-reason"], "reset_soonest");
        let _ = r.bytes().await.unwrap();
    }
    let d = gw.admin_json("/admin/decisions?limit=1", "mixed").await;
    let decision = &d[0]["attempts"][0]["decision"];
    assert_eq!(decision["policy_errors"].as_array().unwrap().len(), 0, "{decision:#}");
    let stages: Vec<&str> =
        decision["stages"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
    assert_eq!(stages, ["python-filter", "headroom", "c-filter", "js-tie-breaker"]);
    let kept = |i: usize| {
        decision["stages"][i]["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert!(!kept(0).contains(&"hot".into()), "Python dropped hot: {:?}", kept(0));
    assert!(!kept(2).contains(&"warm".into()), "C dropped warm: {:?}", kept(2));
}
