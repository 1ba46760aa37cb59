//! The plugin runtime: WebAssembly policy components run in a sandbox, chained.
//!
//! - [`engine`]: the process's wasmtime engine, its linker and builder thread;
//!   [`calls`]: where plugin calls run (the request's thread, or threads of
//!   their own once they wait);
//!   [`compile`]: compiling within limits, and the bounded compile caches.
//! - [`plugin`]: one configured plugin; [`pool`]: its warm instances, refilled
//!   in the background; [`instance`]: one instance and every call into it,
//!   bounded by [`bounded`] (wall clock, panics) and fuel (CPU).
//! - [`sandbox`]: what a running plugin can touch (the host interface, nothing
//!   else), with [`limiter`] (memory) and [`stdio`] (its output, bounded).
//! - [`chain`]: the stages in order — where a request's account order is decided;
//!   [`loading`]: where a chain load is, for the bound a start or reload puts on it.
//! - [`view`]: the account model turned into the records plugins receive.
//! - [`breaker`], [`events`], [`fault`], [`decision`], [`state`], [`names`]: the
//!   pieces around it.
//!
//! The promise this module keeps: whatever a plugin does — trap, loop, sleep,
//! exhaust its memory, flood its state or its log, answer nonsense — the call
//! ends within its bounds as a [`Fault`], the request is served without the
//! stage, and the host's memory stays bounded.

mod bindings;
pub mod bounded;
pub mod breaker;
pub mod calls;
pub mod chain;
pub mod compile;
pub mod decision;
pub mod engine;
pub mod events;
pub mod fault;
pub mod instance;
pub mod limiter;
pub mod loading;
mod lowering;
pub mod names;
pub mod plugin;
pub mod pool;
pub mod sandbox;
pub mod state;
pub mod stdio;
pub mod view;

/// The records of `wit/policy.wit` a caller of the runtime reads or writes: a
/// request's facts, how it ended, and — for tests and benchmarks that look
/// inside a decision — what the plugins received. The bindings they come from
/// stay private; the account model becomes these only in [`view`].
pub mod types {
    pub use super::bindings::{
        Account, AccountInfo, ApiShape, Cooldown, CooldownReason, Freshness, Outcome, QuotaWindow, Ranking, Request,
        WindowKind, WindowStatus,
    };
}

pub use breaker::{BreakerConfig, Phase};
pub use chain::{Candidates, Chain, StageSpec, StageStatus};
pub use compile::CompileLimits;
pub use decision::{Decision, Order, POOL_ORDER, PolicyError, ROUTING_POLICY_ERROR};
pub use engine::PolicyEngine;
pub use events::FaultSink;
pub use fault::{Cause, Fault};
pub use plugin::{Limits, Plugin, PluginRef, PluginSpec, builtin_names};
pub use state::{MemoryState, StateEntry, StateLimits, StateStore};

/// Default deadline of one plugin call, in ms: its CPU budget (see
/// [`engine::FUEL_PER_MS`]). Chosen from measurements (see docs/benchmarks.md):
/// a componentize-js ranker takes ~0.3 ms for 16 accounts and up to ~4 ms for
/// 128 on a warm instance; 25 ms leaves room for that while keeping a runaway
/// plugin's cost to one request bounded and small.
pub const DEFAULT_DEADLINE_MS: u64 = 25;
/// Default CPU budget of building one plugin instance (instantiating it and
/// running `configure`), in ms: language runtimes start slowly.
pub const DEFAULT_CONFIGURE_MS: u64 = 5_000;
/// Default memory cap per plugin instance (all its memories and tables), in
/// MiB. componentize-py needs ~15 MiB to start; 64 leaves room for a Python or
/// JS ranker's heap.
pub const DEFAULT_MEMORY_MB: usize = 64;
/// Default bound on a plugin's instances under demand, as a multiple of the
/// warm ones (`[policy] max_instances` = this × `instances`). Sized from the
/// burst measurement in docs/benchmarks.md ("Bursts").
pub const DEFAULT_INSTANCE_GROWTH: usize = 16;

/// Runs `future` to completion from synchronous code (the CLI, tests) on a
/// single-threaded runtime: plugin calls are asynchronous, and this is the same
/// path `serve` takes. Panics if called from inside an async context (await the
/// future there instead).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a tokio runtime")
        .block_on(future)
}
