//! The chaos run of `bench/chaos`, for a minute, in CI: the real binary, two
//! replicas on one Redis, a mixed workload of every route and shape, and
//! every fault together — upstream storms, cuts and refusals, seat token
//! outages and revoked logins, an exhausted pool and a failing fallback, hot
//! swaps to hostile and invalid plugins, reloads every 3 s, Redis killed.
//! The run's own verdict must hold: 0 requests failed while an account or
//! the fallback could serve, 0 broken streams, 0 panics, every reload doing
//! what it must. The longer run is `cargo run -p poolgate-chaos --release`
//! (docs/reliability.md).

use std::time::Duration;

use poolgate_chaos::{Settings, run};

use crate::common;
use crate::support::tempdir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_of_every_fault_together_fails_no_request_an_account_could_serve() {
    let dir = tempdir::Dir::new("chaos");
    let settings = Settings {
        gateway: env!("CARGO_BIN_EXE_poolgate").into(),
        duration: Duration::from_secs(60),
        clients: 8,
        replicas: 2,
        seed: 29,
        hostile_plugin: Some(common::guest("misbehave").into()),
        dir: dir.0.clone(),
    };
    let report = run(&settings).await.expect("the chaos run starts");
    eprintln!("{report}");
    let verdict = report.verdict();
    assert!(verdict.is_empty(), "{}\n{report}", verdict.join("; "));
    // Each kind of fault was injected at least once in a minute.
    for kind in ["429 storm, unified", "cut mid-stream", "pool exhausted", "redis killed and restarted"] {
        assert!(report.faults.keys().any(|k| k.starts_with(kind)), "no `{kind}` injected:\n{report}");
    }
    assert!(report.clean_cuts + report.json_cuts > 0, "a cut reached a client:\n{report}");
}
