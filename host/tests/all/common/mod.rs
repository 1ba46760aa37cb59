//! Helpers shared by the host's integration tests.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use poolgate::case::Case;
use poolgate::policy::{
    BreakerConfig, Chain, Decision, Limits, MemoryState, PluginRef, PluginSpec, PolicyEngine, StageSpec, StateStore,
};

/// One engine for the whole test binary (like the gateway: one per process).
pub static ENGINE: LazyLock<Arc<PolicyEngine>> = LazyLock::new(|| PolicyEngine::new(None).expect("engine"));

/// The path of a test guest built from tests/guests/<name>.
pub fn guest(name: &str) -> String {
    poolgate::artifacts::test_guest(name).unwrap_or_else(|| panic!("no test guest {name}")).to_string()
}

/// A stage spec for `plugin` with `config` (JSON) and a deadline in ms.
pub fn stage(plugin: &str, config: serde_json::Value, deadline_ms: u64) -> StageSpec {
    let plugin_ref = PluginRef::parse(plugin);
    StageSpec {
        name: plugin.rsplit('/').next().unwrap().to_string(),
        plugin: PluginSpec {
            scope: plugin_ref.default_scope(),
            plugin: plugin_ref,
            config_json: config.to_string(),
            limits: Limits {
                deadline: Duration::from_millis(deadline_ms),
                memory_bytes: 32 << 20,
                ..Limits::default()
            },
            max_idle: 2,
            max_instances: 2,
        },
    }
}

/// A pool of `n` accounts `a0..` with rising 5h utilization, all usable.
pub fn pool_case(n: usize) -> Case {
    let accounts: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "id": format!("a{i}"),
                "windows": [
                    { "name": "5h", "utilization": 0.1 * i as f64 },
                    { "name": "7d", "utilization": 0.05 }
                ]
            })
        })
        .collect();
    Case::parse(&serde_json::json!({ "now_ms": 1_760_000_000_000u64, "accounts": accounts }).to_string()).unwrap()
}

/// Loads a chain over the case's pool with a fresh state store.
pub fn chain(case: &Case, stages: Vec<StageSpec>) -> Chain {
    chain_with_state(case, stages, Arc::new(MemoryState::default()))
}

/// Loads a chain over the case's pool with the given state store.
pub fn chain_with_state(case: &Case, stages: Vec<StageSpec>, state: Arc<dyn StateStore>) -> Chain {
    poolgate::policy::block_on(Chain::load(&ENGINE, stages, case.pool(), state, BreakerConfig::default()))
        .expect("chain loads")
}

/// Runs one request of `model` through the chain.
pub fn rank(chain: &Chain, case: &Case, model: &str) -> Decision {
    let mut req = case.request();
    req.model = model.to_string();
    poolgate::policy::block_on(chain.rank(req, case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS)))
}
