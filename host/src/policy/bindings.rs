//! Host-side bindings of `wit/policy.wit`.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "policy",
});

pub use poolgate::policy::host::Level;
pub use poolgate::policy::types::{
    Account, AccountInfo, ApiShape, Cooldown, CooldownReason, Freshness, Outcome, QuotaWindow, Ranking, Request,
    WindowKind, WindowStatus,
};
