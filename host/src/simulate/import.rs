//! A recorded day as a workload: the gateway's own decision records, so a
//! day the pool served can be replayed against another policy.
//!
//! Reads what `GET /admin/decisions` answers (a JSON array) or the JSON log
//! lines of `poolgate serve --log-format json` (each request's record is the
//! `record` field of a `poolgate::decision` line; other lines are skipped).
//! Messages and Chat Completions requests become entries, in time order,
//! keeping their time of day (the first day is the replay's Monday), their
//! session (a request without one is a session of its own), client key and
//! model.
//!
//! A decision record does not hold the answer's token counts, so each entry
//! gets a typical request of its model family — Claude Code's context read
//! from the cache, a few thousand tokens written, a few hundred out (the
//! [`TYPICAL`] table) — and the replay compares where requests go, switches
//! and parking on the recorded timing, with token figures that are estimates.

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::trace::Entry;

const DAY_MS: u64 = 86_400_000;

/// Per model family: input, output, cache-read and cache-creation tokens of
/// a typical request (the generator's medians).
pub const TYPICAL: [(&str, [u64; 4]); 3] =
    [("opus", [30, 775, 60_000, 3_150]), ("sonnet", [30, 775, 60_000, 3_150]), ("haiku", [30, 775, 9_000, 3_150])];

/// The workload a decision log holds; `name` names the input in errors.
pub fn from_decisions(text: &str, name: &str) -> Result<Vec<Entry>> {
    let records: Vec<Value> = if text.trim_start().starts_with('[') {
        serde_json::from_str(text).with_context(|| format!("{name}: not a JSON array of decision records"))?
    } else {
        text.lines().filter_map(|l| record_of(l.trim())).collect()
    };
    let mut requests: Vec<(u64, u64, Entry)> = records.iter().filter_map(entry).collect();
    if requests.is_empty() {
        bail!("{name}: no Messages or Chat Completions decision records in it");
    }
    requests.sort_by_key(|(at, id, _)| (*at, *id));
    let first_midnight = requests[0].0 / DAY_MS * DAY_MS;
    Ok(requests
        .into_iter()
        .map(|(at, _, mut e)| {
            e.t_ms = at - first_midnight;
            e
        })
        .collect())
}

/// The decision record a line holds: a record itself, or a log line's
/// `record` field (under `fields`, as poolgate writes it, or at the top),
/// as an object or a JSON string.
fn record_of(line: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(line).ok()?;
    if v.get("at_ms").is_some() {
        return Some(v);
    }
    let inner = v.get("record").or_else(|| v.get("fields")?.get("record"))?;
    match inner {
        Value::String(s) => serde_json::from_str(s).ok(),
        Value::Object(_) => Some(inner.clone()),
        _ => None,
    }
}

/// A record as (time, request id, entry); `None` for what is not a request
/// to replay (count_tokens, models, a record without its fields).
fn entry(r: &Value) -> Option<(u64, u64, Entry)> {
    if !matches!(r.get("api")?.as_str()?, "messages" | "chat_completions") {
        return None;
    }
    let at = r.get("at_ms")?.as_u64()?;
    let id = r.get("id").and_then(Value::as_u64).unwrap_or(0);
    let model = r.get("model")?.as_str()?.to_string();
    let session = r.get("session").and_then(Value::as_str).map_or_else(|| format!("request-{id}"), str::to_string);
    let family = crate::account::model_family(&model).unwrap_or("sonnet");
    let [input, output, read, written] = TYPICAL.iter().find(|(f, _)| *f == family).map_or(TYPICAL[1].1, |t| t.1);
    let e = Entry {
        t_ms: 0,
        session,
        client: r.get("client").and_then(Value::as_str).map(str::to_string),
        model,
        input_tokens: input,
        output_tokens: output,
        cache_read_tokens: read,
        cache_creation_tokens: written,
        stream: r.get("stream").and_then(Value::as_bool).unwrap_or(false),
    };
    Some((at, id, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_records_from_the_admin_endpoint_or_the_json_log_become_a_workload() {
        let day2 = 1_767_571_200_000 + DAY_MS;
        let array = format!(
            r#"[{{"id":2,"at_ms":{b},"api":"messages","model":"claude-opus-4-1","session":"s1","client":"ana","stream":true}},
                {{"id":1,"at_ms":{a},"api":"chat_completions","model":"claude-haiku-4-5"}},
                {{"id":3,"at_ms":{a},"api":"count_tokens","model":"claude-haiku-4-5"}}]"#,
            a = day2 + 9 * 3_600_000,
            b = day2 + 9 * 3_600_000 + 5_000
        );
        let w = from_decisions(&array, "d.json").unwrap();
        assert_eq!(w.len(), 2, "count_tokens is not replayed");
        assert_eq!((w[0].t_ms, w[0].session.as_str(), w[0].cache_read_tokens), (9 * 3_600_000, "request-1", 9_000));
        assert_eq!((w[1].t_ms, w[1].client.as_deref(), w[1].stream), (9 * 3_600_000 + 5_000, Some("ana"), true));

        let record = r#"{"id":7,"at_ms":1767600000000,"api":"messages","model":"claude-sonnet-4-5","session":"x"}"#;
        let log = format!(
            "{}\n{}\nnot json\n",
            serde_json::json!({"level": "INFO", "target": "poolgate", "fields": {"message": "reloaded"}}),
            serde_json::json!({"level": "DEBUG", "target": "poolgate::decision",
                "fields": {"record": serde_json::from_str::<Value>(record).unwrap()}})
        );
        let w = from_decisions(&log, "log").unwrap();
        assert_eq!((w.len(), w[0].session.as_str()), (1, "x"));
        assert!(from_decisions("{}\n", "empty.log").unwrap_err().to_string().contains("empty.log: no Messages"));
    }
}
