//! Tokens by the account that answered, the model and the kind: what each
//! upstream account spends, where `usage.rs` counts by client key. An
//! operator watching a seat's quota drain wants to know which model drains
//! it; the client key says who asked, this says who paid.
//!
//! As in `usage.rs`, each (account, model)'s counters are resolved once, so a
//! request's end costs one lookup and at most four atomic increments; the
//! `model` label takes at most [`super::MODEL_LABELS_MAX`] values.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;

use super::usage::{KindCounters, bounded_model};
use super::{Metrics, Text};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AccountModelKind {
    account: Text,
    model: Text,
    kind: &'static str,
}

/// The token counters by account and model, and the model labels given out.
#[derive(Default)]
pub(super) struct TokenTable {
    by_account: HashMap<String, HashMap<String, Arc<KindCounters>>>,
    models: HashSet<String>,
}

impl Metrics {
    pub(super) fn register_tokens(&mut self) {
        self.registry.register(
            "poolgate_tokens",
            "Tokens answers reported, by the account that answered (a fallback as fallback:<backend>/<model>), the \
             model (at most 32 values; the rest are \"other\") and kind (input, output, cache_read, cache_creation)",
            self.account_tokens.clone(),
        );
    }

    /// The tokens an answer of `account` for `model` reported.
    pub fn tokens(&self, account: &str, model: &str, usage: &poolgate_wire::usage::Usage) {
        if usage.total() == 0 {
            return;
        }
        let handles = {
            let mut table = self.token_handles.lock();
            match table.by_account.get(account).and_then(|m| m.get(model)) {
                Some(h) => h.clone(),
                None => self.resolve_tokens(&mut table, account, model),
            }
        };
        handles.add(usage);
    }

    /// The counters of (`account`, `model`), made once (see
    /// [`bounded_model`]).
    fn resolve_tokens(&self, table: &mut TokenTable, account: &str, model: &str) -> Arc<KindCounters> {
        let label = bounded_model(&mut table.models, model);
        if let Some(h) = table.by_account.get(account).and_then(|m| m.get(label)) {
            return h.clone();
        }
        let kind = |kind| {
            let labels = AccountModelKind { account: account.into(), model: label.into(), kind };
            self.account_tokens.get_or_create(&labels).clone()
        };
        let handles = Arc::new(KindCounters::new(kind));
        table.by_account.entry(account.to_string()).or_default().insert(label.to_string(), handles.clone());
        handles
    }
}

#[cfg(test)]
mod tests {
    use super::super::MODEL_LABELS_MAX;
    use super::*;
    use poolgate_wire::usage::Usage;

    fn usage(input: u64, output: u64, read: u64, created: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: created,
        }
    }

    #[test]
    fn tokens_count_by_account_model_and_kind() {
        let m = Metrics::default();
        m.tokens("seat-a", "claude-opus-4-1", &usage(10, 5, 100, 7));
        m.tokens("seat-a", "claude-opus-4-1", &usage(1, 1, 0, 0));
        m.tokens("seat-b", "claude-opus-4-1", &usage(0, 0, 0, 0));
        let text = m.render(&[]);
        let line = |kind: &str, n: u64| {
            format!("poolgate_tokens_total{{account=\"seat-a\",model=\"claude-opus-4-1\",kind=\"{kind}\"}} {n}\n")
        };
        for (kind, n) in [("input", 11), ("output", 6), ("cache_read", 100), ("cache_creation", 7)] {
            assert!(text.contains(&line(kind, n)), "{kind}: {text}");
        }
        assert!(!text.contains("account=\"seat-b\""), "an answer without usage makes no series: {text}");
    }

    #[test]
    fn past_the_bound_new_models_count_as_other() {
        let m = Metrics::default();
        for i in 0..MODEL_LABELS_MAX + 5 {
            m.tokens("a", &format!("made-up-{i}"), &usage(1, 0, 0, 0));
        }
        let text = m.render(&[]);
        let models = text.lines().filter(|l| l.starts_with("poolgate_tokens_total{") && l.contains("kind=\"input\""));
        assert_eq!(models.count(), MODEL_LABELS_MAX + 1, "{text}");
        assert!(text.contains("poolgate_tokens_total{account=\"a\",model=\"other\",kind=\"input\"} 5\n"), "{text}");
    }
}
