//! Write poolgate routing-policy plugins in Rust.
//!
//! A plugin is a WebAssembly component that ranks the accounts of a pool for one
//! request. With this crate it is one short file: implement [`Ranker`] and export it
//! with [`export_ranker!`]. The WIT glue (`wit/policy.wit`) stays hidden; what you
//! see are the records it defines plus helpers for the reads every ranker needs.
//!
//! ```ignore
//! use poolgate_sdk::prelude::*;
//!
//! struct LeastBusy;
//!
//! impl Ranker for LeastBusy {
//!     fn configure(_config: Config, _pool: &Pool) -> Result<Self, String> {
//!         Ok(LeastBusy)
//!     }
//!     fn rank(&mut self, _req: &Request, c: &Candidates) -> Result<Ranking, String> {
//!         Ok(c.sorted_by_key("least_busy", |a| a.in_flight))
//!     }
//! }
//!
//! poolgate_sdk::export_ranker!(LeastBusy);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is the component to point poolgate at.
//!
//! The built-in strategies share two building blocks that are yours to use too:
//! [`Buckets`] (which model family a `7d_<bucket>` window binds, and dario's
//! headroom) and [`metrics`] (neurolink's per-account sort metrics, its
//! `expiry-first` and `headroom-first` ladders, and the usable-and-unsaturated
//! test its affinity, prefer-primary and spill modifiers apply).

#![warn(missing_docs)]

mod buckets;
mod candidate;
mod candidates;
mod config;
mod floor;
pub mod host;
pub mod metrics;
#[doc(hidden)]
pub mod rt;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "__export_policy",
        default_bindings_module: "poolgate_sdk::bindings",
        generate_all,
    });
}

pub use bindings::poolgate::policy::types::{
    Account, AccountInfo, ApiShape, Cooldown, CooldownReason, Freshness, Outcome, QuotaWindow, Ranking, Request,
    WindowKind, WindowStatus,
};
pub use buckets::Buckets;
pub use candidate::{Candidate, ModelFamily, model_family};
pub use candidates::{Candidates, Pool};
pub use config::{Config, check_range};
pub use floor::{Floor, Seat, Standing};

/// Everything a ranker file usually needs.
pub mod prelude {
    pub use crate::host::{log, state};
    pub use crate::metrics::{Ladder, SortMetrics};
    pub use crate::{
        Account, AccountInfo, ApiShape, Buckets, Candidate, Candidates, Config, Cooldown, CooldownReason, Floor,
        Freshness, ModelFamily, Outcome, Pool, QuotaWindow, Ranker, Ranking, Request, Seat, Standing, WindowKind,
        WindowStatus, check_range, model_family,
    };
}

/// A routing policy: one stage of poolgate's chain.
///
/// The host creates several instances of a plugin (one per worker thread) and may
/// replace an instance at any time, so anything that must outlive an instance —
/// session bindings, counters — belongs in [`host::state`], not in `self`.
pub trait Ranker: Sized + 'static {
    /// Builds the ranker from the stage's `config` table. Return `Err` naming the
    /// offending option to refuse the configuration; the host then refuses the chain.
    fn configure(config: Config, pool: &Pool) -> Result<Self, String>;

    /// Orders `candidates` for `req`, best first. Leaving a candidate out drops it
    /// from the rest of the chain (the host never lets every usable one go).
    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String>;

    /// Learns how a request ended on `account` (a pool entry). Default: ignore.
    fn observe(&mut self, req: &Request, account: &AccountInfo, outcome: &Outcome) {
        let _ = (req, account, outcome);
    }
}

impl Ranking {
    /// A ranking that keeps `order` (indices into the candidates) and claims the
    /// head with `reason`.
    pub fn new(order: Vec<u32>, reason: impl Into<String>) -> Self {
        Ranking { order, reason: reason.into(), detail: None }
    }

    /// Adds a detail line for the decision record.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// Exports a [`Ranker`] implementation as the component's `ranker` interface.
///
/// Use it once, at the top level of the plugin crate (a `cdylib`).
#[macro_export]
macro_rules! export_ranker {
    ($ty:ty) => {
        const _: () = {
            struct PoolgateGuest;
            impl $crate::bindings::exports::poolgate::policy::ranker::Guest for PoolgateGuest {
                fn configure(
                    config: ::std::string::String,
                    pool: ::std::vec::Vec<$crate::AccountInfo>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::rt::configure::<$ty>(config, pool)
                }
                fn rank(
                    req: $crate::Request,
                    candidates: ::std::vec::Vec<$crate::Account>,
                    windows: ::std::vec::Vec<$crate::QuotaWindow>,
                ) -> ::std::result::Result<$crate::Ranking, ::std::string::String> {
                    $crate::rt::rank::<$ty>(req, candidates, windows)
                }
                fn observe(req: $crate::Request, account: u32, ended: $crate::Outcome) {
                    $crate::rt::observe::<$ty>(req, account, ended)
                }
            }
    $crate::bindings::__export_policy!(PoolgateGuest with_types_in $crate::bindings);
        };
    };
}
