//! How a stage can fail, and how a wasmtime error is classified.

use serde::Serialize;

/// The cause recorded with `routing_policy_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The guest trapped (panic, `unreachable`, a bad memory access, `exit`, ...).
    Trap,
    /// The call used up its CPU budget, ran past its wall-clock bound, or found
    /// no warm instance in time.
    Timeout,
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
            Cause::Oom => "oom",
            Cause::InvalidOutput => "invalid-output",
            Cause::Error => "error",
            Cause::Host => "host",
            Cause::Bypassed => "bypassed",
        }
    }

    /// Every cause, for metrics that want a zero for each.
    pub const ALL: [Cause; 7] =
        [Cause::Trap, Cause::Timeout, Cause::Oom, Cause::InvalidOutput, Cause::Error, Cause::Host, Cause::Bypassed];
}

/// A failed stage call.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// What kind of failure.
    pub cause: Cause,
    /// A one-line explanation for the operator.
    pub message: String,
    /// The stage was skipped because every instance was busy, not because the
    /// plugin failed: recorded, but not held against it by the breaker.
    #[serde(skip)]
    pub capacity: bool,
}

/// Longest fault message kept (a guest's `Err` text or its stderr can be long).
pub const MAX_MESSAGE_BYTES: usize = 600;

impl Fault {
    /// A fault of `cause` with `message`, on one line (a multi-line message — a
    /// Python traceback — has its lines joined with ` | `) and at most
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
        if message.len() > MAX_MESSAGE_BYTES {
            let head = floor(&message, MAX_MESSAGE_BYTES / 3);
            let tail = ceil(&message, message.len() - (MAX_MESSAGE_BYTES * 2 / 3 - 5));
            message = format!("{} … {}", &message[..head], &message[tail..]);
        }
        Fault { cause, message, capacity: false }
    }

    /// A stage skipped for want of a free instance.
    pub fn busy(message: impl Into<String>) -> Self {
        Fault { capacity: true, ..Fault::new(Cause::Timeout, message) }
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
            None => err.root_cause().to_string(),
        };
        Fault::new(Cause::Trap, first_line(&message))
    }

    /// Appends what the guest last wrote to stderr (a Rust panic's message and
    /// location, a Python traceback's last lines) to a trap's message.
    pub fn with_stderr(mut self, tail: Option<String>) -> Self {
        if let Some(tail) = tail.filter(|t| !t.is_empty()) {
            self.message = format!("{}; stderr: {tail}", self.message);
            cut(&mut self.message, MAX_MESSAGE_BYTES);
        }
        self
    }

    /// Prefixes the message with what was being done (`configure failed: ...`).
    pub fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        cut(&mut self.message, MAX_MESSAGE_BYTES);
        self
    }
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
        let started = std::time::Instant::now();
        let f = Fault::new(Cause::Error, "a\n".repeat(20 << 20));
        assert!(f.message.len() <= MAX_MESSAGE_BYTES + 4);
        assert!(started.elapsed() < std::time::Duration::from_millis(500), "{:?}", started.elapsed());
    }

    #[test]
    fn messages_are_bounded() {
        let f = Fault::new(Cause::Error, "x".repeat(10_000)).with_stderr(Some("y".repeat(10_000)));
        assert!(f.message.len() <= MAX_MESSAGE_BYTES);
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
