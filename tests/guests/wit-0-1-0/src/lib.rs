//! A plugin built against `poolgate:policy@0.1.0`, the WIT before 0.1.1 added
//! `host.freshness-ms`: a patch release only adds host functions, so a newer
//! host must load it and run it, its host calls included. It puts the
//! candidates in reverse and names the first window it was shown.

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

struct Old;

impl Guest for Old {
    fn configure(_config: String, _pool: Vec<AccountInfo>) -> Result<(), String> {
        host::state_set("configured", "yes", None);
        Ok(())
    }
    fn rank(_req: Request, candidates: Vec<Account>, windows: Vec<QuotaWindow>) -> Result<Ranking, String> {
        host::log(host::Level::Debug, "ranking on a 0.1.0 build");
        let first = windows.first().map(|w| host::window_name(w.name)).unwrap_or_default();
        let configured = host::state_get("configured").unwrap_or_default();
        Ok(Ranking {
            order: (0..candidates.len() as u32).rev().collect(),
            reason: format!("v010-{configured}-{first}"),
            detail: None,
        })
    }
    fn observe(_req: Request, _account: u32, _ended: Outcome) {}
}

bindings::export!(Old with_types_in bindings);
