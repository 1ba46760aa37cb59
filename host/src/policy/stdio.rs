//! Where a plugin's words go: its stdout and stderr, and its `log` calls.
//!
//! A guest must never be able to block the host or fill its memory by talking,
//! so every path is bounded: stdio lands in a per-call buffer that drops what
//! exceeds its cap (writes never fail and never wait), and the lines that reach
//! the log pass a per-plugin rate limit shared by all its instances. What a guest
//! wrote to stderr last is kept so that a trap's recorded cause can say why
//! (a Rust panic prints its message and location there before it aborts).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Captured stdio kept per call (each stream); the rest is dropped.
pub const MAX_STDIO_BYTES: usize = 8 * 1024;
/// Longest log line kept; the rest is cut.
pub const MAX_LINE_BYTES: usize = 1000;
/// Lines per second a plugin may log (all instances together), after the burst.
pub const LINES_PER_SECOND: f64 = 50.0;
/// Lines a plugin may log at once before the rate applies.
pub const LINE_BURST: f64 = 200.0;
/// Lines of stderr attached to a trap's cause.
const STDERR_TAIL_LINES: usize = 4;

/// A bounded buffer that stands in for one of the guest's output streams.
#[derive(Clone, Default)]
pub struct StdioBuffer(Arc<Buffer>);

#[derive(Default)]
struct Buffer {
    bytes: Mutex<Vec<u8>>,
    /// Whether anything was written since the last take (checked without the
    /// lock after every call: most calls write nothing).
    written: AtomicBool,
    /// Writes waited for so far (see `ready`).
    waits: AtomicU32,
}

/// A guest that prints in a loop spends its time in host calls, which burn no
/// fuel, so it would rarely reach a yield point: every this many writes, the
/// stream makes it yield to the executor instead.
const WRITES_PER_YIELD: u32 = 32;

impl StdioBuffer {
    fn append(&self, bytes: &[u8]) {
        let mut buf = self.0.bytes.lock();
        let room = MAX_STDIO_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.0.written.store(true, Ordering::Release);
    }

    /// Takes what was written since the last take.
    pub fn take(&self) -> Vec<u8> {
        if !self.0.written.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.0.bytes.lock())
    }
}

/// The last lines of `bytes` that say something: blank lines and Rust's
/// "note: run with `RUST_BACKTRACE=1`" hint are left out.
pub fn tail(bytes: &[u8]) -> Option<String> {
    // Nearly every call writes nothing: then there is nothing to scan.
    if bytes.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let keep = &lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..];
    (!keep.is_empty()).then(|| keep.join(" "))
}

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
    async fn ready(&mut self) {
        if self.0.waits.fetch_add(1, Ordering::Relaxed) % WRITES_PER_YIELD == WRITES_PER_YIELD - 1 {
            // A yield, marked as one: the time until the call resumes is the
            // scheduler's, not the plugin's (see `bounded`).
            super::bounded::yield_now().await;
        }
    }
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

/// A plugin's log allowance: a token bucket shared by all its instances, so a
/// chatty plugin costs a bounded number of log lines per second however many
/// requests it serves. Dropped lines are counted and reported with the next
/// line that passes.
pub struct LogBudget {
    state: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget { state: Mutex::new(Bucket { tokens: LINE_BURST, at: crate::clock::machine_instant(), dropped: 0 }) }
    }
}

impl LogBudget {
    /// Whether one more line may go out now; `Some(n)` also reports `n` lines
    /// dropped since the last one that went out.
    pub fn admit(&self) -> Option<u64> {
        let mut b = self.state.lock();
        let now = crate::clock::machine_instant();
        let refill = now.duration_since(b.at).as_secs_f64() * LINES_PER_SECOND;
        b.tokens = (b.tokens + refill).min(LINE_BURST);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Some(std::mem::take(&mut b.dropped))
        } else {
            b.dropped += 1;
            None
        }
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_keeps_a_panic_message_and_its_location() {
        let stderr = b"\nthread '<unnamed>' panicked at src/lib.rs:47:24:\nmisbehave: deliberate panic\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            tail(stderr).unwrap(),
            "thread '<unnamed>' panicked at src/lib.rs:47:24: misbehave: deliberate panic"
        );
        assert_eq!(tail(b"\n\n"), None);
    }

    #[test]
    fn the_buffer_drops_what_exceeds_its_cap() {
        let b = StdioBuffer::default();
        b.append(&vec![b'x'; MAX_STDIO_BYTES * 3]);
        assert_eq!(b.take().len(), MAX_STDIO_BYTES);
        assert!(b.take().is_empty());
    }

    #[test]
    fn the_log_budget_allows_a_burst_then_counts_what_it_drops() {
        let budget = LogBudget::default();
        let passed = (0..1000).filter(|_| budget.admit().is_some()).count();
        assert!((LINE_BURST as usize..LINE_BURST as usize + 5).contains(&passed), "{passed}");
        #[allow(clippy::disallowed_methods, reason = "a plain test thread; the budget refills on the real clock")]
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(budget.admit().is_some_and(|dropped| dropped >= 790), "the next line reports the drops");
    }
}
