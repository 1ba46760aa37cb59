//! A plugin built against `poolgate:policy@0.1.9` — on the accepted 0.1 track,
//! but calling `host.shiny-new`, a function the 0.1.0 host does not have. The
//! name check passes it; only linking against what the host really provides
//! refuses it, and `plugin inspect` must say so, naming the function.

// A WebAssembly component only: on a native target (`cargo build --workspace`)
// the crate is empty, since its exports' names are not native symbol names.
#![cfg(target_arch = "wasm32")]

mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "policy" });
}

use bindings::exports::poolgate::policy::ranker::{
    Account, AccountInfo, Guest, Outcome, QuotaWindow, Ranking, Request,
};
use bindings::poolgate::policy::host;

struct Next;

impl Guest for Next {
    fn configure(_config: String, _pool: Vec<AccountInfo>) -> Result<(), String> {
        Ok(())
    }
    fn rank(_req: Request, candidates: Vec<Account>, _windows: Vec<QuotaWindow>) -> Result<Ranking, String> {
        let n = host::shiny_new();
        Ok(Ranking { order: (0..candidates.len() as u32).collect(), reason: format!("next-{n}"), detail: None })
    }
    fn observe(_req: Request, _account: u32, _ended: Outcome) {}
}

bindings::export!(Next with_types_in bindings);
