//! Reloading: a new generation is built beside the running one and swapped in
//! only if every part of it loads.
//!
//! A newer reload supersedes one still loading rather than queueing behind it:
//! the older one's build is dropped — its task on the plugin builder thread
//! aborted, the instance it was configuring freed — and the newer one reads the
//! file afresh, so what ends up loaded is the newest file, and a plugin whose
//! `configure` hangs never holds the next reload for longer than it takes to
//! drop it. Every load is bounded per phase ([`super::generation::LoadBounds`]):
//! one that gives up is refused naming the stage and the phase it was in.
//!
//! Each reload takes a ticket ([`Gateway::reload_turn`]); the newest ticket is
//! the only one that may load. A superseded reload ends with
//! [`ReloadError::Superseded`]; the triggers decide what to make of it —
//! `POST /admin/reload` waits for the reload that superseded it and answers
//! with that one's outcome (docs/configuration.md, *Reloading*, says why), SIGHUP and the file
//! watcher only log it.

use std::sync::Arc;

use tokio::sync::{OwnedMutexGuard, watch};

use super::{Gateway, Generation, admin, change};
use crate::config::Config;

/// A hook the server installs to reload the configuration from its source:
/// called with what triggered it, it resolves to the new generation's number,
/// to why the reload was refused, or to its being superseded by a newer one.
pub type Reloader =
    Arc<dyn Fn(ReloadRequest) -> futures_util::future::BoxFuture<'static, Result<u64, ReloadError>> + Send + Sync>;

/// What asked for a reload.
#[derive(Debug, Clone, Copy)]
pub struct ReloadRequest {
    /// `file-watch`, `sighup` or `admin`.
    pub trigger: &'static str,
    /// The SHA-256 of the config file the watcher saw settle: a reload that
    /// reads anything else (the file is being rewritten again) leaves the
    /// running configuration alone and lets the watcher come back.
    pub expect_sha256: Option<[u8; 32]>,
}

impl ReloadRequest {
    /// A reload of whatever the file holds now.
    pub fn now(trigger: &'static str) -> Self {
        ReloadRequest { trigger, expect_sha256: None }
    }
}

/// Reloads kept in the history `/status` shows.
pub const HISTORY: usize = 20;

/// The outcome of a reload, for `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadStatus {
    /// When it finished.
    pub at_ms: u64,
    /// Whether it was applied.
    pub ok: bool,
    /// What triggered it.
    pub trigger: String,
    /// Why it was refused, one line per problem.
    pub errors: Vec<String>,
    /// Reloads refused in a row.
    pub consecutive_failures: u32,
}

/// Why a reload did not load what it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadError {
    /// Refused, one line per problem; the running configuration stays.
    Refused(String),
    /// A newer reload (ticket greater than `ticket`) took over before this one
    /// finished; [`Gateway::reload_outcome_after`] tells how that one ended.
    Superseded {
        /// This reload's ticket.
        ticket: u64,
    },
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::Refused(m) => f.write_str(m),
            ReloadError::Superseded { .. } => f.write_str("superseded by a newer reload before it finished"),
        }
    }
}

impl From<String> for ReloadError {
    fn from(message: String) -> Self {
        ReloadError::Refused(message)
    }
}

/// How a reload that was not superseded ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Its ticket.
    pub ticket: u64,
    /// What triggered it.
    pub trigger: String,
    /// The generation it loaded, or why it was refused.
    pub result: Result<u64, String>,
}

/// The reloads of one gateway.
pub struct Reloads {
    /// The newest ticket handed out.
    latest: watch::Sender<u64>,
    /// Held by the reload that is reading and loading; a superseded one lets
    /// go of it as it stops.
    building: Arc<tokio::sync::Mutex<()>>,
    /// How the last reload that was not superseded ended.
    finished: watch::Sender<Option<Finished>>,
}

impl Default for Reloads {
    fn default() -> Self {
        Reloads { latest: watch::Sender::new(0), building: Arc::default(), finished: watch::Sender::new(None) }
    }
}

/// A reload's turn: it holds the right to load until it ends or a newer
/// reload takes a turn.
pub struct ReloadTurn {
    ticket: u64,
    latest: watch::Receiver<u64>,
    _building: OwnedMutexGuard<()>,
}

impl ReloadTurn {
    /// This reload's ticket.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// Whether a newer reload has taken a ticket.
    pub fn is_superseded(&self) -> bool {
        *self.latest.borrow() != self.ticket
    }

    /// Resolves once a newer reload has taken a ticket.
    async fn superseded(&self) {
        let mut latest = self.latest.clone();
        let ticket = self.ticket;
        // The sender lives in the gateway, which outlives every turn.
        let _ = latest.wait_for(|t| *t != ticket).await;
    }
}

impl Gateway {
    /// Builds a new generation from `config` and swaps it in (see
    /// [`Gateway::reload_in_turn`]), superseding any reload still loading.
    pub async fn reload(
        &self,
        config: Config,
        trigger: &str,
        locate: &(dyn Fn(&str) -> String + Sync),
    ) -> Result<u64, ReloadError> {
        let turn = self.reload_turn().await?;
        self.reload_in_turn(&turn, config, trigger, locate).await
    }

    /// Takes a turn to reload: every reload still loading is superseded (it
    /// stops at once, its build dropped), and this waits only for it to let
    /// go. A reload that reads its config from a file reads it in its turn, so
    /// it reads what is there when it runs, not when it was asked — the newest
    /// file wins. `Err(Superseded)` if a newer reload took a turn while this
    /// one waited.
    pub async fn reload_turn(&self) -> Result<ReloadTurn, ReloadError> {
        let mut ticket = 0;
        self.reloads.latest.send_modify(|t| {
            *t += 1;
            ticket = *t;
        });
        let latest = self.reloads.latest.subscribe();
        let building = self.reloads.building.clone().lock_owned().await;
        let turn = ReloadTurn { ticket, latest, _building: building };
        if turn.is_superseded() {
            return Err(ReloadError::Superseded { ticket });
        }
        Ok(turn)
    }

    /// Resolves once no reload is loading: the one under way, if any, has
    /// recorded how it ended.
    pub async fn reloads_settled(&self) {
        drop(self.reloads.building.lock().await);
    }

    /// How the first reload after ticket `ticket` that was not superseded
    /// ended: what a superseded reload's caller waits for. `None` if none
    /// ended within `wait`.
    pub async fn reload_outcome_after(&self, ticket: u64, wait: std::time::Duration) -> Option<Finished> {
        let mut finished = self.reloads.finished.subscribe();
        let after = finished.wait_for(|f| f.as_ref().is_some_and(|f| f.ticket > ticket));
        match tokio::time::timeout(wait, after).await {
            Ok(Ok(f)) => f.clone(),
            _ => None,
        }
    }

    /// [`Gateway::reload`], for a caller holding its turn: the new generation
    /// is built off the request path within the bounds of a start
    /// ([`Generation::build_bounded`]) and swapped in only if every part of it
    /// loads; otherwise the running one stays. `locate` rewrites an error line
    /// to point into the file (identity when there is none). A newer reload
    /// taking a turn meanwhile drops this one's build.
    pub async fn reload_in_turn(
        &self,
        turn: &ReloadTurn,
        config: Config,
        trigger: &str,
        locate: &(dyn Fn(&str) -> String + Sync),
    ) -> Result<u64, ReloadError> {
        let load = self.load(config, trigger, locate);
        let result = tokio::select! {
            result = load => result,
            () = turn.superseded() => {
                tracing::info!(
                    target: "poolgate::reload",
                    trigger,
                    "reload superseded by a newer one before it finished; its build was dropped"
                );
                return Err(ReloadError::Superseded { ticket: turn.ticket });
            }
        };
        self.publish(turn, trigger, &result);
        result.map_err(ReloadError::Refused)
    }

    /// Records a reload refused before a generation could be built (a file
    /// that cannot be read, does not parse or validate), for the caller
    /// holding `turn`; the refusal to return.
    pub fn refuse_in_turn(&self, turn: &ReloadTurn, trigger: &str, message: String) -> ReloadError {
        self.refuse_reload(trigger, &message);
        self.publish(turn, trigger, &Err(message.clone()));
        ReloadError::Refused(message)
    }

    /// Ends a turn that loads nothing (the file changed again under a
    /// watcher's reload; the watcher comes back once it settles): a reload it
    /// superseded hears that the running generation stays.
    pub fn pass_turn(&self, turn: &ReloadTurn, trigger: &str) -> u64 {
        let number = self.generation().number;
        self.publish(turn, trigger, &Ok(number));
        number
    }

    fn publish(&self, turn: &ReloadTurn, trigger: &str, result: &Result<u64, String>) {
        let finished = Finished { ticket: turn.ticket, trigger: trigger.into(), result: result.clone() };
        self.reloads.finished.send_replace(Some(finished));
    }

    /// Judges, builds and swaps in `config`.
    async fn load(
        &self,
        config: Config,
        trigger: &str,
        locate: &(dyn Fn(&str) -> String + Sync),
    ) -> Result<u64, String> {
        let number = self.generation().number + 1;
        let started = self.clock.instant();
        let mut weakens =
            crate::config::serving::reload_weakens(&self.generation().config, self.listening.get().copied(), &config);
        // `[ledger]` takes effect at a restart: a budget a reload adds to a
        // gateway running without a ledger could not hold across one.
        if self.ledger.is_none()
            && let Some((i, k)) = config.server.client_keys.iter().enumerate().find(|(_, k)| k.has_budget())
        {
            weakens.push(format!(
                "server.client_keys[{i}]: key `{}` has a budget, and this gateway runs without a usage ledger \
                 ([ledger] changes take effect at a restart)",
                k.name
            ));
        }
        if !weakens.is_empty() {
            let message = weakens.iter().map(|w| locate(w)).collect::<Vec<_>>().join("\n");
            self.refuse_reload(trigger, &message);
            return Err(message);
        }
        self.engine.set_compile_limits(config.compile_limits());
        let running = self.generation();
        let around = super::generation::Around {
            engine: &self.engine,
            plugin_state: &self.plugin_state,
            book: &self.book,
            metrics: &self.metrics,
            clock: &self.clock,
            http: &self.http,
        };
        let built = Generation::build_bounded(number, config, &around, Some(&running.chain)).await;
        drop(running);
        match built {
            Ok(generation) => {
                let changes = self.swap(generation);
                let status = ReloadStatus {
                    at_ms: self.clock.now_ms(),
                    ok: true,
                    trigger: trigger.into(),
                    errors: Vec::new(),
                    consecutive_failures: 0,
                };
                self.remember_reload(&status);
                *self.last_reload.lock() = Some(status);
                tracing::info!(
                    target: "poolgate::reload",
                    generation = number,
                    trigger,
                    took_ms = self.clock.since(started).as_millis() as u64,
                    "configuration reloaded: {changes}"
                );
                Ok(number)
            }
            Err(e) => {
                let message = locate(&format!("{e:#}"));
                self.refuse_reload(trigger, &message);
                Err(message)
            }
        }
    }

    /// Puts `generation` in force; what changed, in words.
    fn swap(&self, generation: Generation) -> String {
        let (was, now) = (&self.generation().config, &generation.config);
        let restart_only = [
            ("server.listen", was.server.listen != now.server.listen),
            ("server.log_format", was.server.log_format != now.server.log_format),
            ("gateway.connect_timeout_ms", was.gateway.connect_timeout_ms != now.gateway.connect_timeout_ms),
            ("state", was.state != now.state),
            ("ledger", was.ledger != now.ledger),
            ("telemetry", was.telemetry != now.telemetry),
        ];
        for (key, changed) in restart_only {
            if changed {
                tracing::warn!(key, "changed, but takes effect only at the next restart");
            }
        }
        let changes = change::describe(&self.generation(), &generation);
        self.decisions.resize(generation.config.server.decisions_kept);
        self.plugin_state.set_limits(generation.config.state_limits());
        self.plugin_state.retain_scopes(&generation.chain.scopes());
        self.share_seats(&generation);
        self.current.store(Arc::new(generation));
        admin::note_reload(self);
        self.metrics.reload(true);
        changes
    }

    /// Keeps a reload's outcome in the history `/status` shows (the web
    /// page's reload list).
    fn remember_reload(&self, status: &ReloadStatus) {
        let mut h = self.reload_history.lock();
        if h.len() >= HISTORY {
            h.pop_front();
        }
        h.push_back(status.clone());
    }

    /// Records a reload that was refused. The running configuration stays.
    pub fn refuse_reload(&self, trigger: &str, message: &str) {
        self.metrics.reload(false);
        let mut last = self.last_reload.lock();
        let failures = last.as_ref().map_or(0, |l| l.consecutive_failures);
        let errors: Vec<String> = message.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
        // One line per refusal, its problems in it (escaped onto the line, or
        // a JSON string). The same problems refused again — the file watcher
        // and a SIGHUP meeting the same file — are not written out twice.
        let again = last.as_ref().is_some_and(|l| !l.ok && l.errors == errors);
        if again {
            tracing::warn!(
                trigger,
                refusals = failures + 1,
                "reload refused again for the same problems; the running configuration stays"
            );
        } else {
            tracing::error!(trigger, error = %message.trim_end(), "reload refused; the running configuration stays");
        }
        let status = ReloadStatus {
            at_ms: self.clock.now_ms(),
            ok: false,
            trigger: trigger.into(),
            errors,
            consecutive_failures: failures + 1,
        };
        // The same refusal again is one entry in the history, counted.
        if !again {
            self.remember_reload(&status);
        } else if let Some(l) = self.reload_history.lock().back_mut() {
            l.consecutive_failures = status.consecutive_failures;
            l.at_ms = status.at_ms;
        }
        *last = Some(status);
    }
}
