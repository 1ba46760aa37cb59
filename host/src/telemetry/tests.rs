use super::*;

fn settings(parent_based: bool, ratio: f64, propagate: bool) -> Settings {
    Settings {
        endpoint: "http://127.0.0.1:4318/v1/traces".into(),
        protocol: Protocol::HttpProtobuf,
        headers: Vec::new(),
        service_name: "poolgate".into(),
        resource: Vec::new(),
        sampler: Sampler { parent_based, ratio },
        propagate_upstream: propagate,
        queue_max: 16,
        timeout: Duration::from_secs(1),
        notes: Vec::new(),
    }
}

const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CALLER_UNSAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

#[test]
fn a_callers_trace_is_joined_and_its_span_is_the_parent() {
    let ids = Ids::new([1, 2], &settings(true, 0.0, false));
    let t = ids.begin(7, Some(CALLER), Some("congo=t61rcWkgMzE")).unwrap();
    assert_eq!(t.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(t.remote_parent, Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]));
    assert_eq!(t.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
    assert!(t.sampled, "a sampled caller is followed even at ratio 0");
    // Unsampled, and nothing to pass on: not traced at all.
    assert!(ids.begin(7, Some(CALLER_UNSAMPLED), None).is_none());
}

#[test]
fn span_ids_are_distinct_nonzero_and_differ_between_requests() {
    let ids = Ids::new([1, 2], &settings(true, 1.0, false));
    let (a, b) = (ids.begin(1, None, None).unwrap(), ids.begin(2, None, None).unwrap());
    assert_ne!(a.trace_id, b.trace_id);
    let spans: std::collections::HashSet<[u8; 8]> = (0..200).map(|k| a.span_id(k)).collect();
    assert_eq!(spans.len(), 200);
    assert!(!spans.contains(&[0; 8]));
    assert_ne!(a.span_id(0), b.span_id(0));
}

#[test]
fn the_ratio_samples_about_its_share_of_requests() {
    for (ratio, lo, hi) in [(0.0, 0, 0), (0.01, 50, 150), (0.5, 4_700, 5_300), (1.0, 10_000, 10_000)] {
        let ids = Ids::new([0x1234, 0x5678], &settings(true, ratio, false));
        let traced = (0..10_000).filter(|&r| ids.begin(r, None, None).is_some()).count();
        assert!((lo..=hi).contains(&traced), "ratio {ratio}: {traced} of 10000");
    }
}

#[test]
fn upstream_gets_the_attempts_span_only_when_propagation_is_on() {
    let off = Ids::new([1, 2], &settings(true, 1.0, false));
    let t = off.begin(3, Some(CALLER), Some("a=b")).unwrap();
    assert_eq!(off.upstream(&t, t.span_id(9)), None);
    let on = Ids::new([1, 2], &settings(true, 1.0, true));
    let t = on.begin(3, Some(CALLER), Some("a=b")).unwrap();
    let (tp, ts) = on.upstream(&t, t.span_id(9)).unwrap();
    assert_eq!(tp, format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", hex::encode(t.span_id(9))));
    assert_eq!(ts, Some("a=b"));
    // A caller's unsampled trace is passed on as it came: its span, unsampled.
    let t = on.begin(3, Some(CALLER_UNSAMPLED), None).unwrap();
    assert!(!t.sampled);
    assert_eq!(on.upstream(&t, t.span_id(9)).unwrap().0, CALLER_UNSAMPLED);
}
