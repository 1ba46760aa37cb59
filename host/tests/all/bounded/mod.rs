//! Waiting, with a limit. A test that starts a child process waits for it at
//! most so long, then kills it (and everything it started) and fails saying
//! what it was running; a test that waits for a condition polls it, with a
//! limit, instead of sleeping a fixed time and hoping. It needs nothing but
//! std, so any crate's tests can include it (`#[path]`).
#![allow(
    clippy::disallowed_methods,
    reason = "bounded polls on a test's own thread: sleeping between looks is the point"
)]

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// [`Command::output`] with a time limit.
pub trait OutputWithin {
    /// Runs the command to its end, capturing stdout and stderr; past `limit`
    /// it is killed with its whole process group and the test fails.
    fn output_within(&mut self, limit: Duration) -> Output;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> Output {
        let what = format!("{self:?}");
        let mut child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a shell's children die with it.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let drain = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = pipe.read_to_end(&mut out);
                out
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()));
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        let started = machine_now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for a child") {
                break status;
            }
            if started.elapsed() > limit {
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
                let _ = child.wait();
                let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
                let tail: String = err.chars().rev().take(4000).collect::<Vec<_>>().into_iter().rev().collect();
                panic!("{what} was still running after {limit:?} and was killed; its stderr ended:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() }
    }
}

/// Polls `ready` every 10 ms until it holds; fails the test naming `what`
/// once `limit` has passed. (`support::eventually` is its async twin.)
pub fn eventually_blocking(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let started = machine_now();
    while !ready() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The machine's monotonic time. This helper is shared with the SDK's tests,
/// which do not link poolgate (and its `clock::machine_instant`).
fn machine_now() -> std::time::Instant {
    #[allow(clippy::disallowed_methods, reason = "a child process is timed by the machine's clock")]
    std::time::Instant::now()
}
