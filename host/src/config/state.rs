//! `[state]`: where what the gateway learns is kept — in this process (the
//! default, nothing shared), or in Redis, shared by every replica that names
//! the same server and key prefix. What is shared and how fresh it is:
//! `crate::shared`.
//!
//! And the state file, which carries a single gateway's learned state across
//! a restart (`gateway::persist`): on by default with the `memory` backend,
//! in the state directory rather than beside the config (which may be
//! read-only), named after the config file so that two gateways on one
//! machine never share one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Which state backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In this process only: a single gateway.
    #[default]
    Memory,
    /// Shared through a Redis server by every replica with the same prefix.
    Redis,
}

/// `[state]`. Durations in ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// `memory` or `redis`.
    pub backend: Backend,
    /// The Redis server: `redis://[user:password@]host:port[/db]`, or
    /// `rediss://…` for TLS. Never logged with its password.
    pub url: Option<String>,
    /// Prefix of every key and channel this pool uses: replicas of one pool
    /// share it; two pools on one Redis use two.
    pub key_prefix: String,
    /// This replica's name in Redis (default: host name, process id and a
    /// random suffix, so a restart is a new replica).
    pub replica: Option<String>,
    /// How often what this replica learned is written to Redis.
    pub flush_ms: u64,
    /// How often every shared record is re-read, in case a change
    /// notification was missed.
    pub poll_ms: u64,
    /// Longest wait for one Redis command off the request path.
    pub timeout_ms: u64,
    /// Longest a request waits for a shared in-flight lease before it is
    /// admitted on this replica's count alone.
    pub lease_wait_ms: u64,
    /// How long an in-flight lease lives without renewal (a replica that
    /// dies gives its slots back after this).
    pub lease_ttl_ms: u64,
    /// How long one replica may hold a seat's refresh lock.
    pub refresh_lock_ms: u64,
    /// Whether OAuth seats' rotated credentials are shared through Redis (so
    /// replicas on different machines adopt one refresh); off, replicas
    /// share a refresh only through a shared credentials file.
    pub share_credentials: bool,
    /// The state file: unset, the default ([`StateConfig::locate_file`]);
    /// `""`, none; else this path (relative to the config file's directory).
    pub file: Option<String>,
    /// How often the state file is written when something changed, ms (and
    /// once more at shutdown).
    pub file_write_ms: u64,
    /// The state file in force, resolved when the config file was loaded.
    #[serde(skip)]
    pub file_path: Option<PathBuf>,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: Backend::Memory,
            url: None,
            key_prefix: "poolgate:".into(),
            replica: None,
            flush_ms: 50,
            poll_ms: 1_000,
            timeout_ms: 500,
            lease_wait_ms: 50,
            lease_ttl_ms: 15_000,
            refresh_lock_ms: 60_000,
            share_credentials: true,
            file: None,
            file_write_ms: 1_000,
            file_path: None,
        }
    }
}

impl StateConfig {
    /// Whether replicas share state.
    pub fn shared(&self) -> bool {
        self.backend == Backend::Redis
    }

    /// Resolves [`StateConfig::file`] for a config loaded from `config_path`:
    /// a path given is taken relative to the config file's directory; `""`
    /// means none; unset means `state-<hash>.json` in `default_dir`, the
    /// hash being of the config file's absolute path — with the `memory`
    /// backend only. With `redis` the default is none: Redis keeps what
    /// replicas learn (records a day, plugin state with its TTLs), and a
    /// replica that restarts reads it back before it serves, so a file would
    /// only hold it twice.
    pub fn locate_file(&mut self, config_path: &Path) {
        let default = (!self.shared()).then_some("state");
        self.file_path = locate(self.file.as_deref(), config_path, default, "json");
    }

    /// The URL with its password replaced, for logs and `/status`.
    pub fn redacted_url(&self) -> String {
        redact(self.url.as_deref().unwrap_or(""))
    }
}

/// Where state files go by default: systemd's `$STATE_DIRECTORY` (a unit
/// with `StateDirectory=poolgate`), else `$XDG_STATE_HOME/poolgate`
/// (`~/.local/state/poolgate`), else the user's cache directory (systems
/// without a state directory).
pub fn default_dir() -> Option<PathBuf> {
    let systemd = std::env::var_os("STATE_DIRECTORY")
        .and_then(|v| v.to_str().and_then(|s| s.split(':').next()).map(PathBuf::from))
        .filter(|p| p.is_absolute());
    systemd.or_else(|| dirs::state_dir().or_else(dirs::cache_dir).map(|d| d.join("poolgate")))
}

/// Where a file of this configuration's (`file`: the config's setting) is:
/// `""` none; a path, relative to the config file's directory; unset,
/// `<what>-<hash>.<ext>` in the state directory ([`per_config_name`]) — or
/// none where `what` is `None`.
pub fn locate(file: Option<&str>, config_path: &Path, what: Option<&str>, ext: &str) -> Option<PathBuf> {
    match file {
        Some("") => None,
        Some(f) => {
            let f = Path::new(f);
            Some(if f.is_relative() { config_path.parent().unwrap_or(Path::new(".")).join(f) } else { f.into() })
        }
        None => default_dir().zip(what).map(|(d, what)| d.join(per_config_name(what, config_path, ext))),
    }
}

/// `<what>-<16 hex digits>.<ext>`: a file name of this configuration's own
/// (the state file, the usage ledger).
pub fn per_config_name(what: &str, config_path: &Path, ext: &str) -> String {
    let absolute = std::fs::canonicalize(config_path)
        .or_else(|_| std::path::absolute(config_path))
        .unwrap_or_else(|_| config_path.to_path_buf());
    let digest = Sha256::digest(absolute.as_os_str().as_encoded_bytes());
    format!("{what}-{}.{ext}", &hex::encode(digest)[..16])
}

/// `url` with its password hidden: the user info before the last `@` (a
/// password may hold `/`, `?` or `#` unencoded), and any query, which
/// redis-rs reads a `pass`/`password` from on socket URLs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "***".into() };
    let (rest, query) = match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or("***", |(u, _)| u);
            let host = host.split_once('?').map_or(host, |(h, _)| h);
            let had_query = rest.rsplit_once('@').is_some_and(|(_, h)| h.contains('?'));
            (format!("{user}:***@{host}"), had_query)
        }
        None => match rest.split_once('?') {
            Some((r, _)) => (r.to_string(), true),
            None => (rest.to_string(), false),
        },
    };
    if query { format!("{scheme}://{rest}?***") } else { format!("{scheme}://{rest}") }
}

/// Why `prefix` cannot be a key prefix: characters a `SCAN` pattern reads as
/// wildcards, or spaces and controls that make keys unreadable.
pub fn prefix_problem(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some("must not be empty: two pools on one Redis would mix their state".into());
    }
    if prefix.len() > 100 {
        return Some("is longer than 100 bytes".into());
    }
    let bad = prefix.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-' | '.' | '/')));
    bad.map(|c| format!("holds {c:?}; use letters, digits and `:_-./`"))
}

/// The meaning checks of `[state]`: a shared backend needs a server it can
/// name, a prefix that cannot match another pool's keys, and a refresh lock
/// that outlives a refresh.
pub(super) fn check(s: &StateConfig, oauth: &super::OAuthConfig, add: &mut impl FnMut(String, String)) {
    if let Some(problem) = prefix_problem(&s.key_prefix) {
        add("state.key_prefix".into(), problem);
    }
    if s.replica.as_deref().is_some_and(|r| r.is_empty() || r.chars().any(|c| c.is_control() || c == '|')) {
        add("state.replica".into(), "must be a non-empty name without control characters or `|`".into());
    }
    match (s.shared(), s.url.as_deref()) {
        (true, None) => add(
            "state.url".into(),
            "backend = \"redis\" needs the server, e.g. url = \"redis://127.0.0.1:6379\"".into(),
        ),
        (true, Some(url)) => {
            let schemes = ["redis://", "rediss://", "unix://", "redis+unix://"];
            if !schemes.iter().any(|p| url.starts_with(p)) {
                add(
                    "state.url".into(),
                    format!("`{}` is not a Redis URL (redis://, rediss:// for TLS, or unix://)", redact(url)),
                );
            } else if redis::Client::open(url).is_err() {
                // redis-rs's own message may quote the URL: never the password.
                add("state.url".into(), format!("`{}` does not parse as a Redis URL", redact(url)));
            }
        }
        (false, _) => {}
    }
    if s.lease_wait_ms >= s.timeout_ms.max(2) {
        add("state.lease_wait_ms".into(), format!("{} is not below timeout_ms ({})", s.lease_wait_ms, s.timeout_ms));
    }
    // A refresh may take the token endpoint's timeout twice (answer, then
    // body): a lock that lapsed meanwhile would let a second replica spend
    // the same refresh token.
    if s.shared() && s.refresh_lock_ms <= 2 * oauth.timeout_ms {
        add(
            "state.refresh_lock_ms".into(),
            format!(
                "{} is not above twice oauth.timeout_ms ({}): the lock could lapse during a refresh",
                s.refresh_lock_ms, oauth.timeout_ms
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://:hunter2@10.0.0.1:6379/0"), "redis://:***@10.0.0.1:6379/0");
        assert_eq!(redact("rediss://app:hunter2@cache:6380"), "rediss://app:***@cache:6380");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert!(!redact("redis://hunter2@h:1").contains("hunter2"));
        assert_eq!(redact("redis://:pa/ss?w#rd@h:1/2"), "redis://:***@h:1/2");
        assert_eq!(redact("unix:///run/redis.sock?pass=hunter2"), "unix:///run/redis.sock?***");
        assert_eq!(redact("not a url hunter2"), "***");
    }

    #[test]
    fn the_state_file_is_off_with_an_empty_path_relative_to_the_config_and_by_default_per_config() {
        let mut s = StateConfig { file: Some("".into()), ..StateConfig::default() };
        s.locate_file(Path::new("/etc/poolgate/poolgate.toml"));
        assert_eq!(s.file_path, None);
        s.file = Some("state/learned.json".into());
        s.locate_file(Path::new("/etc/poolgate/poolgate.toml"));
        assert_eq!(s.file_path.as_deref(), Some(Path::new("/etc/poolgate/state/learned.json")));
        s.file = None;
        s.locate_file(Path::new("/etc/poolgate/a.toml"));
        let a = s.file_path.clone();
        s.locate_file(Path::new("/etc/poolgate/b.toml"));
        if let (Some(a), Some(b)) = (a, s.file_path.clone()) {
            assert_ne!(a, b, "two configs, two files");
            assert!(a.file_name().unwrap().to_str().unwrap().starts_with("state-"));
        }
        // Replicas keep it in Redis.
        let mut r = StateConfig { backend: Backend::Redis, ..StateConfig::default() };
        r.locate_file(Path::new("/etc/poolgate/a.toml"));
        assert_eq!(r.file_path, None);
        r.file = Some("/var/lib/poolgate/state.json".into());
        r.locate_file(Path::new("/etc/poolgate/a.toml"));
        assert!(r.file_path.is_some(), "unless the operator names one");
    }

    #[test]
    fn prefixes_that_would_match_other_keys_are_refused() {
        assert!(prefix_problem("poolgate:").is_none());
        assert!(prefix_problem("team-a/pool.1:").is_none());
        assert!(prefix_problem("").is_some());
        assert!(prefix_problem("a*").is_some());
        assert!(prefix_problem("a b").is_some());
    }
}
