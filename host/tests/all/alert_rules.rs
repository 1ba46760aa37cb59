//! The metrics an operator alerts on, through the real binary: every counter
//! a rule may `increase()` is there at zero before the first request; what
//! the example dashboard and alerting rules (`examples/grafana`,
//! `examples/prometheus`) name is what `poolgate serve` exports, and
//! `docs/metrics.md` names all of it; and what a
//! request did — the tokens it was billed, each stage's time, the quota it
//! read — shows in the scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use poolgate::metrics::{OAUTH_RESULTS, REFUSED_REASONS, STATE_OPS, UNSERVED_CAUSES};
use poolgate_mock_upstream::{Identity, MockUpstream, Quota, Window, now_s};
use serde_json::Value;

use crate::support::{self, Gateway, tempdir};

const ADMIN: &str = "alerts-admin";
/// The default chain's stages (no `[[policy.chain]]` in the config).
const STAGES: [&str; 3] = ["builtin:skip-exhausted", "builtin:headroom", "builtin:affinity"];

/// A gateway over an API key (`key`) and an OAuth seat (`seat`) at the
/// mock, with a fallback backend and a usage ledger: every kind of label the
/// metrics carry. The seat reads 5h 0.2, 7d 0.1 and a `7d_opus` bucket at
/// 0.5; the key 10 of 50 requests a minute used.
fn start(mock: &MockUpstream) -> (Gateway, tempdir::Dir) {
    let base = mock.base_url();
    let now = now_s();
    let key = mock.account("key-a");
    key.set_quota(Quota::default().with_api_limit("requests", 50, 40, now + 60));
    let account = mock.account("seat-credential");
    let mut quota = Quota::unified(0.2, 0.1);
    quota.buckets.push(("opus".into(), Window::allowed(0.5, now + 7 * 86400)));
    account.set_quota(quota);
    let seat = mock.oauth().seat(&account, Identity::new("seat"));
    let dir = tempdir::Dir::new("alerts");
    let credentials = dir.0.join("seats").join("seat.json");
    support::write_credentials(&credentials, &seat.issue());
    let config = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n\
         [oauth]\ntoken_url = \"{base}/v1/oauth/token\"\nusage_poll_ms = 0\n\n\
         [[accounts]]\nid = \"key\"\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n\
         [[accounts]]\nid = \"seat\"\nkind = \"oauth\"\ncredentials = \"{}\"\nbase_url = \"{base}\"\n\n\
         [[fallback]]\nname = \"backup\"\nbase_url = \"{base}\"\nmodel = \"gpt-backup\"\n\n\
         [ledger]\nflush_ms = 100\n",
        credentials.display()
    );
    let gw = Gateway::start(&config, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)]);
    (gw, dir)
}

async fn scrape(gw: &Gateway) -> String {
    let r = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// The value of `series` (`name{labels}`, exactly as exposed) in `text`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Asserts `series` reads `want` (to rounding: `1 - 40/50` is not 0.2).
fn expect(text: &str, series: &str, want: f64) {
    let got = value(text, series);
    assert!(got.is_some_and(|v| (v - want).abs() < 1e-9), "{series} is {got:?}, not {want}, in:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_a_rule_may_alert_on_is_there_at_zero_before_any_request() {
    let mock = MockUpstream::start().await;
    let (gw, _dir) = start(&mock);
    let text = scrape(&gw).await;

    for account in ["key", "seat"] {
        for cause in ["429", "529", "503", "connect_error", "stream_error"] {
            expect(&text, &format!("poolgate_failovers_total{{account=\"{account}\",cause=\"{cause}\"}}"), 0.0);
        }
        for reason in ["weekly_exhausted", "session_exhausted", "model_exhausted", "auth", "overage", "transient"] {
            expect(&text, &format!("poolgate_cooldowns_total{{account=\"{account}\",reason=\"{reason}\"}}"), 0.0);
        }
        expect(&text, &format!("poolgate_stream_cuts_total{{account=\"{account}\"}}"), 0.0);
    }
    for result in OAUTH_RESULTS {
        expect(&text, &format!("poolgate_oauth_refreshes_total{{account=\"seat\",result=\"{result}\"}}"), 0.0);
    }
    assert!(!text.contains("poolgate_oauth_refreshes_total{account=\"key\""), "an API key is no seat");
    for stage in STAGES {
        for cause in poolgate::policy::Cause::ALL.map(|c| c.as_str()) {
            expect(&text, &format!("poolgate_policy_errors_total{{stage=\"{stage}\",cause=\"{cause}\"}}"), 0.0);
            for phase in ["observe", "configure"] {
                let series = format!(
                    "poolgate_policy_background_errors_total{{stage=\"{stage}\",phase=\"{phase}\",cause=\"{cause}\"}}"
                );
                expect(&text, &series, 0.0);
            }
        }
        expect(&text, &format!("poolgate_stage_duration_seconds_count{{stage=\"{stage}\"}}"), 0.0);
    }
    expect(&text, "poolgate_fallback_total{backend=\"backup/gpt-backup\"}", 0.0);
    for cause in UNSERVED_CAUSES {
        expect(&text, &format!("poolgate_unserved_total{{cause=\"{cause}\"}}"), 0.0);
    }
    for reason in REFUSED_REASONS {
        expect(&text, &format!("poolgate_refused_total{{reason=\"{reason}\"}}"), 0.0);
    }
    for result in ["ok", "error"] {
        expect(&text, &format!("poolgate_reloads_total{{result=\"{result}\"}}"), 0.0);
    }
    for op in STATE_OPS {
        expect(&text, &format!("poolgate_state_backend_errors_total{{op=\"{op}\"}}"), 0.0);
    }
    expect(&text, "poolgate_parked_total", 0.0);

    // The gauges say a whole, healthy pool.
    expect(&text, "poolgate_pool_accounts{}", 2.0);
    expect(&text, "poolgate_pool_usable_accounts{}", 2.0);
    expect(&text, "poolgate_seats_needing_login{}", 0.0);
    expect(&text, "poolgate_seat_needs_login{account=\"seat\"}", 0.0);
    for cause in poolgate::account::CooldownReason::ALL.map(|c| c.as_str()) {
        expect(&text, &format!("poolgate_cooldowns_active{{cause=\"{cause}\"}}"), 0.0);
    }
    // The load's smoke test ranked once through every stage: what it cost.
    for stage in STAGES {
        let fuel = value(&text, &format!("poolgate_stage_fuel_high_water{{stage=\"{stage}\"}}"));
        assert!(fuel.is_some_and(|f| f > 0.0), "{stage}: {fuel:?}");
        let memory = value(&text, &format!("poolgate_stage_memory_high_water_bytes{{stage=\"{stage}\"}}"));
        assert!(memory.is_some_and(|m| m >= 65536.0), "at least a page of linear memory: {stage}: {memory:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_an_account_a_stage_and_a_backend_shows_their_counters_at_zero() {
    let mock = MockUpstream::start().await;
    mock.account("key-b");
    let (gw, _dir) = start(&mock);
    let mut config = std::fs::read_to_string(gw.config_path()).unwrap();
    config.push_str(&format!(
        "\n[[accounts]]\nid = \"late\"\napi_key_env = \"KEY_B\"\nbase_url = \"{}\"\n\n\
         [[fallback]]\nname = \"spare\"\nbase_url = \"{}\"\nmodel = \"m2\"\n",
        mock.base_url(),
        mock.base_url()
    ));
    for stage in STAGES {
        config.push_str(&format!("\n[[policy.chain]]\nplugin = \"{stage}\"\n"));
    }
    config.push_str("\n[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"second-headroom\"\n");
    std::fs::write(gw.config_path(), config).unwrap();
    let (status, body) = support::admin_post(&gw.url, "/admin/reload", Some(ADMIN), "").await;
    assert_eq!(status, 200, "{body}");

    let text = scrape(&gw).await;
    expect(&text, "poolgate_reloads_total{result=\"ok\"}", 1.0);
    expect(&text, "poolgate_failovers_total{account=\"late\",cause=\"429\"}", 0.0);
    expect(&text, "poolgate_cooldowns_total{account=\"late\",reason=\"transient\"}", 0.0);
    expect(&text, "poolgate_fallback_total{backend=\"spare/m2\"}", 0.0);
    expect(&text, "poolgate_policy_errors_total{stage=\"second-headroom\",cause=\"trap\"}", 0.0);
    expect(&text, "poolgate_stage_duration_seconds_count{stage=\"second-headroom\"}", 0.0);
    expect(&text, "poolgate_pool_accounts{}", 3.0);
}

async fn served_by(gw: &Gateway, account: &str) {
    let r = support::messages(gw, "", "claude-sonnet-4-5", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-account"], account);
    r.bytes().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_request_did_shows_in_tokens_stage_times_and_quota() {
    let mock = MockUpstream::start().await;
    let (gw, _dir) = start(&mock);
    // The key is overflow beside a seat: the seat serves first; then, the
    // seat taken out of routing, the key.
    served_by(&gw, "seat").await;
    let (status, _) = support::admin_post(&gw.url, "/admin/accounts/seat/disable", Some(ADMIN), "").await;
    assert_eq!(status, 200);
    served_by(&gw, "key").await;
    let text = scrape(&gw).await;

    let reported = mock.reported_usage();
    assert_eq!(reported.len(), 2);
    for (account, usage) in ["seat", "key"].iter().zip(&reported) {
        let tokens = |kind: &str| {
            let series =
                format!("poolgate_tokens_total{{account=\"{account}\",model=\"claude-sonnet-4-5\",kind=\"{kind}\"}}");
            value(&text, &series).unwrap_or(0.0) as u64
        };
        assert!(usage.output_tokens > 0, "{usage:?}");
        assert_eq!(tokens("input"), usage.input_tokens, "{account}: {text}");
        assert_eq!(tokens("output"), usage.output_tokens, "{account}");
    }
    for stage in STAGES {
        expect(&text, &format!("poolgate_stage_duration_seconds_count{{stage=\"{stage}\"}}"), 2.0);
    }

    expect(&text, "poolgate_quota_utilization{account=\"seat\",window=\"5h\"}", 0.2);
    expect(&text, "poolgate_quota_utilization{account=\"seat\",window=\"7d\"}", 0.1);
    expect(&text, "poolgate_quota_utilization{account=\"seat\",window=\"7d_opus\"}", 0.5);
    expect(&text, "poolgate_quota_utilization{account=\"key\",window=\"requests\"}", 0.2);
    let reset = value(&text, "poolgate_quota_reset_seconds{account=\"seat\",window=\"5h\"}").unwrap_or(0.0);
    assert!((5.0 * 3600.0 - 60.0..=5.0 * 3600.0).contains(&reset), "{reset}");
    let reset = value(&text, "poolgate_quota_reset_seconds{account=\"key\",window=\"requests\"}").unwrap_or(0.0);
    assert!(reset > 0.0 && reset <= 60.0, "{reset}");
    let age = value(&text, "poolgate_quota_reading_age_seconds{account=\"key\"}");
    assert!(age.is_some_and(|a| (0.0..60.0).contains(&a)), "{age:?}");
    // Taken out of routing: in the pool, not usable.
    expect(&text, "poolgate_pool_accounts{}", 2.0);
    expect(&text, "poolgate_pool_usable_accounts{}", 1.0);
}

/// The families of an exposition, by name, with their type.
fn families(text: &str) -> BTreeMap<&str, &str> {
    text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_once(' ')).collect()
}

/// Whether `name`, as a query writes it, is a series of one of `families`:
/// a gauge by its name, a counter's `_total`, a histogram's `_bucket`,
/// `_count` or `_sum` (as the OpenMetrics exposition shows them).
fn exposed(families: &BTreeMap<&str, &str>, name: &str) -> bool {
    let is = |family: Option<&str>, kind: &str| family.and_then(|f| families.get(f)) == Some(&kind);
    is(Some(name), "gauge")
        || is(name.strip_suffix("_total"), "counter")
        || ["_bucket", "_count", "_sum"].iter().any(|s| is(name.strip_suffix(s), "histogram"))
}

/// Every `poolgate_…` metric name in `query`.
fn names_in(query: &str, into: &mut BTreeSet<String>) {
    let bytes = query.as_bytes();
    let mut rest = query;
    while let Some(at) = rest.find("poolgate_") {
        let start = query.len() - rest.len() + at;
        let preceded = start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let len = rest[at..].bytes().take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_').count();
        if !preceded {
            into.insert(rest[at..at + len].to_string());
        }
        rest = &rest[at + len..];
    }
}

/// The names every `expr` of a Grafana dashboard queries.
fn dashboard_names(dashboard: &Value, into: &mut BTreeSet<String>) {
    match dashboard {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(q)) => names_in(q, into),
                    _ => dashboard_names(v, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_names(v, into)),
        _ => {}
    }
}

/// The names every `expr:` of a Prometheus rules file queries: inline, or a
/// block scalar (`>-`, `|`) of the lines indented under it.
fn rules_names(rules: &str, into: &mut BTreeSet<String>) {
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let indent = line.len() - line.trim_start().len();
        let item = line.trim_start();
        let Some(inline) = item.strip_prefix("- ").unwrap_or(item).strip_prefix("expr:") else { continue };
        let inline = inline.trim();
        if !inline.starts_with(['>', '|']) {
            names_in(inline, into);
            continue;
        }
        while let Some(next) = lines.next_if(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent) {
            names_in(next, into);
        }
    }
}

fn example(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("examples").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_example_dashboard_and_alerts_name_is_scraped() {
    let dashboard: Value = serde_json::from_str(&example("grafana/poolgate-dashboard.json")).unwrap();
    let mut in_dashboard = BTreeSet::new();
    dashboard_names(&dashboard, &mut in_dashboard);
    let mut in_rules = BTreeSet::new();
    rules_names(&example("prometheus/poolgate-alerts.yml"), &mut in_rules);
    // What the issue asks the rules to watch, and the dashboard to show.
    for name in [
        "poolgate_pool_usable_accounts",
        "poolgate_seat_needs_login",
        "poolgate_stage_breaker_open",
        "poolgate_fallback_total",
        "poolgate_state_backend_up",
        "poolgate_ledger_up",
    ] {
        assert!(in_rules.contains(name), "no rule watches {name}: {in_rules:?}");
    }
    for name in [
        "poolgate_quota_utilization",
        "poolgate_cooldowns_active",
        "poolgate_tokens_total",
        "poolgate_stage_duration_seconds_bucket",
        "poolgate_policy_errors_total",
        "poolgate_fallback_total",
        "poolgate_state_backend_up",
        "poolgate_ledger_up",
    ] {
        assert!(in_dashboard.contains(name), "the dashboard shows no {name}: {in_dashboard:?}");
    }

    // One request served: a family with no series yet is not exposed at all
    // (a request's status, a token's model, a quota reading are not known
    // before), and a dashboard is read on a gateway that has served.
    let mock = MockUpstream::start().await;
    let (gw, _dir) = start(&mock);
    served_by(&gw, "seat").await;
    let text = scrape(&gw).await;
    let families = families(&text);
    for (file, names) in [("the dashboard", &in_dashboard), ("the alerting rules", &in_rules)] {
        let missing: Vec<&String> = names.iter().filter(|n| !exposed(&families, n)).collect();
        assert!(
            missing.is_empty(),
            "{file} name metrics poolgate does not export: {missing:?}\nexported: {families:?}"
        );
    }
    // And docs/metrics.md names every family, as a query writes it.
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md")).unwrap();
    let undocumented: Vec<String> = families
        .iter()
        .map(|(name, kind)| if *kind == "counter" { format!("{name}_total") } else { name.to_string() })
        .filter(|name| !docs.contains(&format!("`{name}")))
        .collect();
    assert!(undocumented.is_empty(), "docs/metrics.md does not name {undocumented:?}");
}

#[test]
fn names_are_read_from_queries_and_matched_to_their_family() {
    let mut names = BTreeSet::new();
    names_in(
        "histogram_quantile(0.9, sum by (le) (rate(poolgate_x_seconds_bucket{a=\"b\"}[5m]))) / poolgate_y",
        &mut names,
    );
    names_in("my_poolgate_z + poolgate_w_total", &mut names);
    assert_eq!(
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        ["poolgate_w_total", "poolgate_x_seconds_bucket", "poolgate_y"]
    );
    let mut block = BTreeSet::new();
    rules_names(
        "  - expr: >-\n      poolgate_a\n      and poolgate_b\n    for: 1m\n  - expr: poolgate_c > 0\n  - foo: poolgate_d\n",
        &mut block,
    );
    assert_eq!(block.iter().map(String::as_str).collect::<Vec<_>>(), ["poolgate_a", "poolgate_b", "poolgate_c"]);
    let families =
        BTreeMap::from([("poolgate_w", "counter"), ("poolgate_x_seconds", "histogram"), ("poolgate_y", "gauge")]);
    assert!(
        ["poolgate_w_total", "poolgate_x_seconds_bucket", "poolgate_x_seconds_sum", "poolgate_y"]
            .iter()
            .all(|n| exposed(&families, n))
    );
    assert!(
        !["poolgate_w", "poolgate_y_total", "poolgate_x_seconds", "poolgate_v"].iter().any(|n| exposed(&families, n))
    );
}
