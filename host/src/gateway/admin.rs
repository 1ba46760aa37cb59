//! Operators acting on accounts at run time, with the admin token:
//!
//! - `POST /admin/accounts/{id}/clear` lifts the account's cooldown and its
//!   model gates (a stale 15-minute cooldown used to outlive a SIGHUP: only a
//!   restart cleared it, and a restart forgot everything else too);
//! - `POST /admin/accounts/{id}/disable` takes it out of routing, and
//!   `…/enable` puts it back: a disable holds across reloads and, with a
//!   state file, restarts (`AccountState::disable` says why).
//!
//! The body is optional JSON: `by` (who acts, as the operator names themselves;
//! there is one admin token, so the gateway cannot tell), `note` (why), and
//! for `clear`, `cooldown` (default `true`) and `gates` (`true` — the
//! default — for every gate, `false` for none, or a list of families). Every
//! action is logged (`poolgate::admin`) and kept in `/status` under
//! `admin_actions`, the last [`ACTIONS_KEPT`].

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Gateway;
use crate::learned::accounts::AccountState;

/// Admin actions kept for `/status`.
pub const ACTIONS_KEPT: usize = 100;

/// The longest `by` or `note` kept, in characters.
pub const TEXT_CHARS: usize = 200;

/// What an operator can do to an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// Lift its cooldown and/or model gates.
    Clear,
    /// Take it out of routing.
    Disable,
    /// Route to it again.
    Enable,
}

impl Act {
    /// The action named by the last segment of its route.
    pub fn parse(name: &str) -> Option<Act> {
        match name {
            "clear" => Some(Act::Clear),
            "disable" => Some(Act::Disable),
            "enable" => Some(Act::Enable),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Act::Clear => "clear",
            Act::Disable => "disable",
            Act::Enable => "enable",
        }
    }
}

/// `gates` in a clear: all, none, or these families.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Gates {
    /// `true`: every gate; `false`: none.
    All(bool),
    /// These families.
    Families(Vec<String>),
}

/// The body of an admin action (every field optional; an empty body is `{}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    /// Who acts.
    pub by: Option<String>,
    /// Why.
    pub note: Option<String>,
    /// `clear` only: lift the cooldown (default `true`).
    pub cooldown: Option<bool>,
    /// `clear` only: which model gates to lift (default: all).
    pub gates: Option<Gates>,
}

/// Why an action was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No configured account has this id.
    UnknownAccount(String),
}

/// Reads the body of `act`: empty is `{}`; anything else must be a JSON
/// object with the fields `act` takes.
pub fn parse_body(act: Act, bytes: &[u8]) -> Result<ActionBody, String> {
    let body: ActionBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        ActionBody::default()
    } else {
        serde_json::from_slice(bytes).map_err(|e| format!("poolgate: the body must be a JSON object: {e}"))?
    };
    if act != Act::Clear && (body.cooldown.is_some() || body.gates.is_some()) {
        return Err("poolgate: `cooldown` and `gates` apply to …/clear only".into());
    }
    if act == Act::Clear && body.cooldown == Some(false) && matches!(body.gates, Some(Gates::All(false))) {
        return Err("poolgate: nothing to clear: `cooldown` and `gates` are both false".into());
    }
    Ok(body)
}

/// `text` as one printable line of at most [`TEXT_CHARS`] characters: what an
/// operator typed goes into logs and `/status`, so it must not forge a line.
fn clean(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(TEXT_CHARS).collect::<String>().trim().to_string()
}

/// One action, as kept.
#[derive(Debug, Clone, Serialize)]
pub struct AdminAction {
    /// When.
    pub at_ms: u64,
    /// What.
    pub action: Act,
    /// On which account.
    pub account: String,
    /// Who (as they said; `admin` when they did not).
    pub by: String,
    /// Why, as they said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What it changed, in words (`lifted cooldown overloaded; no gates`,
    /// `already disabled`).
    pub result: String,
}

/// The last [`ACTIONS_KEPT`] admin actions.
#[derive(Default)]
pub struct AdminLog {
    kept: Mutex<VecDeque<AdminAction>>,
}

impl AdminLog {
    /// Logs `a` and keeps it.
    pub fn record(&self, a: AdminAction) {
        tracing::info!(
            target: "poolgate::admin",
            action = a.action.as_str(),
            account = %a.account.escape_debug(),
            by = %a.by.escape_debug(),
            note = %a.note.as_deref().unwrap_or("-").escape_debug(),
            result = %a.result,
            "admin action"
        );
        let mut k = self.kept.lock();
        if k.len() >= ACTIONS_KEPT {
            k.pop_front();
        }
        k.push_back(a);
    }

    /// Newest first.
    pub fn latest(&self) -> Vec<AdminAction> {
        self.kept.lock().iter().rev().cloned().collect()
    }
}

/// The state of configured account `id` (enabled or not).
fn account(gw: &Gateway, id: &str) -> Option<Arc<AccountState>> {
    let g = gw.generation();
    let enabled = g.accounts.iter().find(|a| a.config.id == id).map(|a| a.state.clone());
    enabled.or_else(|| g.disabled.iter().find(|(c, _)| c.id == id).map(|(_, s)| s.clone()))
}

/// Does `act` to account `id` at `now`: the answer's JSON, or why not. Every
/// action that reaches an account is logged and kept, a no-op included.
pub fn act(gw: &Arc<Gateway>, act: Act, id: &str, body: ActionBody, now: u64) -> Result<Value, Refusal> {
    let Some(state) = account(gw, id) else { return Err(Refusal::UnknownAccount(id.to_string())) };
    let by = body.by.as_deref().map(clean).filter(|b| !b.is_empty()).unwrap_or_else(|| "admin".into());
    let note = body.note.as_deref().map(clean).filter(|n| !n.is_empty());
    let (answer, result) = match act {
        Act::Clear => {
            let families = match &body.gates {
                None | Some(Gates::All(true)) => Some(None),
                Some(Gates::All(false)) => None,
                Some(Gates::Families(f)) => Some(Some(f.as_slice())),
            };
            let cleared = match families {
                Some(gates) => state.clear(body.cooldown != Some(false), gates, now),
                None => state.clear(true, Some(&[]), now),
            };
            let mut said = Vec::new();
            match cleared.cooldown {
                Some(c) => said.push(format!("lifted cooldown {}", c.reason.as_str())),
                None if body.cooldown != Some(false) => said.push("no cooldown in force".into()),
                None => {}
            }
            let gates: Vec<&str> = cleared.gates.iter().map(|g| g.family.as_str()).collect();
            if families.is_some() {
                said.push(if gates.is_empty() {
                    "no gates".into()
                } else {
                    format!("lifted gates {}", gates.join(","))
                });
            }
            (json!({ "cleared": cleared }), said.join("; "))
        }
        Act::Disable => match state.disable(&by, note.clone(), now) {
            Ok(d) => (json!({ "changed": true, "disabled": d }), "disabled".to_string()),
            Err(d) => (json!({ "changed": false, "disabled": d }), "already disabled".to_string()),
        },
        Act::Enable => match state.enable() {
            Some(was) => (json!({ "changed": true, "was": was }), "enabled".to_string()),
            None => (json!({ "changed": false, "was": null }), "was not disabled".to_string()),
        },
    };
    gw.admin.record(AdminAction { at_ms: now, action: act, account: id.to_string(), by: by.clone(), note, result });
    // Kept now rather than at the next check: an operator's act is rare, and
    // the restart that may follow it must not lose it.
    gw.save_state_soon();
    let mut answer = answer;
    answer["ok"] = json!(true);
    answer["account"] = json!(id);
    answer["action"] = json!(act);
    answer["by"] = json!(by);
    Ok(answer)
}

/// After a reload: says which accounts of the new configuration stay out of
/// routing because an operator disabled them (a reload never re-enables one).
pub fn note_reload(gw: &Gateway) {
    let g = gw.generation();
    for a in &g.accounts {
        if let Some(d) = a.state.runtime_disabled() {
            tracing::warn!(
                account = %a.config.id.escape_debug(),
                since_ms = d.at_ms,
                by = %d.by.escape_debug(),
                "the account stays disabled at run time across the reload; POST /admin/accounts/<id>/enable routes to it again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_optional_strict_and_fit_their_action() {
        assert_eq!(parse_body(Act::Disable, b"").unwrap(), ActionBody::default());
        assert_eq!(parse_body(Act::Enable, b" \n").unwrap(), ActionBody::default());
        let b = parse_body(Act::Clear, br#"{"gates":["opus"],"cooldown":false,"by":"alice"}"#).unwrap();
        assert_eq!(b.gates, Some(Gates::Families(vec!["opus".into()])));
        assert_eq!(parse_body(Act::Clear, br#"{"gates":false}"#).unwrap().gates, Some(Gates::All(false)));
        assert!(parse_body(Act::Clear, b"{not json").unwrap_err().contains("JSON object"));
        assert!(parse_body(Act::Clear, br#"{"colour":1}"#).is_err(), "an unknown field is a mistake, not ignored");
        assert!(parse_body(Act::Disable, br#"{"cooldown":true}"#).unwrap_err().contains("clear only"));
        assert!(parse_body(Act::Clear, br#"{"cooldown":false,"gates":false}"#).unwrap_err().contains("nothing"));
    }

    #[test]
    fn what_an_operator_types_cannot_forge_a_line_or_grow_without_bound() {
        assert_eq!(clean("alice\nrequest=1 status=200"), "alicerequest=1 status=200");
        assert_eq!(clean(&"x".repeat(1000)).len(), TEXT_CHARS);
        assert_eq!(Act::parse("disable"), Some(Act::Disable));
        assert_eq!(Act::parse("delete"), None);
    }
}
