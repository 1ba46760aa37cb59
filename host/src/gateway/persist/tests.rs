use super::*;
use crate::account::{CooldownReason, Status, WindowReading};
use crate::config::CooldownConfig;
use crate::learned::cooldown::Answer;
use crate::learned::quota::QuotaReading;
use crate::policy::MemoryState;

const NOW: u64 = 1_760_000_000_000;
const HOUR: u64 = 3_600_000;

fn exhausted() -> QuotaReading {
    QuotaReading {
        status: Some(Status::Rejected),
        reset_ms: Some(NOW + HOUR),
        windows: vec![WindowReading {
            name: "7d".into(),
            utilization: 1.0,
            resets_at_ms: Some(NOW + HOUR),
            status: Status::Rejected,
            observed_at_ms: Some(NOW),
        }],
        ..QuotaReading::default()
    }
}

fn account(id: &str, key: &str) -> AccountState {
    let a = AccountState::new(id);
    a.bind(Some(format!("key:{key}")));
    a
}

/// The file written for `accounts` and `plugin` at `now`, read back.
fn round_trip<'a>(
    accounts: impl IntoIterator<Item = (&'a str, &'a AccountState)>,
    plugin: &dyn StateStore,
    now: u64,
) -> StateFile {
    let bytes = encode(now, &account_records(accounts, now), &plugin_json(plugin, now).unwrap()).unwrap();
    parse(&bytes).unwrap()
}

#[test]
fn an_exhausted_account_and_a_binding_come_back_after_a_restart() {
    let a = account("a", "k1");
    let cfg = CooldownConfig::default();
    a.record(Answer::Status(429), &exhausted(), None, &cfg, NOW);
    assert_eq!(a.cooldown(NOW).unwrap().reason, CooldownReason::WeeklyExhausted);
    let plugin = MemoryState::default();
    plugin.set("builtin:affinity", "session-1", "a|1", Some(HOUR), NOW);
    plugin.set("builtin:gone", "k", "v", None, NOW);
    let file = round_trip([("a", &a)], &plugin, NOW);

    let later = NOW + 60_000;
    let (fresh, store) = (account("a", "k1"), MemoryState::default());
    let r = restore(&file, [("a", &fresh)], &store, &["builtin:affinity"], later);
    assert_eq!((r.accounts, r.cooling, r.plugin_entries), (1, 1, 1));
    assert_eq!(fresh.cooldown(later).map(|c| c.reason), Some(CooldownReason::WeeklyExhausted));
    assert_eq!(store.get("builtin:affinity", "session-1", later).as_deref(), Some("a|1"));
    assert_eq!(store.get("builtin:gone", "k", later), None, "a scope no stage uses is not taken back");
}

#[test]
fn another_key_under_the_same_id_inherits_nothing_but_the_disable() {
    let a = account("a", "k1");
    a.record(Answer::Status(429), &exhausted(), None, &CooldownConfig::default(), NOW);
    a.disable("alice", Some("rotating".into()), NOW).unwrap();
    let file = round_trip([("a", &a)], &MemoryState::default(), NOW);
    let rotated = account("a", "k2");
    let r = restore(&file, [("a", &rotated)], &MemoryState::default(), &[], NOW + 1);
    assert_eq!(r.other_identity, ["a"]);
    assert_eq!(rotated.cooldown(NOW + 1), None);
    assert_eq!(rotated.runtime_disabled().map(|d| d.by), Some("alice".into()), "the operator's act is the id's");
}

#[test]
fn cooldowns_and_bindings_that_ended_meanwhile_are_dropped() {
    let a = account("a", "k1");
    a.record(Answer::Status(529), &QuotaReading::default(), None, &CooldownConfig::default(), NOW);
    let until = a.cooldown(NOW).unwrap().until_ms;
    let plugin = MemoryState::default();
    plugin.set("builtin:affinity", "s", "a|1", Some(1_000), NOW);
    let file = round_trip([("a", &a)], &plugin, NOW);
    let (fresh, store) = (account("a", "k1"), MemoryState::default());
    let r = restore(&file, [("a", &fresh)], &store, &["builtin:affinity"], until + 1);
    assert_eq!((r.accounts, r.cooling, r.plugin_entries), (1, 0, 0));
    assert_eq!(fresh.cooldown(until + 1), None);
}

#[test]
fn garbage_another_version_or_an_empty_file_is_refused_with_a_reason() {
    assert!(parse(b"").unwrap_err().contains("not a state file"));
    assert!(parse(b"{\"v\":1,\"written_ms\":").unwrap_err().contains("not a state file"));
    assert!(parse(b"{\"v\":2,\"written_ms\":0}").unwrap_err().contains("version 2"));
    assert!(parse(b"{\"v\":1,\"written_ms\":0,\"surprise\":1}").is_err());
    assert!(parse(b"{\"v\":1,\"written_ms\":0}").is_ok());
}

#[test]
fn plugin_state_is_copied_when_changed_at_most_every_ten_checks_and_at_shutdown() {
    assert!(copy_due(None, 0, NOW, 1_000, false), "the first write copies it");
    assert!(!copy_due(Some((5, NOW)), 5, NOW + HOUR, 1_000, true), "unchanged: never again");
    assert!(!copy_due(Some((5, NOW)), 6, NOW + 9_999, 1_000, false), "changed, not due yet");
    assert!(copy_due(Some((5, NOW)), 6, NOW + 10_000, 1_000, false));
    assert!(copy_due(Some((5, NOW)), 6, NOW + 1, 1_000, true), "shutdown writes what it holds");
}

#[test]
fn a_record_from_the_future_is_refused() {
    let a = account("a", "k1");
    let file = round_trip([("a", &a)], &MemoryState::default(), NOW + 10 * HOUR);
    let r = restore(&file, [("a", &account("a", "k1"))], &MemoryState::default(), &[], NOW);
    assert_eq!(r.refused.len(), 1, "{r:?}");
}

#[test]
fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
    let dir = std::env::temp_dir().join(format!("poolgate-persist-{}-{}", std::process::id(), NOW));
    let path = dir.join("nested").join("state.json");
    write_atomic(&path, b"{\"v\":1,\"written_ms\":1}").unwrap();
    write_atomic(&path, b"{\"v\":1,\"written_ms\":2}").unwrap();
    assert_eq!(read(&path).unwrap().unwrap().written_ms, 2);
    let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["state.json"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(read(&dir.join("none.json")).unwrap(), None);
    let _ = std::fs::remove_dir_all(&dir);
}
