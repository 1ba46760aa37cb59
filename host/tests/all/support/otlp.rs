//! An OTLP receiver on a free loopback port, in process: what the gateway
//! exports, decoded with the OpenTelemetry protobuf definitions, over
//! HTTP/protobuf (`POST /v1/traces`) or gRPC (`TraceService/Export`).

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use prost::Message as _;

/// What the receiver got, export by export.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

impl Received {
    /// Every span received, with its resource's `service.name`.
    pub fn spans(&self) -> Vec<(String, Span)> {
        let mut out = Vec::new();
        for export in self.0.lock().iter() {
            for rs in &export.resource_spans {
                let attrs = rs.resource.as_ref().map(|r| r.attributes.as_slice()).unwrap_or_default();
                let service = text(attrs, "service.name").unwrap_or_default();
                for ss in &rs.scope_spans {
                    out.extend(ss.spans.iter().map(|s| (service.clone(), s.clone())));
                }
            }
        }
        out
    }

    /// The spans of trace `trace_id` (hex).
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans().into_iter().map(|(_, s)| s).filter(|s| hex::encode(&s.trace_id) == trace_id).collect()
    }
}

/// An attribute's value.
pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v: &AnyValue| v.value.as_ref())
}

/// A string attribute.
pub fn text(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key)? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// An integer attribute.
pub fn int(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

/// A receiver listening for OTLP over HTTP; its endpoint URL and what it got.
pub async fn http() -> (String, Received) {
    let received = Received::default();
    let keep = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                match ExportTraceServiceRequest::decode(body) {
                    Ok(r) => {
                        keep.0.lock().push(r);
                        let ok = ExportTraceServiceResponse::default().encode_to_vec();
                        (http::StatusCode::OK, [(http::header::CONTENT_TYPE, "application/x-protobuf")], ok)
                    }
                    Err(_) => (http::StatusCode::BAD_REQUEST, [(http::header::CONTENT_TYPE, "text/plain")], Vec::new()),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

struct Collector(Received);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.0.lock().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A receiver listening for OTLP over gRPC; its address and what it got.
pub async fn grpc() -> (String, Received) {
    let received = Received::default();
    let routes = tonic::service::Routes::new(TraceServiceServer::new(Collector(received.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, routes.into_axum_router()).await });
    (url, received)
}
