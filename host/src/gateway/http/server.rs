//! The listener: every connection read through the connection guard
//! ([`super::conn`]), at most `server.max_connections` of them, with
//! TCP_NODELAY; and a shutdown in stages.
//!
//! On SIGTERM ([`Stop::Drain`]) `/readyz` answers 503 at once and the service
//! manager hears `STOPPING=1`; connections already open close after their
//! current request (HTTP/2 ones get GOAWAY); the listener keeps accepting for
//! `server.drain_ms` — new connections are served, one request each — so a
//! load balancer that still sends traffic is answered while it moves it; then
//! the listener closes. Open requests and streams get until
//! `server.shutdown_grace_ms` after the signal (the drain window is part of
//! it); an answer still open then is cut, a stream with an SSE `error` event,
//! and recorded as `shutdown`. SIGINT (Ctrl-C at a terminal: nobody balances
//! load there) skips the drain window ([`Stop::Close`]); a second signal cuts
//! everything at once ([`Stop::Now`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::body::Body;
use axum::response::Response;
use futures_util::future::Either;
use hyper::body::Incoming;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::conn::head::Sniff;
use super::conn::track::{AtEnd, Shared, Ticket};
use super::conn::{self, Guard, Limits};
use super::routes::{self, AppState, router};
use super::sd_notify;
use super::signals::{Signals, Stop};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::gateway::lifecycle::{self, OpenFiles};
use crate::gateway::reload::Reloader;
use crate::gateway::request::read::Connection;
use crate::policy::PolicyEngine;

/// Builds the reload hook once the gateway exists.
pub type MakeReloader = Box<dyn FnOnce(&Arc<Gateway>) -> Reloader + Send>;

/// How long cut answers get to write their last event before the process
/// stops waiting for them.
const CUT_FLUSH: Duration = Duration::from_secs(2);

/// Connections over the limit being answered at once, at most: past it they
/// are closed without an answer (each answer holds a descriptor for up to
/// [`conn::refuse::LINGER`]).
const MAX_REFUSALS: usize = 64;

/// How often the "connection limit reached" warning may repeat.
const LIMIT_WARN_EVERY: Duration = Duration::from_secs(10);

/// A gateway serving in the background of the current tokio runtime.
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// The reload hook, when the gateway was started from a file.
    pub reloader: Option<Reloader>,
    stop: watch::Sender<Option<Stop>>,
    task: JoinHandle<Result<()>>,
}

impl Running {
    /// Loads `config` (compiling the chain off the async workers), binds
    /// `server.listen` and starts serving. `reloader`, if given, backs
    /// `POST /admin/reload`.
    pub async fn start(config: Config, engine: Arc<PolicyEngine>, reloader: Option<MakeReloader>) -> Result<Running> {
        let listen = config.server.listen.clone();
        let warm = engine.clone();
        let gateway = Gateway::new(config, engine).await?;
        // Replicas: in step with the others (or given up on it) before the
        // seats are healed and the first request is taken.
        gateway.shared.settle().await;
        // Seats whose token expired while the gateway was down are refreshed
        // before it serves, then kept fresh in the background.
        crate::gateway::seat_keeper::heal(&gateway).await;
        crate::gateway::seat_keeper::spawn(&gateway);
        crate::gateway::memory::spawn(&gateway);
        // After the first generation: the chain's own built-ins are in memory by now.
        warm.warm_builtins();
        size_connections(&gateway, lifecycle::raise_open_files());
        let listener = bind(&listen).await?;
        let addr = listener.local_addr()?;
        check_exposure(&addr, !gateway.generation().client_keys.is_empty())?;
        // Where it listens is fixed until a restart; reloads are judged against it.
        let _ = gateway.listening.set(addr);
        let reloader = reloader.map(|make| announce_reloads(make(&gateway)));
        let (stop, stopped) = watch::channel(None);
        let state = AppState {
            gateway: gateway.clone(),
            reloader: reloader.clone(),
            ui_pages: Arc::new(tokio::sync::Semaphore::new(super::ui::events::PAGES_MAX)),
        };
        let task = tokio::spawn(serve(listener, state, stopped));
        Ok(Running { addr, gateway, reloader, stop, task })
    }

    /// Starts a shutdown without the drain window.
    pub fn stop(&self) {
        self.request(Stop::Close);
    }

    /// Asks for a shutdown `how`, unless a stronger one was asked already.
    pub fn request(&self, how: Stop) {
        self.stop.send_if_modified(|now| {
            let stronger = now.is_none_or(|n| how > n);
            if stronger {
                *now = Some(how);
            }
            stronger
        });
    }

    /// Waits until the server has stopped.
    pub async fn wait(self) -> Result<()> {
        self.task.await?
    }

    /// Shuts down `how` and waits until the server has stopped; a signal that
    /// arrives meanwhile (`signals`) cuts whatever is still open at once.
    pub async fn shutdown(self, how: Stop, mut signals: Signals) -> Result<()> {
        self.request(how);
        let Running { stop, mut task, .. } = self;
        tokio::select! {
            done = &mut task => return done?,
            signal = signals.next() => {
                tracing::warn!(signal = signal.name(), "second signal: stopping at once");
                stop.send_replace(Some(Stop::Now));
            }
        }
        task.await?
    }
}

/// Sets the connection limit `server.max_connections = 0` stands for, from
/// the open-file limit, and says what it is.
fn size_connections(gateway: &Gateway, files: Option<OpenFiles>) {
    let Some(files) = files else { return };
    let auto = lifecycle::auto_connections(files.now);
    gateway.lifecycle.set_auto_limit(auto);
    let configured = gateway.generation().config.server.max_connections;
    let limit = gateway.lifecycle.connection_limit(configured);
    tracing::info!(
        max_connections = limit,
        configured = configured != 0,
        open_files = files.now,
        open_files_before = files.before,
        "client connections: at most {limit} open; open-file limit {}{}",
        files.now,
        if files.now > files.before {
            format!(" (raised from {} to the hard limit)", files.before)
        } else {
            String::new()
        },
    );
    if configured > auto {
        tracing::warn!(
            max_connections = configured,
            open_files = files.now,
            "server.max_connections = {configured} is more than the open-file limit ({}) leaves room for (about \
             {auto}, two descriptors a connection and {} in reserve): raise the limit (LimitNOFILE=, ulimit -n) or \
             lower server.max_connections",
            files.now,
            lifecycle::RESERVED_FDS,
        );
    }
}

/// Tells the service manager about each reload (`RELOADING=1`, then
/// `READY=1`).
fn announce_reloads(inner: Reloader) -> Reloader {
    Arc::new(move |request| {
        let inner = inner.clone();
        Box::pin(async move {
            sd_notify::reloading();
            let done = inner(request).await;
            let status = match &done {
                Ok(generation) => format!("serving configuration generation {generation}"),
                Err(crate::gateway::ReloadError::Refused(_)) => {
                    "reload refused; the running configuration stays".to_string()
                }
                // The newer reload that took over says READY=1 when it ends.
                Err(crate::gateway::ReloadError::Superseded { .. }) => return done,
            };
            sd_notify::ready(&status);
            done
        })
    })
}

/// Binds `addr`.
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))
}

/// Refuses to expose an open gateway: without client keys, only a loopback
/// address is allowed.
pub fn check_exposure(addr: &SocketAddr, has_client_keys: bool) -> Result<()> {
    if !crate::config::serving::exposure_allowed(addr, has_client_keys) {
        bail!(
            "server.listen = {addr} is not a loopback address and no client keys are configured: \
             anyone who can reach it could spend the pool. Add [[server.client_keys]] or listen on 127.0.0.1"
        );
    }
    Ok(())
}

/// How far a shutdown has gone: a connection is asked to close (after its
/// current request) once the stage it waits for is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Serving,
    Draining,
    Closed,
}

/// Serves until `stop` asks for a shutdown, then shuts down in stages (see
/// the module's documentation).
///
/// Each connection is served by hyper (HTTP/1.1, and HTTP/2 with prior
/// knowledge) through the connection guard, with head limits above poolgate's
/// own ([`routes::MAX_HEADERS`], `server.max_header_bytes`; hyper's are
/// [`routes::SERVER_HEAD_BYTES`]), so that a request with too large a head gets
/// poolgate's 431 — in Anthropic's error shape, with a request id — rather
/// than hyper's bare one.
pub async fn serve(listener: TcpListener, state: AppState, mut stop: watch::Receiver<Option<Stop>>) -> Result<()> {
    let gateway = state.gateway.clone();
    let mut acceptor = Acceptor {
        gateway: gateway.clone(),
        app: TowerToHyperService::new(router(state)),
        stage: watch::channel(Stage::Serving).0,
        refusals: Arc::new(Semaphore::new(MAX_REFUSALS)),
        warned: None,
    };
    let mut how = loop {
        tokio::select! {
            accepted = listener.accept() => acceptor.take(accepted, Stage::Draining).await,
            asked = wait_for_stop(&mut stop, Stop::Drain) => break asked,
        }
    };
    let signalled = Instant::now();
    let (grace, drain) = {
        let g = gateway.generation();
        let s = &g.config.server;
        let drain = if how == Stop::Drain { s.drain_ms } else { 0 };
        (Duration::from_millis(s.shutdown_grace_ms), Duration::from_millis(drain))
    };
    gateway.lifecycle.start_draining();
    sd_notify::stopping("poolgate is shutting down");
    acceptor.stage.send_replace(Stage::Draining);
    if !drain.is_zero() && how < Stop::Now {
        tracing::info!(
            drain_ms = drain.as_millis() as u64,
            grace_ms = grace.as_millis() as u64,
            "shutting down: /readyz answers 503; still accepting connections for drain_ms"
        );
        let window = tokio::time::sleep(drain);
        tokio::pin!(window);
        loop {
            tokio::select! {
                accepted = listener.accept() => acceptor.take(accepted, Stage::Closed).await,
                () = &mut window => break,
                asked = wait_for_stop(&mut stop, Stop::Now) => {
                    how = asked;
                    break;
                }
            }
        }
    }
    drop(listener);
    acceptor.stage.send_replace(Stage::Closed);
    if how < Stop::Now {
        let left = (signalled + grace).saturating_duration_since(Instant::now());
        tracing::info!(
            grace_left_ms = left.as_millis() as u64,
            connections = gateway.lifecycle.connections(),
            "shutting down: no new connections; waiting for open requests and streams"
        );
        tokio::select! {
            () = gateway.lifecycle.all_closed() => return Ok(()),
            () = tokio::time::sleep_until(signalled + grace) => {
                tracing::warn!("shutdown grace expired; cutting what is still open");
            }
            _ = wait_for_stop(&mut stop, Stop::Now) => {}
        }
    }
    gateway.lifecycle.cut_streams();
    // Cut streams end with their error event: let the connections write it.
    let _ = tokio::time::timeout(CUT_FLUSH, gateway.lifecycle.all_closed()).await;
    Ok(())
}

/// Resolves with the shutdown asked for once it is at least `at_least`.
async fn wait_for_stop(stop: &mut watch::Receiver<Option<Stop>>, at_least: Stop) -> Stop {
    let asked = stop.wait_for(|s| s.is_some_and(|s| s >= at_least)).await.ok().and_then(|s| *s);
    match asked {
        Some(s) => s,
        // The handle is gone: nobody can ask any more.
        None => std::future::pending().await,
    }
}

/// Takes accepted connections.
struct Acceptor {
    gateway: Arc<Gateway>,
    app: TowerToHyperService<axum::Router>,
    stage: watch::Sender<Stage>,
    refusals: Arc<Semaphore>,
    warned: Option<Instant>,
}

impl Acceptor {
    /// Serves an accepted connection (asked to close once `closes_at` is
    /// reached), or refuses it when the limit is reached.
    async fn take(&mut self, accepted: std::io::Result<(TcpStream, SocketAddr)>, closes_at: Stage) {
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors, or a connection reset while queued:
                // the listener stays; pause a moment rather than spin.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
        };
        let (limits, limit) = {
            let g = self.gateway.generation();
            (Limits::of(&g.config.server), self.gateway.lifecycle.connection_limit(g.config.server.max_connections))
        };
        if self.gateway.lifecycle.connections() >= limit {
            self.over_limit(tcp, limit);
            return;
        }
        let _ = tcp.set_nodelay(true);
        let slot = self.gateway.lifecycle.open_connection();
        let shared = Arc::new(Shared::default());
        let mut io = Guard::new(tcp, shared.clone(), self.gateway.clone(), limits);
        let (gateway, app, mut stage) = (self.gateway.clone(), self.app.clone(), self.stage.subscribe());
        tokio::spawn(async move {
            // Dropped (with its slot) when it ends before its first byte.
            let Some(opens) = first_bytes(&mut io, &mut stage).await else { return };
            let service = service(gateway, app, shared.clone());
            let builder = builder(&limits, closes_at == Stage::Draining, opens);
            let conn = builder.serve_connection(TokioIo::new(io), service).into_owned();
            drive(conn, shared, stage, closes_at, limits.header_timeout, slot).await;
        });
    }

    /// A connection over the limit: answered (and closed) on a task of its
    /// own, bounded, so the listener goes on accepting.
    fn over_limit(&mut self, tcp: TcpStream, limit: usize) {
        let now = Instant::now();
        if self.warned.is_none_or(|w| now.duration_since(w) >= LIMIT_WARN_EVERY) {
            self.warned = Some(now);
            tracing::warn!(
                max_connections = limit,
                "connection limit reached: new connections are refused (503) until some close"
            );
        }
        match self.refusals.clone().try_acquire_owned() {
            Ok(permit) => {
                let gateway = self.gateway.clone();
                tokio::spawn(async move {
                    conn::refuse::over_limit(tcp, &gateway, limit).await;
                    drop(permit);
                });
            }
            Err(_) => {
                self.gateway.metrics.refused("too_many_connections");
                drop(tcp);
            }
        }
    }
}

/// Waits for a connection's first bytes (see [`Guard::poll_opens`]): what
/// they open, or `None` when it ends first — or the listener closes while it
/// is still silent.
async fn first_bytes(io: &mut Guard, stage: &mut watch::Receiver<Stage>) -> Option<Sniff> {
    tokio::select! {
        opens = std::future::poll_fn(|cx| io.poll_opens(cx)) => opens,
        _ = stage.wait_for(|s| *s >= Stage::Closed) => None,
    }
}

/// Serves one connection to its end, asking it to close gracefully — after
/// the request in progress; HTTP/2 with GOAWAY — when its guard finds it idle
/// too long (it then gets `idle_grace` to finish closing), or when the
/// shutdown reaches `closes_at`. A connection whose first bytes have not
/// arrived is asked only once they have (the server would drop a request it
/// has not read), or once the listener is closed.
async fn drive<C>(
    conn: C,
    shared: Arc<Shared>,
    mut stage: watch::Receiver<Stage>,
    closes_at: Stage,
    idle_grace: Duration,
    slot: lifecycle::Slot,
) where
    C: GracefulConnection,
{
    let _slot = slot;
    tokio::pin!(conn);
    let mut closing = false;
    let mut stage_reached = false;
    let mut marking = false;
    // An HTTP/2 client must answer the GOAWAY's ping before the connection
    // ends: one that never does must not keep it.
    let mut forced: Option<Instant> = None;
    loop {
        // Biased, the connection first: this loop is polled on every wake of
        // a busy connection, and the other branches change only at a
        // shutdown or an idle timeout. One wait on the shutdown's stage serves
        // both of its thresholds.
        tokio::select! {
            biased;
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(forced.unwrap_or_else(Instant::now)), if forced.is_some() => {
                tracing::debug!("an idle connection did not close when asked; dropped");
                return;
            }
            () = shared.close_requested(), if !closing => {
                conn.as_mut().graceful_close();
                closing = true;
                forced = Some(Instant::now() + idle_grace);
            }
            () = shared.protocol_known(), if stage_reached && !closing && !marking => {
                if shared.is_http2() {
                    // GOAWAY: streams in flight finish, new ones go elsewhere.
                    conn.as_mut().graceful_close();
                    closing = true;
                } else {
                    // HTTP/1 kept alive (a load balancer's pool, say): closing
                    // it idle now would race a request already on its way. Its
                    // next answer says `connection: close` (see `service`);
                    // one still idle closes with the listener.
                    marking = true;
                }
            }
            now = stage.wait_for(|s| *s >= if stage_reached { Stage::Closed } else { closes_at }), if !closing => {
                if now.map_or(Stage::Closed, |s| *s) >= Stage::Closed {
                    // The listener closed: every connection is asked to close.
                    conn.as_mut().graceful_close();
                    closing = true;
                } else {
                    stage_reached = true;
                }
            }
        }
    }
}

/// A connection that can be asked to close gracefully.
trait GracefulConnection: Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> + Send + 'static {
    fn graceful_close(self: std::pin::Pin<&mut Self>);
}

impl<I, S, B> GracefulConnection for auto::Connection<'static, I, S, TokioExecutor>
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_close(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// The service for one connection: the router, behind the gateway's own head
/// check, telling the guard when each request starts and ends.
fn service(
    gateway: Arc<Gateway>,
    app: TowerToHyperService<axum::Router>,
    shared: Arc<Shared>,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |req: http::Request<Incoming>| {
        use http_body::Body as _;
        shared.request_started(req.body().is_end_stream());
        let req_version_is_http1 = req.version() < http::Version::HTTP_2;
        let ticket = Ticket::new(shared.clone());
        let refused = routes::oversized_head(&gateway, req.method(), req.uri(), req.headers());
        let answer = match refused {
            Some(r) => Either::Left(std::future::ready(Ok(r))),
            None => {
                let mut req = req.map(|b| Body::new(AtEnd::new(b, shared.clone())));
                // The connection's state, for a request whose answer is
                // dropped early to learn why (`server.send_timeout_ms`).
                req.extensions_mut().insert(Connection(shared.clone()));
                Either::Right(app.call(req))
            }
        };
        let http1 = req_version_is_http1;
        let (gateway, shared) = (gateway.clone(), shared.clone());
        async move {
            let mut r: Response = answer.await?;
            // An HTTP/1 answer closes its connection when the request's body
            // was not read to its end (a refusal before it: the next head
            // would arrive behind unread bytes, unguarded), and while the
            // gateway drains (the client moves to another instance).
            if http1 && (!shared.requests().body_done || gateway.lifecycle.draining()) {
                r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            Ok(r.map(|b| Body::new(AtEnd::new(b, ticket))))
        }
    })
}

/// The HTTP server for one connection, for the protocol its first bytes
/// open (`opens`; undecided, the server tells from the bytes itself). Its own
/// head timer (hyper's) is a backstop behind the guard's: it runs from the
/// start of a head read, kept-alive idleness included.
fn builder(limits: &Limits, keep_alive: bool, opens: Sniff) -> auto::Builder<TokioExecutor> {
    let mut builder = match opens {
        Sniff::Http1 => auto::Builder::new(TokioExecutor::new()).http1_only(),
        Sniff::Http2 => auto::Builder::new(TokioExecutor::new()).http2_only(),
        Sniff::Undecided => auto::Builder::new(TokioExecutor::new()),
    };
    builder
        .http1()
        .max_headers(routes::MAX_HEADERS * 10)
        .max_buf_size(routes::SERVER_HEAD_BYTES)
        .keep_alive(keep_alive)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout + limits.header_timeout + Duration::from_secs(5));
    builder.http2().max_header_list_size(routes::SERVER_HEAD_BYTES as u32);
    builder
}
