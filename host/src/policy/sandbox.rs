//! The sandbox a plugin instance runs in: its store data, the host interface it may
//! call, its memory limiter, and WASI with nothing granted.
//!
//! WASI is linked only because language runtimes (Rust's std, CPython, the JS
//! engine) import it to start. The context has no preopened directories, no
//! environment, no arguments, no network and no name lookup; its clocks and
//! polls are the asynchronous ones, so a guest that sleeps waits on a timer that
//! the call's wall-clock bound cuts short, never on a host thread. stdout and
//! stderr go to bounded buffers (see [`super::stdio`]).
//!
//! Epoch interruption and the call's bounds act *between* host calls, so what
//! one host call may cost is bounded here, by its size: a call may pass the
//! host at most [`super::limiter::MAX_HOSTCALL_BYTES`] (wasmtime's hostcall fuel, counted
//! before anything is copied: a log line, a state key or value, a stdout or
//! stderr write, the answer of `rank`), and may ask `wasi:random` for at most
//! [`MAX_RANDOM_BYTES`]. Past either, the call traps with a message naming the
//! limit. Measured in a release build (docs/benchmarks.md, "One host call,
//! bounded"): one 60 MiB stdout write held a worker 56 ms and one 64 MiB
//! `get-random-bytes` half a second; a call at these limits takes 0.06 ms and
//! 0.2 ms.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{Level, poolgate};
use super::fault::{LastWords, escape_controls};
use super::limiter::{Limiter, MAX_RANDOM_BYTES};
use super::names;
use super::state::{MAX_KEY_BYTES, StateStore};
use super::stdio::{LogBudget, MAX_LINE_BYTES, StdioBuffer, tail, truncate};

/// Log lines a plugin may write per call before the host drops the rest.
const MAX_LOGS_PER_CALL: u32 = 32;
/// Entries of an instance's WASI resource table (streams, pollables): a guest
/// that creates them in a loop must not grow host memory without bound. A
/// pollable takes two entries, so about 2,040 pollables fit.
const MAX_RESOURCES: usize = 4096;
/// What a sandbox is built from: shared by every instance of one plugin.
#[derive(Clone)]
pub struct SandboxSpec {
    /// The plugin's label, for log lines.
    pub plugin: Arc<str>,
    /// The state scope.
    pub scope: Arc<str>,
    /// Where plugin state lives.
    pub state: Arc<dyn StateStore>,
    /// Memory cap of one instance, bytes (all memories and tables together).
    pub memory_bytes: usize,
    /// The plugin's log allowance.
    pub logs: Arc<LogBudget>,
    /// How old a quota reading may be and still count as fresh, ms (what
    /// `host.freshness-ms` answers).
    pub freshness_ms: u64,
}

/// Per-instance store data.
pub struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    stdout: StdioBuffer,
    stderr: StdioBuffer,
    spec: SandboxSpec,
    /// The current call's request: its id and clock.
    request_id: u64,
    now_ms: u64,
    logs_this_call: u32,
    /// The last error-level line logged during this call: what a guest whose
    /// export cannot return an error (`observe`) says before it traps.
    said: Option<String>,
}

impl Sandbox {
    /// A fresh sandbox.
    pub fn new(spec: SandboxSpec) -> Self {
        let (stdout, stderr) = (StdioBuffer::default(), StdioBuffer::default());
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        Sandbox {
            wasi,
            table,
            limiter: Limiter::new(spec.memory_bytes),
            stdout,
            stderr,
            spec,
            request_id: 0,
            now_ms: 0,
            logs_this_call: 0,
            said: None,
        }
    }

    /// Prepares for a call on behalf of request `request_id` at `now_ms`.
    pub fn begin_call(&mut self, request_id: u64, now_ms: u64) {
        self.request_id = request_id;
        self.now_ms = now_ms;
        self.logs_this_call = 0;
        self.said = None;
        self.limiter.denied = false;
    }

    /// Turns whatever the guest printed during the call into log lines, and
    /// returns what explains a trap: the last lines it wrote to stderr, else
    /// the last error-level line it logged (for a fault's message).
    pub fn flush_stdio(&mut self) -> Option<LastWords> {
        let said = self.said.take();
        let out = self.stdout.take();
        let err = self.stderr.take();
        for bytes in [&out, &err] {
            if bytes.is_empty() {
                continue;
            }
            for line in String::from_utf8_lossy(bytes).lines().filter(|l| !l.trim().is_empty()) {
                self.emit(Level::Info, &format!("guest stdio: {line}"));
            }
        }
        tail(&err).map(|text| LastWords { text, logged: false }).or(said.map(|text| LastWords { text, logged: true }))
    }

    /// One log line, if the plugin's allowance has room. Line breaks and other
    /// control characters are escaped: a plugin must not be able to write a
    /// line that looks like one of the gateway's own.
    fn emit(&self, level: Level, message: &str) {
        let Some(dropped) = self.spec.logs.admit() else { return };
        let msg = escape_controls(truncate(message, MAX_LINE_BYTES));
        let (plugin, request) = (&*self.spec.plugin, self.request_id);
        if dropped > 0 {
            tracing::warn!(plugin, dropped, "plugin log lines dropped (over the rate limit)");
        }
        match level {
            Level::Trace => tracing::trace!(plugin, request, "{msg}"),
            Level::Debug => tracing::debug!(plugin, request, "{msg}"),
            Level::Info => tracing::info!(plugin, request, "{msg}"),
            Level::Warn => tracing::warn!(plugin, request, "{msg}"),
            Level::Error => tracing::error!(plugin, request, "{msg}"),
        }
    }
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl poolgate::policy::types::Host for Sandbox {}

impl poolgate::policy::host::Host for Sandbox {
    fn log(&mut self, level: Level, message: String) {
        self.logs_this_call += 1;
        if matches!(level, Level::Error) {
            self.said = Some(truncate(&message, MAX_LINE_BYTES).to_string());
        }
        if self.logs_this_call > MAX_LOGS_PER_CALL {
            return;
        }
        self.emit(level, &message);
    }

    fn state_get(&mut self, key: String) -> Option<String> {
        // No key that long can be stored; do not make the store hash it.
        if key.len() > MAX_KEY_BYTES {
            return None;
        }
        self.spec.state.get(&self.spec.scope, &key, self.now_ms)
    }

    fn state_set(&mut self, key: String, value: String, ttl_ms: Option<u64>) {
        self.spec.state.set(&self.spec.scope, &key, &value, ttl_ms, self.now_ms)
    }

    fn state_delete(&mut self, key: String) {
        if key.len() <= MAX_KEY_BYTES {
            self.spec.state.delete(&self.spec.scope, &key)
        }
    }

    fn state_limit(&mut self, max_entries: u32) {
        self.spec.state.limit(&self.spec.scope, max_entries)
    }

    fn window_name(&mut self, name: u32) -> String {
        names::resolve(name).to_string()
    }

    fn freshness_ms(&mut self) -> u64 {
        self.spec.freshness_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_cannot_forge_a_log_line() {
        let forged = "innocent\n2026-12-01T00:00:00Z ERROR poolgate::gateway: FORGED\r\x1b[31m\u{2028}\u{202e}";
        let out = escape_controls(forged);
        assert!(!out.chars().any(super::super::fault::is_unsafe_in_log), "{out}");
        assert!(out.starts_with("innocent\\n2026"), "{out}");
        assert!(matches!(escape_controls("plain"), std::borrow::Cow::Borrowed(_)));
    }
}
