//! The SDK's doc examples — the ranker on the crate root, the options reader, the
//! JSON reader — are checked by `cargo test --doc`, which `cargo nextest run`
//! does not run. This test runs it, so the suite fails when an example stops
//! compiling (or, for those that run, stops passing).

#[path = "../../host/tests/all/bounded/mod.rs"]
#[allow(dead_code, reason = "the host's test helper, of which this test uses one function")]
mod bounded;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bounded::OutputWithin as _;

#[test]
fn the_doc_examples_compile_and_pass() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["test", "--offline", "--doc", "-p", "poolgate-sdk"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // A target directory of its own: never waits on the outer build's lock.
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdk-doc-examples"))
        // The outer build's flags (coverage, a wrapper) are not for this build.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTDOCFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        // Builds the SDK's doc tests from nothing the first time: minutes at most.
        .output_within(Duration::from_secs(600));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo test --doc -p poolgate-sdk failed:\n{stdout}\n{stderr}");
    // The crate root's ranker is `no_run`: compiled, not run (its host calls
    // are stubs off wasm32). It must be among them.
    assert!(stdout.contains("src/lib.rs - (line") && stdout.contains("compile ... ok"), "{stdout}");
}
