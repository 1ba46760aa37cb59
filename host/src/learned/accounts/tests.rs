use super::*;
use crate::account::WindowReading;
use crate::config::AccountConfig;

const NOW: u64 = 1_760_000_000_000;

#[test]
fn auth_failures_escalate_only_when_not_already_cooling_and_a_success_clears_them() {
    let a = AccountState::new("a");
    let cfg = CooldownConfig::default();
    let r = QuotaReading::default();
    assert_eq!(a.record(Answer::Status(401), &r, None, &cfg, NOW), Change::Cooled(CooldownReason::Auth));
    // A burst while cooling does not escalate.
    assert_eq!(a.record(Answer::Status(401), &r, None, &cfg, NOW + 1), Change::None);
    assert_eq!(a.cooldown(NOW).unwrap().until_ms, NOW + 60_000);
    // After it ends, the next failure doubles.
    a.record(Answer::Status(401), &r, None, &cfg, NOW + 60_001);
    assert_eq!(a.cooldown(NOW + 60_001).unwrap().until_ms, NOW + 60_001 + 120_000);
    assert_eq!(a.record(Answer::Status(200), &r, None, &cfg, NOW + 60_002), Change::Cleared);
    assert!(a.cooldown(NOW + 60_002).is_none());
}

#[test]
fn a_shorter_cooldown_never_replaces_a_longer_one() {
    let a = AccountState::new("a");
    let cfg = CooldownConfig::default();
    let weekly = QuotaReading {
        windows: vec![WindowReading {
            name: "7d".into(),
            utilization: 1.0,
            resets_at_ms: Some(NOW + 3_600_000),
            status: Status::Rejected,
            observed_at_ms: Some(NOW),
        }],
        ..Default::default()
    };
    a.record(Answer::Status(429), &weekly, None, &cfg, NOW);
    a.record(Answer::Status(529), &QuotaReading::default(), None, &cfg, NOW + 10);
    assert_eq!(a.cooldown(NOW + 10).unwrap().reason, CooldownReason::WeeklyExhausted);
}

#[test]
fn a_per_model_429_gates_the_family_without_rejecting_the_account() {
    let a = AccountState::new("a");
    let cfg = CooldownConfig::default();
    let w = |name: &str, u, status| WindowReading {
        name: name.into(),
        utilization: u,
        resets_at_ms: Some(NOW + 3_600_000),
        status,
        observed_at_ms: Some(NOW),
    };
    let fable_429 = QuotaReading {
        status: Some(Status::Rejected),
        reset_ms: Some(NOW + 3_600_000),
        windows: vec![w("5h", 0.2, Status::Allowed), w("7d", 0.3, Status::Allowed), w("7d_oi", 1.0, Status::Rejected)],
        ..Default::default()
    };
    assert_eq!(a.record(Answer::Status(429), &fable_429, Some("fable"), &cfg, NOW), Change::Gated("fable".into()));
    let s = a.snapshot(&AccountConfig { id: "a".into(), enabled: true, ..Default::default() }, NOW);
    assert_ne!(s.status, Status::Rejected, "the top-level rejection was about fable only");
    assert!(s.usable(Some("sonnet"), NOW + 1));
    assert!(!s.usable(Some("fable"), NOW + 1));
    assert!(s.windows.iter().any(|w| w.name == "7d_oi" && w.status == Status::Rejected), "the bucket reading is kept");
}

#[test]
fn a_seat_that_cannot_serve_cools_unless_a_longer_cooldown_is_in_force() {
    let weekly = Cooldown { until_ms: NOW + 3_600_000, reason: CooldownReason::WeeklyExhausted };
    let seat = Cooldown { until_ms: NOW + 5_000, reason: CooldownReason::UpstreamError };
    assert_eq!(with_seat(None, None), None);
    assert_eq!(with_seat(None, Some(NOW + 5_000)), Some(seat));
    assert_eq!(with_seat(Some(weekly), Some(NOW + 5_000)), Some(weekly));
    let short = Cooldown { until_ms: NOW + 10, reason: CooldownReason::Transient };
    assert_eq!(with_seat(Some(short), Some(NOW + 5_000)), Some(seat));
}

#[test]
fn an_operators_clear_lifts_any_cooldown_and_the_gates_asked_for() {
    let a = AccountState::new("a");
    let cfg = CooldownConfig::default();
    let r = QuotaReading::default();
    for _ in 0..3 {
        a.record(Answer::Status(529), &r, None, &cfg, NOW);
    }
    a.cool(NOW + 3_600_000, CooldownReason::Overage, NOW);
    {
        let mut l = a.learned();
        AccountState::gate(&mut l, "opus", NOW + 60_000, NOW);
        AccountState::gate(&mut l, "fable", NOW + 60_000, NOW);
    }
    let only_opus = a.clear(false, Some(&["opus".to_string()]), NOW + 1);
    assert_eq!((only_opus.cooldown, only_opus.gates.len()), (None, 1));
    assert!(a.cooldown(NOW + 1).is_some(), "the cooldown was not asked for");
    let all = a.clear(true, None, NOW + 2);
    assert_eq!(all.cooldown.map(|c| c.reason), Some(CooldownReason::Overage), "not one a success lifts");
    assert_eq!(all.gates.iter().map(|g| g.family.as_str()).collect::<Vec<_>>(), ["fable"]);
    assert!(a.cooldown(NOW + 2).is_none());
    // The streak it escalated from is gone: the next 529 starts over.
    a.record(Answer::Status(529), &r, None, &cfg, NOW + 3);
    assert_eq!(a.cooldown(NOW + 3).unwrap().until_ms, NOW + 3 + cfg.overloaded_ms);
}

#[test]
fn a_runtime_disable_holds_until_enabled() {
    let a = AccountState::new("a");
    let v = a.version();
    let d = a.disable("alice", Some("key leaked".into()), NOW).unwrap();
    assert!(a.is_runtime_disabled() && a.version() > v, "a change the state file writes");
    assert_eq!(a.disable("bob", None, NOW + 1).unwrap_err(), d, "the first disable stands");
    assert_eq!(a.enable(), Some(d));
    assert_eq!(a.enable(), None);
    assert!(!a.is_runtime_disabled());
}

#[test]
fn slots_are_bounded_by_max_in_flight() {
    let a = AccountState::new("a");
    assert!(a.try_take(Some(2)));
    assert!(a.try_take(Some(2)));
    assert!(!a.try_take(Some(2)));
    a.give_back();
    assert!(a.try_take(Some(2)));
    assert_eq!(a.in_flight(), 2);
}

#[test]
fn readings_merge_by_window_name() {
    let a = AccountState::new("a");
    let cfg = CooldownConfig::default();
    let w = |name: &str, u| WindowReading {
        name: name.into(),
        utilization: u,
        resets_at_ms: None,
        status: Status::Allowed,
        observed_at_ms: Some(NOW),
    };
    a.record(
        Answer::Status(200),
        &QuotaReading {
            windows: vec![w("5h", 0.1), w("7d", 0.2)],
            status: Some(Status::Allowed),
            ..Default::default()
        },
        None,
        &cfg,
        NOW,
    );
    a.record(
        Answer::Status(200),
        &QuotaReading { windows: vec![w("5h", 0.3)], status: Some(Status::Allowed), ..Default::default() },
        None,
        &cfg,
        NOW + 1,
    );
    let s = a.snapshot(&AccountConfig { id: "a".into(), enabled: true, ..Default::default() }, NOW);
    let by = |n: &str| s.windows.iter().find(|x| x.name == n).unwrap().utilization;
    assert_eq!((by("5h"), by("7d")), (0.3, 0.2));
}
