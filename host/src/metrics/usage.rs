//! Usage by client key and model — requests, tokens by kind, cost — as the
//! ledger counts it. Each (key, model)'s counters are resolved once and kept,
//! so a request's end finds them with one lookup and no allocation; the
//! `model` label takes at most [`MODEL_LABELS_MAX`] values.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;

use super::{Metrics, Text};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KeyModelKind {
    pub(super) key: Text,
    pub(super) model: Text,
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KeyModel {
    pub(super) key: Text,
    pub(super) model: Text,
}

/// The most distinct `model` label values per process: a client may name any
/// model, so past this many the rest are counted as `other`.
pub const MODEL_LABELS_MAX: usize = 32;

/// Token counters by kind, resolved once for one label set.
pub(super) struct KindCounters {
    input: Counter,
    output: Counter,
    cache_read: Counter,
    cache_creation: Counter,
}

impl KindCounters {
    /// The four counters, `kind` making each from its kind's label value.
    pub(super) fn new(kind: impl Fn(&'static str) -> Counter) -> KindCounters {
        KindCounters {
            input: kind("input"),
            output: kind("output"),
            cache_read: kind("cache_read"),
            cache_creation: kind("cache_creation"),
        }
    }

    /// Adds what `usage` reported (a kind at zero is left untouched, so an
    /// answer without usage makes no series).
    pub(super) fn add(&self, usage: &poolgate_wire::usage::Usage) {
        for (counter, n) in [
            (&self.input, usage.input_tokens),
            (&self.output, usage.output_tokens),
            (&self.cache_read, usage.cache_read_input_tokens),
            (&self.cache_creation, usage.cache_creation_input_tokens),
        ] {
            if n > 0 {
                counter.inc_by(n);
            }
        }
    }
}

/// One (key, model)'s usage counters.
pub(super) struct UsageHandles {
    pub(super) requests: Counter,
    pub(super) tokens: KindCounters,
    pub(super) cost: Counter<f64, std::sync::atomic::AtomicU64>,
}

/// The usage counters by key and model, and the model labels given out.
#[derive(Default)]
pub(super) struct UsageTable {
    pub(super) by_key:
        std::collections::HashMap<String, std::collections::HashMap<String, std::sync::Arc<UsageHandles>>>,
    pub(super) models: std::collections::HashSet<String>,
}

impl Metrics {
    /// Usage by client key and model, as the ledger counts it.
    pub(super) fn register_usage(&mut self) {
        let r = &mut self.registry;
        r.register(
            "poolgate_client_requests",
            "Requests answered, by client key and model (at most 32 model values; the rest are \"other\")",
            self.client_requests.clone(),
        );
        r.register(
            "poolgate_client_tokens",
            "Tokens answers reported, by client key, model and kind (input, output, cache_read, cache_creation)",
            self.client_tokens.clone(),
        );
        r.register(
            "poolgate_client_cost_usd",
            "What answers cost at the configured prices, USD, by client key and model",
            self.client_cost.clone(),
        );
    }

    /// A request's usage, by the client key's name and the model asked for.
    pub fn usage(&self, key: &str, model: &str, usage: &poolgate_wire::usage::Usage, cost_nano: Option<u64>) {
        let handles = {
            let mut table = self.usage_handles.lock();
            match table.by_key.get(key).and_then(|m| m.get(model)) {
                Some(h) => h.clone(),
                None => self.resolve(&mut table, key, model),
            }
        };
        handles.requests.inc();
        handles.tokens.add(usage);
        if let Some(nano) = cost_nano.filter(|c| *c > 0) {
            handles.cost.inc_by(nano as f64 / 1e9);
        }
    }

    /// The counters of (`key`, `model`), made once; past
    /// [`MODEL_LABELS_MAX`] models, a new one counts as `other`.
    fn resolve(&self, table: &mut UsageTable, key: &str, model: &str) -> std::sync::Arc<UsageHandles> {
        let label = bounded_model(&mut table.models, model);
        // Kept by label, so made-up models add nothing past the first 32.
        if let Some(h) = table.by_key.get(key).and_then(|m| m.get(label)) {
            return h.clone();
        }
        let km = KeyModel { key: key.into(), model: label.into() };
        let kind = |kind| {
            self.client_tokens.get_or_create(&KeyModelKind { key: key.into(), model: label.into(), kind }).clone()
        };
        let handles = std::sync::Arc::new(UsageHandles {
            requests: self.client_requests.get_or_create(&km).clone(),
            tokens: KindCounters::new(kind),
            cost: self.client_cost.get_or_create(&km).clone(),
        });
        table.by_key.entry(key.to_string()).or_default().insert(label.to_string(), handles.clone());
        handles
    }
}

/// The `model` label for `model`: itself while fewer than
/// [`MODEL_LABELS_MAX`] models were given one (`models`, kept by the
/// caller), else `other`.
pub(super) fn bounded_model<'m>(models: &mut std::collections::HashSet<String>, model: &'m str) -> &'m str {
    if models.contains(model) || models.len() < MODEL_LABELS_MAX {
        models.insert(model.to_string());
        model
    } else {
        "other"
    }
}
