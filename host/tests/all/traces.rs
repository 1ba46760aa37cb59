//! Traces through the real binary: a request's span tree arrives at an OTLP
//! receiver (HTTP/protobuf and gRPC) joined to the caller's `traceparent`,
//! with each ranking stage's reason, a plugin's fault, the failover and the
//! quota it learned; `traceparent` goes upstream only when configured; and a
//! backend that is gone costs no request, its spans counted as dropped.

use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use poolgate_mock_upstream::{MockUpstream, Step};

use crate::support::otlp::{self, int, text};
use crate::support::{self, Gateway, config, eventually};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// The model the trapping stage traps on (it passes the start's smoke test,
/// which asks another).
const MODEL: &str = "claude-trap-1";

fn telemetry(endpoint: &str, extra: &str) -> String {
    format!(
        "[[server.client_keys]]\nname = \"alice\"\nkey_env = \"ALICE\"\n\n\
         [telemetry]\nendpoint = \"{endpoint}\"\nservice_name = \"poolgate-test\"\n{extra}\n\n\
         [[policy.chain]]\nname = \"headroom\"\nplugin = \"builtin:headroom\"\n\n\
         [[policy.chain]]\nname = \"trapper\"\nplugin = \"{}\"\nconfig = {{ fault = \"trap\", on_model = \"claude-trap-1\" }}\n\n",
        poolgate::artifacts::test_guest("misbehave").unwrap()
    )
}

fn gateway(mock: &MockUpstream, extra: &str) -> Gateway {
    for key in ["key-a", "key-b"] {
        mock.account(key);
    }
    let env = [("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", "traces-admin"), ("ALICE", "alice-key")];
    Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], extra), &env)
}

async fn traced_request(gw: &Gateway) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", "alice-key")
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .header("tracestate", "vendor=opaque")
        .json(&support::message(MODEL, false))
        .send()
        .await
        .unwrap()
}

async fn spans_of(received: &otlp::Received, at_least: usize) -> Vec<Span> {
    eventually("the request's spans at the receiver", Duration::from_secs(10), async || {
        received.trace(CALLER_TRACE).len() >= at_least
    })
    .await;
    received.trace(CALLER_TRACE)
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    let mut v: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    v.sort_by_key(|s| s.start_time_unix_nano);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_span_tree_arrives_joined_to_the_callers_trace() {
    let mock = MockUpstream::start().await;
    // The first account in pool order refuses once: the request fails over.
    mock.account("key-a").push(Step::RateLimited { unified: true, retry_after: None });
    let (endpoint, received) = otlp::http().await;
    let gw = gateway(&mock, &telemetry(&endpoint, ""));
    let r = traced_request(&gw).await;
    let (status, attempts) = (r.status(), r.headers().get("x-poolgate-attempts").cloned());
    assert_eq!(
        (status.as_u16(), attempts),
        (200, Some("2".parse().unwrap())),
        "a failed over to b: {}",
        r.text().await.unwrap()
    );
    // server + 2 × (chain + 2 stages + upstream)
    let spans = spans_of(&received, 9).await;
    assert_eq!(spans.len(), 9, "{:#?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    let (_, first) = received.spans().into_iter().next().unwrap();
    assert_eq!(received.spans()[0].0, "poolgate-test", "service.name {first:?}");

    let server = named(&spans, "POST /v1/messages");
    let server = server[0];
    assert_eq!(hex::encode(&server.parent_span_id), CALLER_SPAN, "the caller's span is the parent");
    assert_eq!(server.kind, SpanKind::Server as i32);
    assert_eq!(server.trace_state, "vendor=opaque");
    let a = &server.attributes;
    assert_eq!(text(a, "poolgate.client_key").as_deref(), Some("alice"));
    assert_eq!(text(a, "gen_ai.request.model").as_deref(), Some(MODEL));
    assert_eq!(text(a, "gen_ai.response.model").as_deref(), Some(MODEL), "as the answer named it");
    assert_eq!(text(a, "poolgate.account").as_deref(), Some("b"));
    assert_eq!(text(a, "poolgate.outcome").as_deref(), Some("complete"));
    assert_eq!(int(a, "http.response.status_code"), Some(200));
    let reported = mock.reported_usage();
    assert_eq!(int(a, "gen_ai.usage.input_tokens"), Some(reported[0].input_tokens as i64));
    assert_eq!(int(a, "gen_ai.usage.output_tokens"), Some(reported[0].output_tokens as i64));

    let chains = named(&spans, "poolgate.chain");
    assert_eq!(chains.len(), 2, "a ranking per attempt");
    for (n, chain) in chains.iter().enumerate() {
        assert_eq!(chain.parent_span_id, server.span_id);
        assert_eq!(int(&chain.attributes, "poolgate.attempt"), Some(n as i64));
        let stages: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == chain.span_id).collect();
        let head = stages.iter().find(|s| s.name == "poolgate.stage headroom").expect("the headroom stage");
        assert_eq!(text(&head.attributes, "poolgate.plugin").as_deref(), Some("builtin:headroom"));
        assert_eq!(text(&head.attributes, "poolgate.plugin.sha256").map(|h| h.len()), Some(64));
        assert!(text(&head.attributes, "poolgate.stage.reason").is_some_and(|r| !r.is_empty()), "{head:?}");
        let trap = stages.iter().find(|s| s.name == "poolgate.stage trapper").expect("the trapping stage");
        assert_eq!(text(&trap.attributes, "poolgate.stage.fault_cause").as_deref(), Some("trap"));
        assert_eq!(trap.status.as_ref().map(|s| s.code), Some(StatusCode::Error as i32));
        assert!(trap.events.iter().any(|e| e.name == "poolgate.policy_error"), "{trap:?}");
        assert!(head.start_time_unix_nano >= chain.start_time_unix_nano);
        assert!(trap.end_time_unix_nano <= chain.end_time_unix_nano + 1_000, "stages within their ranking");
    }

    let upstream = named(&spans, "poolgate.upstream");
    assert_eq!(upstream.len(), 2);
    let (failed, served) = (upstream[0], upstream[1]);
    assert_eq!(failed.kind, SpanKind::Client as i32);
    assert_eq!(text(&failed.attributes, "poolgate.account").as_deref(), Some("a"));
    assert_eq!(text(&failed.attributes, "poolgate.failover_cause").as_deref(), Some("status_429"));
    assert_eq!(int(&failed.attributes, "http.response.status_code"), Some(429));
    let learned = failed.events.iter().find(|e| e.name == "poolgate.quota.learned").expect("the quota it learned");
    assert_eq!(text(&learned.attributes, "poolgate.quota.status").as_deref(), Some("rejected"));
    assert_eq!(text(&served.attributes, "poolgate.account").as_deref(), Some("b"));
    assert_eq!(text(&served.attributes, "poolgate.attempt.outcome").as_deref(), Some("served"));
    assert!(int(&served.attributes, "poolgate.upstream.ttfb_ms").is_some());
    assert!(failed.end_time_unix_nano <= served.start_time_unix_nano, "attempts one after the other");

    // The decision record names its trace; the provider heard nothing of it.
    let decisions = support::admin_json(&gw.url, "/admin/decisions", "traces-admin").await;
    assert!(decisions.to_string().contains(CALLER_TRACE), "{decisions}");
    assert!(mock.requests().iter().all(|r| r.header("traceparent").is_none() && r.header("tracestate").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_sees_the_attempts_span_as_its_parent_only_when_configured() {
    let mock = MockUpstream::start().await;
    let (endpoint, received) = otlp::grpc().await;
    // Only callers' sampled traces are traced here (ratio 0 for the rest).
    let extra = "protocol = \"grpc\"\npropagate_upstream = true\nsampling = 0.0\n";
    let gw = gateway(&mock, &telemetry(&endpoint, extra));
    assert_eq!(traced_request(&gw).await.status(), 200);
    let spans = spans_of(&received, 5).await;
    let upstream = named(&spans, "poolgate.upstream");
    let sent = mock.requests().last().unwrap().clone();
    let expected = format!("00-{CALLER_TRACE}-{}-01", hex::encode(&upstream[0].span_id));
    assert_eq!(sent.header("traceparent"), Some(expected.as_str()), "over gRPC too");
    assert_eq!(sent.header("tracestate"), Some("vendor=opaque"));
    // Untraced, or a client's header that is no traceparent: the client's
    // own never goes upstream.
    for traceparent in [None, Some("00-not-a-trace-01")] {
        let mut r = Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("x-api-key", "alice-key")
            .header("tracestate", "leak=1")
            .json(&support::message(MODEL, false));
        if let Some(t) = traceparent {
            r = r.header("traceparent", t);
        }
        assert_eq!(r.send().await.unwrap().status(), 200);
        let sent = mock.requests().last().unwrap().clone();
        assert_eq!((sent.header("traceparent"), sent.header("tracestate")), (None, None), "{traceparent:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_is_gone_costs_no_request_and_its_spans_are_counted_dropped() {
    let mock = MockUpstream::start().await;
    // A backend that takes connections and never answers: each export
    // waits out its timeout while requests go on.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = hung.local_addr().unwrap();
    let extra = "timeout_ms = 2000\nqueue_max = 2\nheaders = { \"api-key\" = \"s3cret-header\" }\n";
    let gw = gateway(&mock, &telemetry(&format!("http://{gone}"), extra));
    let metrics =
        async || Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    let fresh = metrics().await;
    for outcome in ["exported", "dropped_queue_full", "dropped_export_failed"] {
        assert!(fresh.contains(&format!("poolgate_trace_spans_total{{outcome=\"{outcome}\"}} 0")), "{fresh}");
    }
    let dropped = |text: &str, outcome: &str| -> u64 {
        let line = format!("poolgate_trace_spans_total{{outcome=\"{outcome}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&line)).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    // Requests go on while exports hang: the two-trace queue fills behind
    // an export, and each export's batch is lost at its timeout.
    let mut served = 0;
    eventually("spans dropped both ways", Duration::from_secs(30), async || {
        let started = poolgate::clock::machine_instant();
        let r = traced_request(&gw).await;
        assert_eq!(r.status(), 200);
        // An export waits 2 s for the hung backend; a request never does.
        assert!(started.elapsed() < Duration::from_millis(1500), "a request waited for the exporter");
        served += 1;
        let m = metrics().await;
        dropped(&m, "dropped_export_failed") > 0 && dropped(&m, "dropped_queue_full") > 0
    })
    .await;
    assert!(served > 1);
    assert!(gw.wait_for_log("could not export spans", Duration::from_secs(5)).await, "{}", gw.log());
    assert!(!gw.log().contains("s3cret-header"), "a header's value is never logged");
    drop(hung);
}
