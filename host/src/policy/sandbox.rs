//! The sandbox a plugin instance runs in: its store data, the host interface it may
//! call, a memory limiter, and WASI with nothing granted.
//!
//! WASI is linked only because a Rust `wasm32-wasip2` guest's std imports it. The
//! context has no preopened directories, no environment, no arguments, no network
//! and no name lookup; stdout and stderr go to a bounded buffer that the host turns
//! into log lines after each call.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{Level, poolgate};
use super::names;
use super::state::StateStore;

/// Longest log message kept; the rest is cut.
const MAX_LOG_BYTES: usize = 1000;
/// Log lines a plugin may write per call before the host drops the rest.
const MAX_LOGS_PER_CALL: u32 = 32;
/// Captured stdio kept per call.
const MAX_STDIO_BYTES: usize = 8 * 1024;

/// Per-instance store data.
pub struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    stdio: StdioBuffer,
    state: Arc<dyn StateStore>,
    /// The plugin's label, for log lines.
    plugin: Arc<str>,
    /// The state scope.
    scope: Arc<str>,
    /// The current call's request: its id and clock.
    request_id: u64,
    now_ms: u64,
    logs_this_call: u32,
}

impl Sandbox {
    pub fn new(plugin: Arc<str>, scope: Arc<str>, state: Arc<dyn StateStore>, memory_bytes: usize) -> Self {
        let stdio = StdioBuffer::default();
        let wasi = WasiCtx::builder()
            .stdout(stdio.clone())
            .stderr(stdio.clone())
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        Sandbox {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter::new(memory_bytes),
            stdio,
            state,
            plugin,
            scope,
            request_id: 0,
            now_ms: 0,
            logs_this_call: 0,
        }
    }

    /// Prepares for a call on behalf of request `request_id` at `now_ms`.
    pub fn begin_call(&mut self, request_id: u64, now_ms: u64) {
        self.request_id = request_id;
        self.now_ms = now_ms;
        self.logs_this_call = 0;
        self.limiter.denied = false;
    }

    /// Turns whatever the guest printed during the call into log lines.
    pub fn flush_stdio(&mut self) {
        let bytes = std::mem::take(&mut *self.stdio.0.lock());
        if bytes.is_empty() {
            return;
        }
        for line in String::from_utf8_lossy(&bytes).lines().filter(|l| !l.trim().is_empty()) {
            tracing::info!(plugin = %self.plugin, request = self.request_id, "guest stdio: {line}");
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
        if self.logs_this_call > MAX_LOGS_PER_CALL {
            return;
        }
        let msg = truncate(&message, MAX_LOG_BYTES);
        let (plugin, request) = (&*self.plugin, self.request_id);
        match level {
            Level::Trace => tracing::trace!(plugin, request, "{msg}"),
            Level::Debug => tracing::debug!(plugin, request, "{msg}"),
            Level::Info => tracing::info!(plugin, request, "{msg}"),
            Level::Warn => tracing::warn!(plugin, request, "{msg}"),
            Level::Error => tracing::error!(plugin, request, "{msg}"),
        }
    }

    fn state_get(&mut self, key: String) -> Option<String> {
        self.state.get(&self.scope, &key, self.now_ms)
    }

    fn state_set(&mut self, key: String, value: String, ttl_ms: Option<u64>) {
        self.state.set(&self.scope, &key, &value, ttl_ms, self.now_ms)
    }

    fn state_delete(&mut self, key: String) {
        self.state.delete(&self.scope, &key)
    }

    fn state_limit(&mut self, max_entries: u32) {
        self.state.limit(&self.scope, max_entries)
    }

    fn window_name(&mut self, name: u32) -> String {
        names::resolve(name).to_string()
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Caps linear memory, tables and instances; remembers a refused memory growth so
/// the trap that usually follows is reported as `oom`.
pub struct Limiter {
    memory_bytes: usize,
    pub(crate) denied: bool,
}

impl Limiter {
    fn new(memory_bytes: usize) -> Self {
        Limiter { memory_bytes, denied: false }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.denied = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }

    // componentize-py needs 38 core instances; leave room above that.
    fn instances(&self) -> usize {
        64
    }
    fn tables(&self) -> usize {
        64
    }
    fn memories(&self) -> usize {
        64
    }
}

/// A bounded buffer that stands in for the guest's stdout and stderr. Writes past
/// the bound are dropped, never refused: a chatty guest must not trap for it.
#[derive(Clone, Default)]
struct StdioBuffer(Arc<Mutex<Vec<u8>>>);

impl IsTerminal for StdioBuffer {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StdioBuffer {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl StdioBuffer {
    fn append(&self, bytes: &[u8]) {
        let mut buf = self.0.lock();
        let room = MAX_STDIO_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

impl OutputStream for StdioBuffer {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for StdioBuffer {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for StdioBuffer {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
