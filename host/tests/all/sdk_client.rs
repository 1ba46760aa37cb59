//! The official Anthropic Python SDK (PyPI `anthropic`) as the client: a plain
//! call, a stream and a streamed tool call through the real gateway binary must
//! parse exactly as they would against Anthropic.

use crate::bounded;

use crate::support;

use std::process::Command;
use std::time::Duration;

use bounded::OutputWithin as _;
use poolgate_mock_upstream::MockUpstream;
use support::{Gateway, config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_python_sdk_works_through_the_gateway() {
    let probe = Command::new("python3").args(["-c", "import anthropic"]).output_within(Duration::from_secs(60));
    assert!(
        probe.status.success(),
        "the Anthropic Python SDK is missing: `python3 -m pip install anthropic==2.14.0` (.ci/run installs it)"
    );
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    mock.account("key-b");
    let gw = Gateway::start(
        &config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""),
        &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", "x")],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/sdk_client.py");
    let url = gw.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3").arg(script).arg(url).output_within(Duration::from_secs(120))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK client failed:\n{stdout}\n{}\ngateway log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.log()
    );
    for check in ["create", "headers", "stream", "tool_stream"] {
        assert!(stdout.contains(&format!("\"check\": \"{check}\"")), "missing {check}:\n{stdout}");
    }
    assert_eq!(mock.requests().len(), 4);
}
