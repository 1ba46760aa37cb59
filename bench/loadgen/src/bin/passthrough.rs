//! `poolgate-passthrough`: the floor any hyper-based proxy pays.
//!
//! A hyper 1 server (HTTP/1.1 and prior-knowledge HTTP/2 on one port, hyper's
//! auto builder) in front of one upstream, reached through hyper-util's pooled
//! client over HTTP/1.1: method, path, headers and body are forwarded, bodies
//! stream both ways frame by frame, every socket sets TCP_NODELAY. No routing,
//! no parsing, no accounting — what poolgate costs beyond this is poolgate's own
//! work, what this costs beyond HAProxy is the hyper/tokio stack's.
//!
//! Usage: `poolgate-passthrough --upstream http://127.0.0.1:9100 [--listen ADDR]`;
//! prints `passthrough listening on http://…` once bound.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;

#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The one upstream, `http://host:port`.
    #[arg(long)]
    upstream: String,
}

type Upstream = Client<HttpConnector, Incoming>;
type Body = Either<Incoming, Empty<Bytes>>;

/// Headers that belong to one connection, never forwarded (RFC 9110 7.6.1).
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::UPGRADE,
    HeaderName::from_static("proxy-connection"),
];

fn strip(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

async fn forward(client: Upstream, upstream: &str, req: Request<Incoming>) -> Result<Response<Body>> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{upstream}{path}").parse::<Uri>()?;
    parts.version = hyper::Version::HTTP_11;
    // The client writes the upstream's own Host from the URI.
    parts.headers.remove(header::HOST);
    strip(&mut parts.headers);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip(&mut parts.headers);
            Ok(Response::from_parts(parts, Either::Left(body)))
        }
        Err(_) => {
            let mut resp = Response::new(Either::Right(Empty::new()));
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            Ok(resp)
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let upstream: &'static str = Box::leak(args.upstream.trim_end_matches('/').to_string().into_boxed_str());
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // The timer lets the pool close connections idle for 90 s (hyper-util's
    // default idle timeout, the gateway's too): without one they stay forever.
    let client: Upstream = Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(connector);
    let listener = tokio::net::TcpListener::bind(args.listen).await.context("bind")?;
    println!("passthrough listening on http://{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let client = client.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| forward(client.clone(), upstream, req));
            let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
