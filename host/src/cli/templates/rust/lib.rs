//! {{name}}: a poolgate ranker. It sends each request to the least busy account
//! (fewest requests in flight); accounts that cannot serve now go last.
//!
//! Build and test: poolgate plugin build .   (→ dist/{{name}}.wasm once the fixtures pass)

use poolgate_sdk::prelude::*;

struct Plugin;

impl Ranker for Plugin {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        // The stage's `config` table. To take an option, make this `let mut o`
        // and read it before `done`, with its default:
        //     let limit = o.f64("limit")?.unwrap_or(0.9);
        // A read gives None when the option is absent and refuses a value of the
        // wrong type by the option's name (`o.bool`, `o.u64`, `o.string`, …).
        let o = config.options();
        // Refuses every option not read above, by name: a misspelt option fails
        // to load instead of being ignored.
        o.done()?;
        Ok(Plugin)
    }

    fn rank(&mut self, _req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        // Stable: ties keep the order the previous stage chose.
        Ok(candidates.sorted_by_key("{{reason}}", |c| (!c.usable, c.in_flight)))
    }
}

poolgate_sdk::export_ranker!(Plugin);
