//! Measures the latency floor of a running mock upstream: N sequential JSON and SSE
//! Messages requests over one keep-alive connection, full body read, percentiles printed.
//! Point it at the server directly to know what the gateway's overhead is measured against.
//!
//! 1. `cargo run --release -p poolgate-mock-upstream -- --accept-any --listen 127.0.0.1:9100`
//! 2. `cargo run --release -p poolgate-mock-upstream --example latency -- http://127.0.0.1:9100 1000`

use std::time::{Duration, Instant};

use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| "http://127.0.0.1:9100".to_owned());
    let n: usize = args.next().map_or(1000, |s| s.parse().expect("N is a number"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().no_proxy().build().expect("client builds");
    for stream in [false, true] {
        let body = json!({
            "model": "claude-sonnet-4-5-20250929",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": stream,
        });
        let mut samples = Vec::with_capacity(n);
        for i in 0..n + n / 10 {
            let started = Instant::now();
            let r = client
                .post(format!("{base}/v1/messages"))
                .header("x-api-key", "bench")
                .json(&body)
                .send()
                .await
                .expect("request succeeds");
            assert!(r.status().is_success(), "status {}", r.status());
            r.bytes().await.expect("body reads");
            // The first tenth warms up the connection and caches.
            if i >= n / 10 {
                samples.push(started.elapsed());
            }
        }
        report(if stream { "sse " } else { "json" }, &mut samples);
    }
}

fn report(label: &str, samples: &mut [Duration]) {
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64;
    println!(
        "{label}: n={} mean={mean:.0}µs p50={:.0}µs p90={:.0}µs p99={:.0}µs max={:.0}µs",
        samples.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
}
