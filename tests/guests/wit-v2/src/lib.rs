//! A plugin built against `poolgate:policy@0.2.0` — a copy of the WIT with only
//! the package version bumped. The host accepts the 0.1 track only, so loading
//! it must fail with a message naming both versions, and `plugin inspect` must
//! call it incompatible.

// A WebAssembly component only: on a native target (`cargo build --workspace`)
// the crate is empty, since its exports' names are not native symbol names.
#![cfg(target_arch = "wasm32")]

mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "policy" });
}

use bindings::exports::poolgate::policy::ranker::{
    Account, AccountInfo, Guest, Outcome, QuotaWindow, Ranking, Request,
};

struct V2;

impl Guest for V2 {
    fn configure(_config: String, _pool: Vec<AccountInfo>) -> Result<(), String> {
        Ok(())
    }
    fn rank(_req: Request, candidates: Vec<Account>, _windows: Vec<QuotaWindow>) -> Result<Ranking, String> {
        Ok(Ranking { order: (0..candidates.len() as u32).collect(), reason: "v2".into(), detail: None })
    }
    fn observe(_req: Request, _account: u32, _ended: Outcome) {}
}

bindings::export!(V2 with_types_in bindings);
