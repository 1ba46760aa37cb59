//! How a stage can fail, and how a wasmtime error is classified.

use serde::Serialize;

/// The cause recorded with `routing_policy_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The guest trapped (panic, `unreachable`, a bad memory access, ...).
    Trap,
    /// The call ran past its deadline.
    Timeout,
    /// The guest asked for more memory than its cap.
    Oom,
    /// The guest answered, but not with a permutation of a non-empty subset.
    InvalidOutput,
    /// The guest returned `Err`, or could not be instantiated.
    Error,
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
        }
    }

    /// Every cause, for metrics that want a zero for each.
    pub const ALL: [Cause; 5] = [Cause::Trap, Cause::Timeout, Cause::Oom, Cause::InvalidOutput, Cause::Error];
}

/// A failed stage call.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// What kind of failure.
    pub cause: Cause,
    /// A one-line explanation for the operator.
    pub message: String,
}

impl Fault {
    /// A fault of `cause` with `message`.
    pub fn new(cause: Cause, message: impl Into<String>) -> Self {
        Fault { cause, message: message.into() }
    }

    /// Classifies an error returned by a call into the guest. `memory_denied` says
    /// whether the limiter refused a memory growth during the call.
    pub fn from_call_error(err: &wasmtime::Error, memory_denied: bool) -> Self {
        let trap = err.downcast_ref::<wasmtime::Trap>().copied();
        if trap == Some(wasmtime::Trap::Interrupt) {
            return Fault::new(Cause::Timeout, "deadline exceeded");
        }
        if memory_denied {
            return Fault::new(Cause::Oom, "memory limit exceeded");
        }
        let message = match trap {
            Some(t) => t.to_string(),
            None => format!("{err:#}"),
        };
        Fault::new(Cause::Trap, first_line(&message))
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(300).collect()
}
