//! The shape of the config file, key by key: what each key may hold and its
//! allowed range. The validator walks the parsed file against this table so that
//! it can report *every* unknown key, wrong type and out-of-range value at once,
//! each with its path and line — serde alone stops at the first.
//!
//! A unit test (`schema_matches_the_config_types`) checks that every key of the
//! serde types is here and nothing else, so the two cannot drift apart.

/// What a key may hold.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A string.
    Str,
    /// An integer in `min..=max`.
    Int(i64, i64),
    /// A number (integer or float) in `min..=max`.
    Float(f64, f64),
    /// `true` or `false`.
    Bool,
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// An array of strings.
    Strs,
    /// A table with these keys.
    Table(&'static [Field]),
    /// An array of tables with these keys (`[[x]]`), the second list naming the
    /// keys every entry must have.
    Tables(&'static [Field], &'static [&'static str]),
    /// Any table (a plugin's own options: the plugin checks them).
    AnyTable,
    /// A table whose keys are names of the operator's (`[prices."model*"]`),
    /// each a table with these keys, the second list naming the keys every
    /// entry must have.
    Named(&'static [Field], &'static [&'static str]),
}

/// One key.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The key.
    pub name: &'static str,
    /// What it may hold.
    pub kind: Kind,
}

const fn f(name: &'static str, kind: Kind) -> Field {
    Field { name, kind }
}

const MS_DAY: i64 = 86_400_000;

/// The largest `server.max_header_bytes`: 1 MiB. The HTTP server buffers up
/// to twice this, so any head up to there gets poolgate's own 431.
pub const MAX_HEADER_BYTES: i64 = 1 << 20;

/// `[[server.client_keys]]`.
pub const CLIENT_KEY: &[Field] = &[
    f("name", Kind::Str),
    f("sha256", Kind::Str),
    f("key_env", Kind::Str),
    f("team", Kind::Str),
    f("models", Kind::Strs),
    f("max_in_flight", Kind::Int(1, 100_000)),
    f("requests_per_minute", Kind::Int(1, 10_000_000)),
    f("tokens_per_minute", Kind::Int(1, i64::MAX)),
    f("budget_tokens_day", Kind::Int(0, i64::MAX)),
    f("budget_tokens_week", Kind::Int(0, i64::MAX)),
    f("budget_tokens_month", Kind::Int(0, i64::MAX)),
    f("budget_usd_day", Kind::Float(0.0, 1e9)),
    f("budget_usd_week", Kind::Float(0.0, 1e9)),
    f("budget_usd_month", Kind::Float(0.0, 1e9)),
];

/// `[server]`.
pub const SERVER: &[Field] = &[
    f("listen", Kind::Str),
    f("max_body_mb", Kind::Int(1, 1024)),
    f("max_header_bytes", Kind::Int(1024, MAX_HEADER_BYTES)),
    f("shutdown_grace_ms", Kind::Int(0, 3_600_000)),
    f("drain_ms", Kind::Int(0, 3_600_000)),
    f("header_timeout_ms", Kind::Int(100, 600_000)),
    f("body_timeout_ms", Kind::Int(100, 3_600_000)),
    f("idle_timeout_ms", Kind::Int(100, 3_600_000)),
    f("send_timeout_ms", Kind::Int(1000, 3_600_000)),
    f("max_connections", Kind::Int(0, 1_000_000)),
    f("decisions_kept", Kind::Int(0, 100_000)),
    f("log_format", Kind::OneOf(&["text", "json"])),
    f("admin_token_env", Kind::Str),
    f("admin_token_sha256", Kind::Str),
    f("client_keys", Kind::Tables(CLIENT_KEY, &["name"])),
];

/// `[gateway]`.
pub const GATEWAY: &[Field] = &[
    f("max_attempts", Kind::Int(0, 1000)),
    f("queue_max", Kind::Int(0, 1_000_000)),
    f("queue_timeout_ms", Kind::Int(1, 3_600_000)),
    f("connect_timeout_ms", Kind::Int(1, 600_000)),
    f("response_timeout_ms", Kind::Int(1, 3_600_000)),
    f("forward_headers", Kind::Strs),
    f("stream_keepalive_ms", Kind::Int(0, 240_000)),
    f("unified_headers", Kind::OneOf(&["pool", "account"])),
];

/// `[cooldowns]`.
pub const COOLDOWNS: &[Field] = &[
    f("transient_ms", Kind::Int(0, MS_DAY)),
    f("transient_max_ms", Kind::Int(0, MS_DAY)),
    f("unified_ms", Kind::Int(0, 30 * MS_DAY)),
    f("window_without_reset_ms", Kind::Int(0, 30 * MS_DAY)),
    f("weekly_ceiling_ms", Kind::Int(0, 30 * MS_DAY)),
    f("session_ceiling_ms", Kind::Int(0, 30 * MS_DAY)),
    f("model_ceiling_ms", Kind::Int(0, 30 * MS_DAY)),
    f("unified_ceiling_ms", Kind::Int(0, 30 * MS_DAY)),
    f("overloaded_ms", Kind::Int(0, MS_DAY)),
    f("overloaded_max_ms", Kind::Int(0, MS_DAY)),
    f("upstream_error_ms", Kind::Int(0, MS_DAY)),
    f("upstream_error_max_ms", Kind::Int(0, MS_DAY)),
    f("stream_cuts", Kind::Int(0, 1000)),
    f("auth_ms", Kind::Int(0, MS_DAY)),
    f("auth_max_ms", Kind::Int(0, 30 * MS_DAY)),
];

/// `[policy.breaker]`.
pub const BREAKER: &[Field] = &[
    f("failures", Kind::Int(0, crate::policy::breaker::MAX_FAILURES as i64)),
    f("cooldown_ms", Kind::Int(0, MS_DAY)),
    f("max_cooldown_ms", Kind::Int(0, MS_DAY)),
];

/// `[policy.state]`.
pub const STATE: &[Field] = &[f("max_scope_mb", Kind::Int(1, 4096)), f("max_total_mb", Kind::Int(1, 65_536))];

/// `[[policy.chain]]`.
pub const STAGE: &[Field] = &[
    f("plugin", Kind::Str),
    f("name", Kind::Str),
    f("scope", Kind::Str),
    f("timeout_ms", Kind::Int(1, 60_000)),
    f("memory_mb", Kind::Int(1, 4096)),
    f("freshness_ms", Kind::Int(1_000, 30 * MS_DAY)),
    f("config", Kind::AnyTable),
];

/// `[policy]`.
pub const POLICY: &[Field] = &[
    f("timeout_ms", Kind::Int(1, 60_000)),
    f("memory_mb", Kind::Int(1, 4096)),
    f("cache_dir", Kind::Str),
    f("freshness_ms", Kind::Int(1_000, 30 * MS_DAY)),
    f("instances", Kind::Int(1, 1024)),
    f("max_instances", Kind::Int(1, 4096)),
    f("configure_timeout_ms", Kind::Int(10, 600_000)),
    f("max_plugin_mb", Kind::Int(1, 4096)),
    f("compile_timeout_ms", Kind::Int(100, 3_600_000)),
    f("cache_max_mb", Kind::Int(1, 1_048_576)),
    f("state", Kind::Table(STATE)),
    f("breaker", Kind::Table(BREAKER)),
    f("chain", Kind::Tables(STAGE, &["plugin"])),
];

/// `[[accounts]]`.
pub const ACCOUNT: &[Field] = &[
    f("id", Kind::Str),
    f("alias", Kind::Str),
    f("primary", Kind::Bool),
    f("kind", Kind::OneOf(&["api-key", "oauth"])),
    f("api_key_env", Kind::Str),
    f("token_file", Kind::Str),
    f("credentials", Kind::Str),
    f("base_url", Kind::Str),
    f("max_in_flight", Kind::Int(1, 100_000)),
    f("enabled", Kind::Bool),
    f("overflow", Kind::Bool),
];

/// `[oauth]`.
pub const OAUTH: &[Field] = &[
    f("token_url", Kind::Str),
    f("authorize_url", Kind::Str),
    f("redirect_uri", Kind::Str),
    f("client_id", Kind::Str),
    f("scopes", Kind::Str),
    f("refresh_before_ms", Kind::Int(0, 30 * MS_DAY)),
    f("check_interval_ms", Kind::Int(100, MS_DAY)),
    f("timeout_ms", Kind::Int(100, 600_000)),
    f("request_wait_ms", Kind::Int(0, 600_000)),
    f("max_backoff_ms", Kind::Int(1_000, MS_DAY)),
    f("usage_poll_ms", Kind::Int(0, MS_DAY)),
    f("overage", Kind::OneOf(&["allow", "warn", "avoid"])),
];

/// `[state]`.
pub const SHARED_STATE: &[Field] = &[
    f("backend", Kind::OneOf(&["memory", "redis"])),
    f("url", Kind::Str),
    f("key_prefix", Kind::Str),
    f("replica", Kind::Str),
    f("flush_ms", Kind::Int(5, 10_000)),
    f("poll_ms", Kind::Int(100, 600_000)),
    f("timeout_ms", Kind::Int(10, 60_000)),
    f("lease_wait_ms", Kind::Int(1, 5_000)),
    f("lease_ttl_ms", Kind::Int(1_000, 3_600_000)),
    f("refresh_lock_ms", Kind::Int(1_000, 600_000)),
    f("share_credentials", Kind::Bool),
    f("file", Kind::Str),
    f("file_write_ms", Kind::Int(100, 600_000)),
];

/// `[[fallback]]`.
pub const FALLBACK: &[Field] = &[
    f("name", Kind::Str),
    f("base_url", Kind::Str),
    f("api_key_env", Kind::Str),
    f("model", Kind::Str),
    f("cooldown_ms", Kind::Int(0, MS_DAY)),
];

/// `[ledger]`.
pub const LEDGER: &[Field] = &[
    f("file", Kind::Str),
    f("url", Kind::Str),
    f("flush_ms", Kind::Int(10, 60_000)),
    f("queue_max", Kind::Int(1, 10_000_000)),
];

/// `[telemetry]`.
pub const TELEMETRY: &[Field] = &[
    f("endpoint", Kind::Str),
    f("protocol", Kind::OneOf(&["http/protobuf", "grpc"])),
    f("headers", Kind::AnyTable),
    f("headers_env", Kind::AnyTable),
    f("sampling", Kind::Float(0.0, 1.0)),
    f("parent_based", Kind::Bool),
    f("service_name", Kind::Str),
    f("resource", Kind::AnyTable),
    f("propagate_upstream", Kind::Bool),
    f("queue_max", Kind::Int(1, 1_000_000)),
    f("timeout_ms", Kind::Int(100, 600_000)),
];

/// One `[prices."pattern"]`: USD per million tokens.
pub const PRICE: &[Field] = &[
    f("input", Kind::Float(0.0, 1e6)),
    f("output", Kind::Float(0.0, 1e6)),
    f("cache_read", Kind::Float(0.0, 1e6)),
    f("cache_write", Kind::Float(0.0, 1e6)),
];

/// `[models]`.
pub const MODELS: &[Field] = &[f("aliases", Kind::AnyTable)];

/// The whole file.
pub const ROOT: &[Field] = &[
    f("server", Kind::Table(SERVER)),
    f("gateway", Kind::Table(GATEWAY)),
    f("cooldowns", Kind::Table(COOLDOWNS)),
    f("oauth", Kind::Table(OAUTH)),
    f("models", Kind::Table(MODELS)),
    f("state", Kind::Table(SHARED_STATE)),
    f("ledger", Kind::Table(LEDGER)),
    f("telemetry", Kind::Table(TELEMETRY)),
    f("prices", Kind::Named(PRICE, &["input", "output"])),
    f("policy", Kind::Table(POLICY)),
    f("accounts", Kind::Tables(ACCOUNT, &["id"])),
    f("fallback", Kind::Tables(FALLBACK, &["name", "base_url", "model"])),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Every key in `v` is one of `fields` (recursively), and each of
    /// `fields` is in `v`.
    fn walk(v: &toml::Value, fields: &[Field], path: &str) {
        let t = v.as_table().unwrap();
        for (k, v) in t {
            let field =
                fields.iter().find(|f| f.name == k).unwrap_or_else(|| panic!("{path}.{k} is not in the schema"));
            match field.kind {
                Kind::Table(sub) => walk(v, sub, &format!("{path}.{k}")),
                Kind::Named(sub, _) => {
                    for (name, item) in v.as_table().unwrap() {
                        walk(item, sub, &format!("{path}.{k}.{name}"));
                    }
                }
                Kind::Tables(sub, _) => {
                    for item in v.as_array().unwrap() {
                        walk(item, sub, &format!("{path}.{k}[]"));
                    }
                }
                _ => {}
            }
        }
        for f in fields {
            assert!(t.contains_key(f.name), "{path}.{} is in the schema but not written by the config types", f.name);
        }
    }

    /// Every key the serde types write is in the schema, and every schema key is
    /// one the serde types read.
    #[test]
    fn schema_matches_the_config_types() {
        let mut config = Config::default();
        config.server.admin_token_env = Some("X".into());
        config.server.admin_token_sha256 = Some("X".into());
        config.server.client_keys.push(crate::config::ClientKey {
            name: "n".into(),
            sha256: Some("s".into()),
            key_env: Some("e".into()),
            team: Some("t".into()),
            limits: crate::ledger::keys::KeyLimits {
                models: Some(vec!["m*".into()]),
                max_in_flight: Some(1),
                requests_per_minute: Some(1),
                tokens_per_minute: Some(1),
                budget_tokens_day: Some(1),
                budget_tokens_week: Some(1),
                budget_tokens_month: Some(1),
                budget_usd_day: Some(1.0),
                budget_usd_week: Some(1.0),
                budget_usd_month: Some(1.0),
            },
        });
        config.ledger.file = Some("ledger.sqlite".into());
        config.ledger.url = Some("postgres://u@h/db".into());
        config.prices.insert(
            "m*".into(),
            crate::config::PriceConfig { input: 1.0, output: 1.0, cache_read: Some(0.1), cache_write: Some(1.25) },
        );
        config.telemetry = crate::config::TelemetryConfig {
            endpoint: Some("http://c:4318".into()),
            protocol: Some("grpc".into()),
            headers: [("a".to_string(), "b".to_string())].into(),
            headers_env: [("a".to_string(), "B".to_string())].into(),
            sampling: Some(0.5),
            parent_based: Some(true),
            service_name: Some("s".into()),
            resource: [("a".to_string(), "b".to_string())].into(),
            propagate_upstream: true,
            queue_max: Some(1),
            timeout_ms: Some(100),
        };
        config.policy.cache_dir = Some("/tmp".into());
        config.models.aliases.insert("gpt-4o".into(), "claude-sonnet-4-5".into());
        config.fallback.push(crate::config::FallbackConfig {
            name: "f".into(),
            base_url: "http://x".into(),
            api_key_env: Some("K".into()),
            model: "m".into(),
            cooldown_ms: 1,
        });
        config.policy.instances = Some(1);
        config.policy.max_instances = Some(2);
        config.state.url = Some("redis://127.0.0.1:1".into());
        config.state.replica = Some("r".into());
        config.state.file = Some("state.json".into());
        config.policy.chain.push(crate::config::StageConfig {
            plugin: "p".into(),
            name: Some("n".into()),
            scope: Some("s".into()),
            timeout_ms: Some(1),
            memory_mb: Some(1),
            freshness_ms: Some(1_000),
            config: Some(toml::Table::new()),
        });
        config.accounts.push(crate::config::AccountConfig {
            id: "a".into(),
            alias: Some("a".into()),
            api_key_env: Some("E".into()),
            token_file: Some("/f".into()),
            credentials: Some("/c".into()),
            base_url: Some("http://x".into()),
            max_in_flight: Some(1),
            overflow: Some(true),
            ..Default::default()
        });
        let value = toml::Value::try_from(&config).unwrap();
        walk(&value, ROOT, "");
    }
}
