//! Interned quota-window names.
//!
//! Window names ("5h", "7d", "7d_oi", ...) cross into guests as numbers: a string
//! per window per request would cost a guest allocation each. Ids are assigned on
//! first sight and never reused, so a guest may cache what `window-name` returns.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

#[derive(Default)]
struct Table {
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
}

static TABLE: LazyLock<RwLock<Table>> = LazyLock::new(Default::default);

/// The id of `name`, interning it on first sight.
pub fn intern(name: &str) -> u32 {
    if let Some(&id) = TABLE.read().ids.get(name) {
        return id;
    }
    let mut t = TABLE.write();
    if let Some(&id) = t.ids.get(name) {
        return id;
    }
    let id = t.names.len() as u32;
    let name: Arc<str> = Arc::from(name);
    t.names.push(name.clone());
    t.ids.insert(name, id);
    id
}

/// The name behind `id` (empty for an id never handed out).
pub fn resolve(id: u32) -> Arc<str> {
    TABLE.read().names.get(id as usize).cloned().unwrap_or_else(|| Arc::from(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_resolves_back() {
        let a = intern("7d_test_bucket");
        assert_eq!(intern("7d_test_bucket"), a);
        assert_ne!(intern("7d_other_bucket"), a);
        assert_eq!(&*resolve(a), "7d_test_bucket");
        assert_eq!(&*resolve(u32::MAX), "");
    }
}
