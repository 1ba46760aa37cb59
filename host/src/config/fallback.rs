//! `[[fallback]]`: OpenAI-compatible backends for a pool that is populated but
//! cannot serve. Off unless configured; the routing is `gateway::request::fallback`'s.

use serde::{Deserialize, Serialize};

/// One fallback backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackConfig {
    /// Its name in the `x-poolgate-fallback` header, records and metrics.
    pub name: String,
    /// The backend's base URL; requests go to `<base_url>/v1/chat/completions`.
    pub base_url: String,
    /// Environment variable holding its API key (sent as a bearer token).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The model every substituted request asks it for.
    pub model: String,
    /// How long it rests after a failure before it is tried again, ms.
    #[serde(default = "default_cooldown_ms")]
    pub cooldown_ms: u64,
}

fn default_cooldown_ms() -> u64 {
    30_000
}
