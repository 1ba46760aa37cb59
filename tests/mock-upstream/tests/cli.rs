//! The standalone binary's options that benchmarks lean on: `--stream-deltas`
//! turns every `--credential` into a long streamer (the loadgen's CPU per
//! relayed event), and leaves other credentials answering as usual.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn stream_text(url: &str, key: &str) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body =
        r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30)).build().unwrap();
    let r = http
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

#[tokio::test]
async fn stream_deltas_makes_listed_credentials_stream_that_many_deltas_of_that_size() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_poolgate-mock-upstream"))
        .args(["--listen", "127.0.0.1:0", "--accept-any", "--credential", "long"])
        .args(["--stream-deltas", "9", "--delta-bytes", "18"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let _guard = Killed(child);
    let line = out.lines().next().unwrap().unwrap();
    let url = line.strip_prefix("listening on ").unwrap().to_string();
    let long = stream_text(&url, "long").await;
    let deltas: Vec<&str> = long.lines().filter(|l| l.contains("\"text_delta\"")).collect();
    assert_eq!(deltas.len(), 9, "{long}");
    assert!(deltas.iter().all(|d| d.contains(r#""text":"lorem lorem lorem ""#)), "{long}");
    assert!(long.trim_end().ends_with(r#"data: {"type":"message_stop"}"#));
    let other = stream_text(&url, "someone-else").await;
    assert!(other.contains("text_delta") && !other.contains("lorem"), "{other}");
}
