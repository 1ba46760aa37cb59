//! A well-formed ranker that also imports `wasi:http/client@0.3.0` — a
//! capability poolgate never grants. The host must refuse to load it and `plugin
//! inspect` must name the import.
//!
//! The import is declared with a stand-in interface of the real name (only the
//! name matters to the check) and called from `rank`, so the component keeps it:
//! unused imports are dropped when the component is made. It is the 0.3 track
//! because Rust's wasip2 std already carries wasi:http 0.2 types, which a
//! stand-in on that track would have to match.

// A WebAssembly component only: on a native target (`cargo build --workspace`)
// the crate is empty, since its exports' names are not native symbol names.
#![cfg(target_arch = "wasm32")]

use poolgate_sdk::prelude::*;

mod http {
    wit_bindgen::generate!({
        inline: "
            package wasi:http@0.3.0;
            interface client { send: func(url: string) -> u32; }
            world fetch { import client; }
        ",
        world: "wasi:http/fetch",
    });
}

struct Leaky {
    url: Option<String>,
}

impl Ranker for Leaky {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        let url = o.string("url")?;
        o.done()?;
        Ok(Leaky { url })
    }
    fn rank(&mut self, _req: &Request, c: &Candidates) -> Result<Ranking, String> {
        if let Some(url) = &self.url {
            http::wasi::http::client::send(url);
        }
        Ok(c.unchanged("leaky"))
    }
}

poolgate_sdk::export_ranker!(Leaky);
