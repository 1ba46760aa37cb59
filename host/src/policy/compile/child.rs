//! The compile that runs in a child process (`poolgate __compile-plugin`):
//! the component's bytes go in on stdin, the precompiled artifact comes out
//! on stdout, and a child that overstays its budget is killed — so a compile
//! that runs away (a hostile or huge component) costs a process, never the
//! gateway's memory or threads.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use wasmtime::Engine;

use super::SUBCOMMAND;

/// The compiler process could not be started (the compile itself did not run).
#[derive(Debug)]
pub(super) struct Spawn(std::io::Error);

impl std::fmt::Display for Spawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot start the compiler process: {}", self.0)
    }
}

impl std::error::Error for Spawn {}

/// `Ok(None)`: the child ran out of time and was killed.
pub(super) fn precompile_in_child(exe: &Path, bytes: &[u8], label: &str, timeout: Duration) -> Result<Option<Vec<u8>>> {
    let mut child = Command::new(exe)
        .arg(SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::Error::new(Spawn(e)))?;
    let mut stdin = child.stdin.take().context("child stdin")?;
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let mut stdout = child.stdout.take().context("child stdout")?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).map(|_| out)
    });
    let mut stderr = child.stderr.take().context("child stderr")?;
    let errors = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stderr.by_ref().take(64 * 1024).read_to_string(&mut out);
        out
    });
    let started = crate::clock::machine_instant();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        #[allow(
            clippy::disallowed_methods,
            reason = "runs off the async workers (the builder thread or the CLI), polling a child process"
        )]
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    let out = reader.join().map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        let why = errors.trim();
        bail!(
            "{label} is not a valid WebAssembly component: {}",
            if why.is_empty() { "the compiler failed" } else { why }
        );
    }
    Ok(Some(out))
}

/// The child side: reads a component from stdin, writes its compiled form to
/// stdout. Runs at a lower CPU priority than the gateway serving requests.
pub fn run_child(engine: &Engine) -> std::process::ExitCode {
    // SAFETY: nice(2) only changes this process's scheduling priority.
    unsafe {
        libc::nice(10);
    }
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("cannot read the component: {e}");
        return std::process::ExitCode::FAILURE;
    }
    match engine.precompile_component(&input) {
        Ok(out) => match std::io::stdout().write_all(&out) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannot write the compiled component: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("{}", format!("{e:#}").lines().next().unwrap_or("invalid component"));
            std::process::ExitCode::FAILURE
        }
    }
}
