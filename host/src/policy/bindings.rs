//! Host-side bindings of `wit/policy.wit`.
//!
//! Exports are generated `async`: every call into a plugin runs on a wasmtime
//! fiber, so a guest that computes yields to the executor (fuel) and a guest
//! that waits (a WASI sleep or poll) waits on a tokio timer, never on a thread.
//! The host interface stays synchronous: it only touches memory.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "policy",
    exports: { default: async },
});

pub use poolgate::policy::host::Level;
pub use poolgate::policy::types::{
    Account, AccountInfo, ApiShape, Cooldown, CooldownReason, Freshness, Outcome, QuotaWindow, Ranking, Request,
    WindowKind, WindowStatus,
};
