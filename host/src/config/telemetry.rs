//! `[telemetry]`: traces of every request to an OpenTelemetry backend over
//! OTLP, and the standard `OTEL_*` environment variables.
//!
//! Tracing is on when an endpoint is given — here, or by
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` — and
//! off by default. What the file sets wins over the environment; the
//! environment fills what the file leaves out, so a deployment can add an
//! endpoint or an API key header without editing the file.
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turns tracing off
//! whatever the file says.
//!
//! A header's value may be a backend's API key: `headers_env` names the
//! environment variable that holds it, and no error or log line repeats a
//! value.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::telemetry::{Protocol, Sampler, Settings};

/// `[telemetry]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector: a base URL like `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// (`http://collector:4318`; `/v1/traces` is added for HTTP unless the
    /// path already ends with it), or a gRPC address (`http://collector:4317`).
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    pub protocol: Option<String>,
    /// Headers sent with every export.
    pub headers: BTreeMap<String, String>,
    /// Headers whose values are read from these environment variables.
    pub headers_env: BTreeMap<String, String>,
    /// The share of requests traced that no sampled caller's trace decides
    /// (0 to 1; default 1).
    pub sampling: Option<f64>,
    /// Whether a caller's `traceparent` decides (its `sampled` flag; default
    /// true).
    pub parent_based: Option<bool>,
    /// `service.name` (default `poolgate`).
    pub service_name: Option<String>,
    /// More resource attributes (`deployment.environment = "prod"`).
    pub resource: BTreeMap<String, String>,
    /// Whether upstream requests carry `traceparent` and `tracestate`
    /// (default false: the provider learns nothing of the caller's traces).
    pub propagate_upstream: bool,
    /// Most finished traces waiting to be exported (default 2048).
    pub queue_max: Option<usize>,
    /// Longest one export may take, ms (default 10000).
    pub timeout_ms: Option<u64>,
}

/// A problem: the key (or environment variable) and why.
pub type Problem = (String, String);

/// The settings in force, from the file's `[telemetry]` over `env` (the
/// process environment, or a test's); `None` when tracing is off.
pub fn settings(c: &TelemetryConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Settings>, Problem> {
    let var = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let off = |k: &str, v: &str| var(k).is_some_and(|x| x.eq_ignore_ascii_case(v));
    // No endpoint, no tracing: nothing else is read, so an `OTEL_*`
    // variable meant for other programs can never stop this one starting.
    let (traces_endpoint, base_endpoint) =
        (var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), var("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let no_endpoint = c.endpoint.is_none() && traces_endpoint.is_none() && base_endpoint.is_none();
    if no_endpoint || off("OTEL_SDK_DISABLED", "true") || off("OTEL_TRACES_EXPORTER", "none") {
        return Ok(None);
    }
    let (protocol, protocol_key) = match (&c.protocol, var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")) {
        (Some(p), _) => (p.clone(), "telemetry.protocol"),
        (None, Some(p)) => (p, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        (None, None) => (var("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_default(), "OTEL_EXPORTER_OTLP_PROTOCOL"),
    };
    let protocol = match protocol.as_str() {
        "" | "http/protobuf" => Protocol::HttpProtobuf,
        "grpc" => Protocol::Grpc,
        other => {
            return Err((
                protocol_key.into(),
                format!("`{other}` is not a protocol poolgate exports with: use `http/protobuf` or `grpc`"),
            ));
        }
    };
    let endpoint = match (&c.endpoint, traces_endpoint, base_endpoint) {
        (Some(e), _, _) => with_path(e, protocol, "telemetry.endpoint")?,
        (None, Some(e), _) => {
            check_url(&e, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?;
            e
        }
        (None, None, Some(e)) => with_path(&e, protocol, "OTEL_EXPORTER_OTLP_ENDPOINT")?,
        (None, None, None) => return Ok(None),
    };
    if protocol == Protocol::Grpc && endpoint.starts_with("https://") {
        return Err((
            protocol_key.into(),
            "gRPC over TLS is not built into poolgate: use `http/protobuf` with the https:// endpoint, or reach \
             the collector over a private network"
                .into(),
        ));
    }
    let headers = headers(c, &var)?;
    let mut resource = pairs(&var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default(), "OTEL_RESOURCE_ATTRIBUTES")?;
    resource.retain(|(k, _)| !c.resource.contains_key(k));
    resource.extend(c.resource.iter().map(|(k, v)| (k.clone(), v.clone())));
    // `service.name` is one setting: the file's, else OTEL_SERVICE_NAME, else
    // the resource attributes' (the order the specification gives).
    let from_resource = resource.iter().find(|(k, _)| k == "service.name").map(|(_, v)| v.clone());
    resource.retain(|(k, _)| k != "service.name");
    let service_name = c
        .service_name
        .clone()
        .or_else(|| var("OTEL_SERVICE_NAME"))
        .or(from_resource)
        .unwrap_or_else(|| "poolgate".into());
    let (sampler, notes) = sampler(c, &var);
    let timeout_ms = match c.timeout_ms {
        Some(t) => t,
        None => match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT")) {
            Some(t) => t.parse().map_err(|_| ("OTEL_EXPORTER_OTLP_TIMEOUT".to_string(), format!("`{t}` is not ms")))?,
            None => 10_000,
        },
    };
    Ok(Some(Settings {
        endpoint,
        protocol,
        headers,
        service_name,
        resource,
        sampler,
        notes,
        propagate_upstream: c.propagate_upstream,
        queue_max: c.queue_max.unwrap_or(2048),
        timeout: Duration::from_millis(timeout_ms.max(1)),
    }))
}

/// Export headers: the environment's lists, then the file's `headers` and
/// `headers_env` (a later source of one header replaces an earlier one).
fn headers(c: &TelemetryConfig, var: &dyn Fn(&str) -> Option<String>) -> Result<Vec<(String, String)>, Problem> {
    let mut headers = Vec::new();
    for k in ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"] {
        headers.extend(pairs(&var(k).unwrap_or_default(), k)?);
    }
    for (name, value) in &c.headers {
        headers.push((name.to_ascii_lowercase(), value.clone()));
    }
    for (name, env_name) in &c.headers_env {
        let key = format!("telemetry.headers_env.{name}");
        let value =
            var(env_name).ok_or_else(|| (key.clone(), format!("the environment variable `{env_name}` is not set")))?;
        headers.push((name.to_ascii_lowercase(), value));
    }
    // A later source of one header replaces an earlier one: file over environment.
    let mut seen = std::collections::HashSet::new();
    headers.reverse();
    headers.retain(|(k, _)| seen.insert(k.clone()));
    headers.reverse();
    for (k, v) in &headers {
        if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            return Err(("telemetry.headers".into(), format!("`{k}` is not a valid header name")));
        }
        if http::HeaderValue::from_str(v).is_err() {
            return Err(("telemetry.headers".into(), format!("the value of `{k}` is not a valid header value")));
        }
    }
    Ok(headers)
}

/// The sampler: the file's `sampling` / `parent_based` over
/// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`. A value it does not
/// know is ignored with a note (as the specification asks), never fatal.
fn sampler(c: &TelemetryConfig, var: &dyn Fn(&str) -> Option<String>) -> (Sampler, Vec<String>) {
    let mut notes = Vec::new();
    let name = var("OTEL_TRACES_SAMPLER").unwrap_or_else(|| "parentbased_always_on".into());
    let mut arg = || match var("OTEL_TRACES_SAMPLER_ARG") {
        None => 1.0,
        Some(a) => a.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)).unwrap_or_else(|| {
            notes.push(format!("OTEL_TRACES_SAMPLER_ARG `{a}` is not a ratio from 0 to 1: 1 is used"));
            1.0
        }),
    };
    let (parent_based, ratio) = match name.as_str() {
        "always_on" => (false, 1.0),
        "always_off" => (false, 0.0),
        "traceidratio" => (false, arg()),
        "parentbased_always_on" => (true, 1.0),
        "parentbased_always_off" => (true, 0.0),
        "parentbased_traceidratio" => (true, arg()),
        other => {
            notes.push(format!(
                "OTEL_TRACES_SAMPLER `{other}` is not a sampler poolgate knows: parentbased_always_on is used"
            ));
            (true, 1.0)
        }
    };
    let sampler = Sampler { parent_based: c.parent_based.unwrap_or(parent_based), ratio: c.sampling.unwrap_or(ratio) };
    (sampler, notes)
}

/// A base URL with the traces path added for HTTP.
fn with_path(base: &str, protocol: Protocol, key: &str) -> Result<String, Problem> {
    check_url(base, key)?;
    let base = base.trim_end_matches('/');
    Ok(match protocol {
        Protocol::HttpProtobuf if !base.ends_with("/v1/traces") => format!("{base}/v1/traces"),
        _ => base.to_string(),
    })
}

fn check_url(url: &str, key: &str) -> Result<(), Problem> {
    let uri: http::Uri = url.parse().map_err(|_| (key.to_string(), "is not a URL".to_string()))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(()),
        _ => Err((key.to_string(), "is not an http:// or https:// URL with a host".into())),
    }
}

/// `k=v,k=v` with percent-encoded values (the `OTEL_*` list format).
fn pairs(list: &str, key: &str) -> Result<Vec<(String, String)>, Problem> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            (key.to_string(), "an entry has no `=` (entries are `name=value`, comma-separated)".to_string())
        })?;
        out.push((k.trim().to_ascii_lowercase(), percent_decode(v.trim())));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex =
            b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `[telemetry]` checked at start and at every reload, against the
/// process's environment.
pub fn check(c: &TelemetryConfig, add: &mut impl FnMut(String, String)) {
    if let Err((key, why)) = settings(c, &|k| std::env::var(k).ok()) {
        add(key, why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn off_without_an_endpoint_and_when_the_environment_says_so() {
        assert_eq!(settings(&TelemetryConfig::default(), &env(&[])).unwrap(), None);
        let c = TelemetryConfig { endpoint: Some("http://c:4318".into()), ..Default::default() };
        assert!(settings(&c, &env(&[])).unwrap().is_some());
        assert_eq!(settings(&c, &env(&[("OTEL_SDK_DISABLED", "true")])).unwrap(), None);
        assert_eq!(settings(&c, &env(&[("OTEL_TRACES_EXPORTER", "none")])).unwrap(), None);
    }

    #[test]
    fn the_file_wins_over_the_environment_which_fills_the_rest() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318/"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=from%20env,x-team=a"),
            ("OTEL_SERVICE_NAME", "gw-env"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging,region=eu"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("TEAM_KEY", "secret"),
        ]);
        let s = settings(&TelemetryConfig::default(), &e).unwrap().unwrap();
        assert_eq!(s.endpoint, "http://env:4318/v1/traces");
        assert_eq!(s.service_name, "gw-env");
        assert_eq!(s.sampler, Sampler { parent_based: true, ratio: 0.25 });
        assert!(s.headers.contains(&("api-key".into(), "from env".into())));
        let c = TelemetryConfig {
            endpoint: Some("http://file:4317".into()),
            protocol: Some("grpc".into()),
            headers_env: [("x-team".to_string(), "TEAM_KEY".to_string())].into(),
            resource: [("deployment.environment".to_string(), "prod".to_string())].into(),
            sampling: Some(0.5),
            service_name: Some("gw".into()),
            ..Default::default()
        };
        let s = settings(&c, &e).unwrap().unwrap();
        assert_eq!((s.endpoint.as_str(), s.protocol), ("http://file:4317", Protocol::Grpc));
        assert_eq!(s.service_name, "gw");
        assert_eq!(s.sampler.ratio, 0.5);
        assert!(s.headers.contains(&("x-team".into(), "secret".into())) && s.headers.len() == 2, "{:?}", s.headers);
        assert!(s.resource.contains(&("deployment.environment".into(), "prod".into())));
        assert!(s.resource.contains(&("region".into(), "eu".into())));
        // OTEL_SERVICE_NAME over the resource attributes' service.name.
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
            ("OTEL_SERVICE_NAME", "a"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=b"),
        ]);
        let s = settings(&TelemetryConfig::default(), &e).unwrap().unwrap();
        assert_eq!(s.service_name, "a");
        assert!(s.resource.iter().all(|(k, _)| k != "service.name"), "{:?}", s.resource);
    }

    #[test]
    fn what_cannot_work_is_refused_naming_where_it_came_from_never_a_value() {
        let bad = |c: TelemetryConfig, e: &[(&str, &str)]| settings(&c, &env(e)).unwrap_err();
        let with = |endpoint: &str| TelemetryConfig { endpoint: Some(endpoint.into()), ..Default::default() };
        assert_eq!(bad(with("collector:4318"), &[]).0, "telemetry.endpoint");
        assert_eq!(bad(with("ftp://c"), &[]).0, "telemetry.endpoint");
        let p = bad(
            TelemetryConfig::default(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
        );
        assert_eq!(p.0, "OTEL_EXPORTER_OTLP_PROTOCOL");
        let c =
            TelemetryConfig { headers_env: [("api-key".to_string(), "NOPE".to_string())].into(), ..with("http://c") };
        assert_eq!(bad(c, &[]).0, "telemetry.headers_env.api-key");
        let c =
            TelemetryConfig { headers: [("api-key".to_string(), "sec\nret".to_string())].into(), ..with("http://c") };
        let (key, why) = bad(c, &[]);
        assert!(key == "telemetry.headers" && !why.contains("sec"), "{why}");
        let c = TelemetryConfig { protocol: Some("grpc".into()), ..with("https://c:4317") };
        assert_eq!(bad(c, &[]).0, "telemetry.protocol", "gRPC over TLS is not built in");
        // Meant for other programs: ignored with a note, never fatal; and
        // nothing is read at all without an endpoint.
        let s = settings(&with("http://c"), &env(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")])).unwrap().unwrap();
        assert_eq!((s.sampler, s.notes.len()), (Sampler { parent_based: true, ratio: 1.0 }, 1));
        let e = env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), ("OTEL_TRACES_SAMPLER_ARG", "x")]);
        assert_eq!(settings(&TelemetryConfig::default(), &e).unwrap(), None);
    }
}
