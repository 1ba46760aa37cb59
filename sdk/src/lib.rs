//! Write poolgate routing-policy plugins in Rust.
//!
//! A plugin is a WebAssembly component that ranks the accounts of a pool for one
//! request. With this crate it is one short file: implement [`Ranker`] and export it
//! with [`export_ranker!`]. The WIT glue (`wit/policy.wit`) stays hidden; what you
//! see are the records it defines plus helpers for the reads every ranker needs.
//!
//! ```no_run
//! use poolgate_sdk::prelude::*;
//!
//! /// Sends each request to the account with the fewest requests in flight; the
//! /// unusable ones and those above `max_in_flight` (an option, default 8) go last.
//! struct LeastBusy {
//!     max_in_flight: u32,
//! }
//!
//! impl Ranker for LeastBusy {
//!     fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
//!         let mut o = config.options();
//!         let max_in_flight = check_range("max_in_flight", o.u32("max_in_flight")?.unwrap_or(8), 1, 1000)?;
//!         o.done()?; // refuses any option not read above, by name
//!         Ok(LeastBusy { max_in_flight })
//!     }
//!
//!     fn rank(&mut self, _req: &Request, c: &Candidates) -> Result<Ranking, String> {
//!         // Stable: ties keep the order the previous stage chose.
//!         Ok(c.sorted_by_key("least_busy", |a| (!a.usable || a.in_flight > self.max_in_flight, a.in_flight)))
//!     }
//! }
//!
//! poolgate_sdk::export_ranker!(LeastBusy);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is the component to point poolgate at.
//!
//! Options arrive as the stage's TOML `config` table; [`Config::options`] reads
//! them one by one and refuses, by name, a value of the wrong type and any option
//! not read. [`json`] is the small JSON reader underneath.
//!
//! The built-in strategies share two building blocks that are yours to use too:
//! [`Buckets`] (which model family a `7d_<bucket>` window binds, and dario's
//! headroom) and [`metrics`] (neurolink's per-account sort metrics, its
//! `expiry-first` and `headroom-first` ladders, and the usable-and-unsaturated
//! test its affinity, prefer-primary and spill modifiers apply).
//!
//! The crate depends on no other crate, so a plugin builds offline. The examples
//! in these docs are checked by `cargo test -p poolgate-sdk --doc` (which the
//! SDK's own test suite runs) on the build machine, not on wasm32: the crate
//! builds there too, but its host calls are stubs that panic, so the ranker above
//! is `no_run` (compiled and linked, not run); the options examples do run.

#![deny(missing_docs)]

mod abi;
mod buckets;
mod candidate;
mod candidates;
mod config;
mod floor;
pub mod host;
pub mod json;
pub mod metrics;
#[doc(hidden)]
pub mod rt;

/// The WIT glue, generated ahead of time from `wit/policy.wit` (world `policy`)
/// by `poolgate-witgen rust`; see the file's header.
#[doc(hidden)]
#[allow(missing_docs)]
#[rustfmt::skip]
pub mod bindings;

pub use bindings::poolgate::policy::types::{
    Account, AccountInfo, ApiShape, Cooldown, CooldownReason, Freshness, Outcome, QuotaWindow, Ranking, Request,
    WindowKind, WindowStatus,
};
pub use buckets::Buckets;
pub use candidate::{Candidate, ModelFamily, model_family};
pub use candidates::{Candidates, Pool};
pub use config::{Config, Options, check_range};
pub use floor::{Floor, Seat, Standing};

/// Everything a ranker file usually needs.
pub mod prelude {
    pub use crate::host::{log, state};
    pub use crate::metrics::{Ladder, SortMetrics};
    pub use crate::{
        Account, AccountInfo, ApiShape, Buckets, Candidate, Candidates, Config, Cooldown, CooldownReason, Floor,
        Freshness, ModelFamily, Options, Outcome, Pool, QuotaWindow, Ranker, Ranking, Request, Seat, Standing,
        WindowKind, WindowStatus, check_range, model_family,
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
            // Exported from a WebAssembly component only: natively (a
            // `cargo build --workspace`, or a plugin's own unit tests) the
            // crate is a plain library, as its export names are no symbol names.
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::__export_policy!(PoolgateGuest with_types_in $crate::bindings);
        };
    };
}
