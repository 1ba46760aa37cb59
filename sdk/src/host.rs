//! What a plugin may ask of the host: logging and a small key-value state store.
//!
//! State is scoped to the plugin's name, so it survives instance replacement and a
//! hot swap to a new version of the same plugin. Expiry is measured against the
//! request's `now-ms`, which keeps fixture runs reproducible.

use crate::bindings::poolgate::policy::host as wit;

/// Logging into the gateway's log, tagged with the plugin and request.
pub mod log {
    use super::wit;

    /// Logs at debug level.
    pub fn debug(message: &str) {
        wit::log(wit::Level::Debug, message);
    }
    /// Logs at info level.
    pub fn info(message: &str) {
        wit::log(wit::Level::Info, message);
    }
    /// Logs at warn level.
    pub fn warn(message: &str) {
        wit::log(wit::Level::Warn, message);
    }
    /// Logs at error level.
    pub fn error(message: &str) {
        wit::log(wit::Level::Error, message);
    }
}

/// The plugin-scoped key-value store.
pub mod state {
    use super::wit;

    /// Reads `key`.
    pub fn get(key: &str) -> Option<String> {
        wit::state_get(key)
    }
    /// Writes `key`; with `ttl_ms`, it expires that long after the request's now.
    pub fn set(key: &str, value: &str, ttl_ms: Option<u64>) {
        wit::state_set(key, value, ttl_ms)
    }
    /// Removes `key`.
    pub fn delete(key: &str) {
        wit::state_delete(key)
    }
    /// Caps this plugin's scope at `max_entries`, evicting the least recently
    /// written entries beyond it.
    pub fn limit(max_entries: u32) {
        wit::state_limit(max_entries)
    }
}

/// How old a quota reading may be and still count as fresh, ms: what the
/// operator configured for this stage (see [`crate::quota`]). Asked once per
/// instance, at `configure`; rankers read it from [`crate::Pool::freshness_ms`]
/// (a host older than WIT 0.1.1 cannot run a plugin that asks).
pub fn freshness_ms() -> u64 {
    wit::freshness_ms()
}

/// Resolves an interned window name. The answer is cached in the instance for
/// good: window names are few, ids are small and never reused, so each costs one
/// host call per instance and an array index after that.
pub fn window_name(id: u32) -> &'static str {
    use std::cell::RefCell;
    thread_local! {
        static NAMES: RefCell<Vec<Option<&'static str>>> = const { RefCell::new(Vec::new()) };
    }
    NAMES.with_borrow_mut(|names| {
        let i = id as usize;
        if let Some(Some(name)) = names.get(i) {
            return *name;
        }
        let name: &'static str = Box::leak(wit::window_name(id).into_boxed_str());
        if names.len() <= i {
            names.resize(i + 1, None);
        }
        names[i] = Some(name);
        name
    })
}
