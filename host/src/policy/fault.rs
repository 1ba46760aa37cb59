//! How a stage can fail, and how a wasmtime error is classified.

use serde::Serialize;

/// The cause recorded with `routing_policy_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The guest trapped (panic, `unreachable`, a bad memory access, `exit`, ...).
    Trap,
    /// The call used up its CPU budget or ran past its wall-clock bound.
    Timeout,
    /// No warm instance was free in time: every instance was busy with other
    /// calls (the pool is too small for how long the plugin's calls take) or
    /// being rebuilt. The stage is skipped, but this is not held against the
    /// plugin (its breaker does not count it).
    Busy,
    /// The guest asked for more memory than its cap.
    Oom,
    /// The guest answered, but not with a permutation of a non-empty subset, or
    /// with a reason or detail over its limit.
    InvalidOutput,
    /// The guest returned `Err`, or could not be instantiated or configured.
    Error,
    /// The host itself failed while serving the call (a bug in poolgate or
    /// wasmtime, caught so that the request is still served).
    Host,
    /// The stage's breaker is open: it was not called.
    Bypassed,
}

impl Cause {
    /// The kebab-case name used in decisions, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Trap => "trap",
            Cause::Timeout => "timeout",
            Cause::Busy => "busy",
            Cause::Oom => "oom",
            Cause::InvalidOutput => "invalid-output",
            Cause::Error => "error",
            Cause::Host => "host",
            Cause::Bypassed => "bypassed",
        }
    }

    /// Every cause, for metrics that want a zero for each.
    pub const ALL: [Cause; 8] = [
        Cause::Trap,
        Cause::Timeout,
        Cause::Busy,
        Cause::Oom,
        Cause::InvalidOutput,
        Cause::Error,
        Cause::Host,
        Cause::Bypassed,
    ];
}

/// A failed stage call.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// What kind of failure.
    pub cause: Cause,
    /// A one-line explanation for the operator, safe to log: no control
    /// character, line or paragraph separator or bidirectional override of the
    /// guest's reaches it unescaped (see [`escape_controls`]).
    pub message: String,
    /// Where the named wasm frames begin in `message` (` in f < g`), so that
    /// the guest's last words go before them: what it said explains more than
    /// where it was, and a long message is cut from its end.
    #[serde(skip)]
    frames_at: Option<usize>,
}

/// Longest fault message kept (a guest's `Err` text or its stderr can be long).
pub const MAX_MESSAGE_BYTES: usize = 600;

/// Where a trap happened, innermost first: the names of up to four guest
/// functions on the stack (a C plugin built without `-s`, a Rust one, a
/// language runtime's own), so a trap in `observe` says which function
/// failed. `None` when no frame has a name (a stripped build).
fn named_frames(trace: &wasmtime::WasmBacktrace) -> Option<String> {
    let names: Vec<String> = trace
        .frames()
        .iter()
        .filter_map(|f| f.func_name())
        .take(4)
        .map(|n| escape_controls(truncate_name(n)).into_owned())
        .collect();
    (!names.is_empty()).then(|| names.join(" < "))
}

fn truncate_name(name: &str) -> &str {
    let mut end = name.len().min(120);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// What a guest said last before a trap, which explains it: the last lines it
/// wrote to stderr (a Rust panic's message and location), else the last error
/// it logged (what the Python, JavaScript and C skeletons log before a failed
/// `observe` traps: that export has no way to return an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWords {
    /// The text.
    pub text: String,
    /// Whether it came through `log` rather than stderr.
    pub logged: bool,
}

impl Fault {
    /// A fault of `cause` with `message`, on one line (a multi-line message — a
    /// Python traceback — has its lines joined with ` | `, and every other
    /// control or separator character is escaped, so that a guest's text can
    /// neither start a log line of its own nor reorder one) and at most
    /// [`MAX_MESSAGE_BYTES`] long, keeping its start and its end (where a
    /// traceback says what went wrong).
    pub fn new(cause: Cause, message: impl Into<String>) -> Self {
        let mut message = message.into();
        // Cut first: a guest may hand over tens of MiB, and joining lines costs
        // a copy per line.
        if message.len() > 4 * MAX_MESSAGE_BYTES {
            let head = floor(&message, 2 * MAX_MESSAGE_BYTES);
            let tail = ceil(&message, message.len() - 2 * MAX_MESSAGE_BYTES);
            message = format!("{}\n{}", &message[..head], &message[tail..]);
        }
        let mut message = if message.contains('\n') {
            message.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" | ")
        } else {
            message
        };
        if let std::borrow::Cow::Owned(escaped) = escape_controls(&message) {
            message = escaped;
        }
        if message.len() > MAX_MESSAGE_BYTES {
            let head = floor(&message, MAX_MESSAGE_BYTES / 3);
            let tail = ceil(&message, message.len() - (MAX_MESSAGE_BYTES * 2 / 3 - 5));
            message = format!("{} … {}", &message[..head], &message[tail..]);
        }
        Fault { cause, message, frames_at: None }
    }

    /// A stage skipped for want of a free instance (cause `busy`).
    pub fn busy(message: impl Into<String>) -> Self {
        Fault::new(Cause::Busy, message)
    }

    /// Classifies an error returned by a call into the guest. `memory_denied` says
    /// whether the limiter refused a memory growth during the call; `budget`
    /// describes the CPU budget for the message of a timeout.
    pub fn from_call_error(err: &wasmtime::Error, memory_denied: bool, budget: &str) -> Self {
        if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
            return Fault::new(Cause::Trap, format!("the plugin called exit({})", exit.0));
        }
        let trap = err.downcast_ref::<wasmtime::Trap>().copied();
        match trap {
            Some(wasmtime::Trap::OutOfFuel) => {
                return Fault::new(Cause::Timeout, format!("CPU budget of {budget} used up"));
            }
            Some(wasmtime::Trap::Interrupt) => return Fault::new(Cause::Timeout, "interrupted"),
            _ => {}
        }
        if memory_denied {
            return Fault::new(Cause::Oom, "memory limit exceeded");
        }
        let message = match trap {
            Some(t) => t.to_string(),
            // A host error (a full resource table, a refused WASI call): its
            // root cause says what happened; the context above it is the wasm
            // backtrace.
            None => explain_host_limit(&err.root_cause().to_string()),
        };
        let mut fault = Fault::new(Cause::Trap, first_line(&message));
        if let Some(frames) = err.downcast_ref::<wasmtime::WasmBacktrace>().and_then(named_frames) {
            fault.frames_at = Some(fault.message.len());
            fault.message = format!("{} in {frames}", fault.message);
            cut(&mut fault.message, MAX_MESSAGE_BYTES);
        }
        fault
    }

    /// Appends the guest's last words to a trap's message, escaped like the
    /// message itself.
    pub fn with_last_words(mut self, words: Option<LastWords>) -> Self {
        if let Some(words) = words.filter(|w| !w.text.is_empty()) {
            let from = if words.logged { "it logged" } else { "stderr" };
            let at = self.frames_at.filter(|&i| self.message.is_char_boundary(i)).unwrap_or(self.message.len());
            let (head, frames) = self.message.split_at(at);
            self.message = format!("{head}; {from}: {}{frames}", escape_controls(&words.text));
            self.frames_at = None;
            cut(&mut self.message, MAX_MESSAGE_BYTES);
        }
        self
    }

    /// Prefixes the message with what was being done (`configure failed: ...`).
    pub fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self.frames_at = self.frames_at.map(|i| i + what.len() + 2);
        cut(&mut self.message, MAX_MESSAGE_BYTES);
        self
    }
}

/// The message of a host limit a call ran into, saying which limit and what it
/// is; any other message as it is. wasmtime words these two errors itself, so a
/// test through a real guest (`serve_faults`) checks the wording still matches.
fn explain_host_limit(message: &str) -> String {
    use super::limiter::{MAX_HOSTCALL_BYTES, MAX_RANDOM_BYTES};
    if message.contains("fuel allocated for hostcalls has been exhausted") {
        return format!(
            "the plugin passed the host more than {} in one call (a string or list: a log line, a state \
             key or value, a stdout or stderr write, its answer); that is the limit per host call",
            describe_bytes(MAX_HOSTCALL_BYTES)
        );
    }
    if let Some(rest) = message.strip_prefix("requested len ")
        && let Some((len, _)) = rest.split_once(" exceeds limit ")
    {
        return format!(
            "the plugin asked wasi:random for {len} bytes in one call (get-random-bytes or \
             get-insecure-random-bytes); one call may ask for at most {}",
            describe_bytes(MAX_RANDOM_BYTES as usize)
        );
    }
    message.to_string()
}

/// `65536` → `64 KiB`, `1048576` → `1 MiB`.
fn describe_bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// Whether `c` must not reach a log line as it is: a control character (line
/// feed, carriage return, escape, tab, C1 controls such as NEL), a line or
/// paragraph separator (U+2028, U+2029), or an invisible formatting character
/// that reorders or hides text (the bidirectional embeddings, overrides and
/// isolates U+202A–U+202E and U+2066–U+2069, the marks U+200E, U+200F and
/// U+061C, zero-width characters and the byte-order mark).
pub fn is_unsafe_in_log(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{200B}'..='\u{200F}'
                | '\u{061C}'
                | '\u{FEFF}'
        )
}

/// `s` with every character [`is_unsafe_in_log`] written as an escape (`\n`,
/// `\r`, `\u{202e}`): whatever a guest says — its log lines, its stdio, its
/// `Err` text, its panic message — then reads as one line, in order, and never
/// as a line of the gateway's own. The one function every path uses.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(is_unsafe_in_log) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_unsafe_in_log(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

fn floor(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_fuel_are_named() {
        let exit = wasmtime::Error::new(wasmtime_wasi::I32Exit(3));
        let f = Fault::from_call_error(&exit, false, "25 ms");
        assert_eq!((f.cause, f.message.as_str()), (Cause::Trap, "the plugin called exit(3)"));
        let fuel = wasmtime::Error::new(wasmtime::Trap::OutOfFuel);
        let f = Fault::from_call_error(&fuel, false, "25 ms");
        assert_eq!((f.cause, f.message.as_str()), (Cause::Timeout, "CPU budget of 25 ms used up"));
    }

    #[test]
    fn a_host_error_is_named_by_its_root_cause() {
        let err = wasmtime::Error::msg("table has reached its capacity")
            .context("error while executing at wasm backtrace:\n  0: 0x1 - <unknown>");
        let f = Fault::from_call_error(&err, false, "25 ms");
        assert_eq!(f.message, "table has reached its capacity");
    }

    #[test]
    fn a_huge_many_line_message_costs_little() {
        let started = crate::clock::machine_instant();
        let f = Fault::new(Cause::Error, "a\n".repeat(20 << 20));
        assert!(f.message.len() <= MAX_MESSAGE_BYTES + 4);
        assert!(started.elapsed() < std::time::Duration::from_millis(500), "{:?}", started.elapsed());
    }

    #[test]
    fn last_words_come_before_the_frames() {
        let mut f = Fault::new(Cause::Trap, "wasm trap: unreachable");
        f.frames_at = Some(f.message.len());
        f.message.push_str(&format!(" in {}", "frame < ".repeat(200)));
        cut(&mut f.message, MAX_MESSAGE_BYTES);
        let f = f.with_last_words(Some(LastWords { text: "panicked at src/lib.rs:9: no quota".into(), logged: false }));
        assert!(
            f.message.starts_with("wasm trap: unreachable; stderr: panicked at src/lib.rs:9: no quota in frame <"),
            "{}",
            f.message
        );
        assert!(f.message.len() <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn messages_are_bounded() {
        let f = Fault::new(Cause::Error, "x".repeat(10_000))
            .with_last_words(Some(LastWords { text: "y".repeat(10_000), logged: false }));
        assert!(f.message.len() <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn every_line_break_and_text_reordering_character_is_escaped_on_every_path() {
        let forged = "innocent\r2026-12-01T00:00:00Z ERROR poolgate::gateway: FORGED\u{2028}LS\u{2029}PS\u{85}NEL\u{b}VT\u{c}FF\u{202e}RTL\u{2066}\u{1b}[31m";
        let clean = |m: &str| {
            assert!(!m.chars().any(is_unsafe_in_log), "{m:?}");
            assert!(m.contains("innocent\\r2026-12-01"), "{m}");
            assert!(m.contains("FORGED\\u{2028}LS\\u{2029}PS\\u{85}NEL\\u{b}VT\\u{c}FF\\u{202e}RTL"), "{m}");
        };
        // A guest's `Err` text.
        clean(&Fault::new(Cause::Error, forged).message);
        // A trap whose stderr tail (a panic message) carries it.
        clean(
            &Fault::new(Cause::Trap, "wasm trap")
                .with_last_words(Some(LastWords { text: forged.into(), logged: true }))
                .message,
        );
        // A host error's message (a trap's text goes through `Fault::new` too).
        let err = wasmtime::Error::msg(forged.to_string());
        clean(&Fault::from_call_error(&err, false, "25 ms").message);
        // Line feeds still join a traceback's lines; tabs are escaped.
        assert_eq!(Fault::new(Cause::Error, "a\n\tb").message, "a | \\tb");
        assert!(matches!(escape_controls("plain ü"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn host_limits_are_named() {
        let err = wasmtime::Error::msg("requested len 67108864 exceeds limit 65536");
        let f = Fault::from_call_error(&err, false, "25 ms");
        assert_eq!(f.cause, Cause::Trap);
        assert!(f.message.contains("67108864 bytes") && f.message.contains("at most 64 KiB"), "{}", f.message);
        assert_eq!(describe_bytes(1 << 20), "1 MiB");
        assert_eq!(describe_bytes(1000), "1000 bytes");
    }

    #[test]
    fn a_long_traceback_keeps_its_last_line_on_one_line() {
        let tb = format!(
            "Traceback (most recent call last):\n{}KeyError: 'acct-9'\n",
            "  File \"app.py\", line 80, in rank\n    w = five_hour[c.id]\n".repeat(40)
        );
        let f = Fault::new(Cause::Error, tb);
        assert!(f.message.starts_with("Traceback (most recent call last): |"), "{}", f.message);
        assert!(f.message.ends_with("KeyError: 'acct-9'"), "{}", f.message);
        assert!(!f.message.contains('\n') && f.message.len() <= MAX_MESSAGE_BYTES + 4);
    }
}
