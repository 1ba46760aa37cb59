//! The plugin runtime: WebAssembly policy components run in a sandbox, chained.
//!
//! - [`engine`]: the process's wasmtime engine, epoch ticker and compile cache.
//! - [`sandbox`]: what a running plugin can touch (the host interface, nothing else).
//! - [`plugin`]: one configured plugin and its pool of warm instances.
//! - [`chain`]: the stages in order — where a request's account order is decided.
//! - [`breaker`], [`fault`], [`decision`], [`state`], [`names`]: the pieces around it.

pub mod bindings;
pub mod breaker;
pub mod chain;
pub mod decision;
pub mod engine;
pub mod fault;
mod lowering;
pub mod names;
pub mod plugin;
pub mod sandbox;
pub mod state;

pub use breaker::BreakerConfig;
pub use chain::{Candidates, Chain, StageSpec, StageStatus};
pub use decision::{Decision, Order, POOL_ORDER, ROUTING_POLICY_ERROR};
pub use engine::PolicyEngine;
pub use fault::{Cause, Fault};
pub use plugin::{Limits, PluginRef, PluginSpec, builtin_names};
pub use state::{MemoryState, StateStore};

/// Default deadline of one plugin call, in ms. Chosen from measurements (see
/// docs/benchmarks.md): a componentize-js ranker takes ~0.3 ms for 16 accounts
/// and up to ~4 ms for 128 on a warm instance, and a busy 2-core host adds
/// scheduling jitter of a few ms; 25 ms leaves room for both while keeping a
/// runaway plugin's cost to one request bounded and small.
pub const DEFAULT_DEADLINE_MS: u64 = 25;
/// Default linear-memory cap per plugin instance, in MiB. componentize-py needs
/// ~15 MiB to start; 64 leaves room for a Python or JS ranker's heap.
pub const DEFAULT_MEMORY_MB: usize = 64;
