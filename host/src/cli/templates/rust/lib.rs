//! {{name}}: a poolgate ranker. It sends each request to the least busy account
//! (fewest requests in flight); accounts that cannot serve now go last.
//!
//! Build: ./build.sh      Test: poolgate plugin test target/{{name}}.wasm fixtures

use poolgate_sdk::prelude::*;
use serde::Deserialize;

/// The stage's `config` table. Unknown keys are refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {}

struct Plugin;

impl Ranker for Plugin {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let _options: Options = config.parse_into()?;
        Ok(Plugin)
    }

    fn rank(&mut self, _req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        // Stable: ties keep the order the previous stage chose.
        Ok(candidates.sorted_by_key("{{reason}}", |c| (!c.usable, c.in_flight)))
    }
}

poolgate_sdk::export_ranker!(Plugin);
