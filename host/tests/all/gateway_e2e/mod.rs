//! The gateway end to end: the real `poolgate` binary in front of the mock
//! Anthropic upstream, driven over HTTP.
//!
//! By concern: `routing` (failover, parking, streams, queues, why an account
//! was passed over), `headers` (what crosses the gateway and what it answers
//! itself) and `shutdown` (draining, signals, systemd). The helpers are here.

mod headers;
mod routing;
mod shutdown;

use crate::support;

use std::time::{Duration, Instant};

use poolgate_mock_upstream::{MockUpstream, Quota, Step, Window};
use serde_json::{Value, json};
use support::{Gateway, config, message};

const ADMIN: &str = "admin-token-for-tests";

fn now_s() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn env3() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("KEY_B", "key-b"), ("KEY_C", "key-c"), ("PG_ADMIN", ADMIN)]
}

async fn post(gw: &Gateway, body: &Value) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn status(gw: &Gateway) -> Value {
    gw.admin_json("/status", ADMIN).await
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn exhausted(window: &str) -> Quota {
    let reset = now_s() + 3600;
    let w = Window { utilization: 1.0, status: "rejected".into(), reset_s: reset };
    let ok = Window { utilization: 0.2, status: "allowed".into(), reset_s: reset };
    Quota {
        status: Some("rejected".into()),
        reset_s: Some(reset),
        five_hour: Some(if window == "5h" { w.clone() } else { ok.clone() }),
        seven_day: Some(if window == "7d" { w } else { ok }),
        ..Default::default()
    }
}

/// Streams a request to `path` of the gateway at `url` (on a connection of its
/// own); the text it got, and when it ended.
fn stream(url: &str, path: &str, body: Value) -> tokio::task::JoinHandle<(String, Instant)> {
    let url = format!("{url}{path}");
    tokio::spawn(async move {
        let r = Gateway::client().post(url).header("anthropic-version", "2023-06-01").json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap_or_else(|e| format!("<cut: {e}>"));
        (text, poolgate::clock::machine_instant())
    })
}
