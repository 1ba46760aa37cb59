//! `poolgate demo`: the gateway in front of a simulated Anthropic upstream, so
//! a newcomer sees routing decisions on a fresh machine — no credentials, no
//! network.
//!
//! It starts [`crate::sim::SimUpstream`] with [`Scenario::demo`] and the real
//! gateway over it, configured in code exactly as a user would configure it:
//! each simulated account's key in a private file (`token_file`; credentials are
//! never inline), a generated client key and admin token known to the gateway
//! only by their SHA-256. It prints where to point a client; with `--traffic` it
//! runs its own sessions through the gateway over HTTP and shows what the
//! gateway knows and decides, live.

mod table;
mod traffic;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::clock::now_ms;
use crate::config::{AccountConfig, ClientKey, Config, StageConfig};
use crate::gateway::http::{server, signals};
use crate::policy::PolicyEngine;
use crate::random::random_hex;
use crate::sim::{Scenario, SimUpstream};
use table::{Screen, View};
use traffic::{Counts, Traffic};

/// Arguments of `poolgate demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Where the gateway listens; port 0 picks a free port (the address is printed).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: String,
    /// Drive simulated sessions through the gateway and show a live table of
    /// accounts and decisions.
    #[arg(long)]
    pub traffic: bool,
    /// Concurrent sessions driven by --traffic.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub sessions: u32,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// The policy chain, comma-separated (default: builtin:skip-exhausted,builtin:headroom).
    #[arg(long, value_delimiter = ',', value_name = "PLUGINS")]
    pub chain: Vec<String>,
}

/// Each simulated account may have this many requests in flight: with the
/// demo's six sessions, the admission limit shows when one account leads.
const MAX_IN_FLIGHT: u32 = 4;
/// How often the view refreshes.
const TICK: Duration = Duration::from_millis(500);

/// Runs `poolgate demo` on its own runtime until Ctrl-C or `--duration`.
pub fn run(args: Args) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(demo(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn demo(args: Args) -> Result<()> {
    let start_ms = now_ms();
    let sim = SimUpstream::start(Scenario::demo()).await?;
    let client_key = format!("pg-demo-{}", random_hex(16)?);
    let admin_token = format!("pg-admin-{}", random_hex(16)?);
    let keys = KeyDir::create()?;
    let config = config(&args, &sim, &keys, &client_key, &admin_token)?;
    let running = start_gateway(config, &args.listen).await?;
    // The gateway read the API keys while loading; the OAuth seat's
    // credentials file stays, since the gateway rewrites it at each refresh
    // (the directory goes when the demo ends).

    let base = format!("http://{}", running.addr);
    let chain: Vec<String> =
        running.gateway.generation().chain.status(now_ms()).into_iter().map(|s| s.plugin).collect();
    let mut intro = intro(&base, &sim, &chain.join(" → "), &client_key, &admin_token);
    let ticket = running.gateway.sessions.ticket(now_ms())?;
    let _ = writeln!(
        intro,
        "Watch the pool live (the link signs in once, for {} minutes):\n  {base}/ui#ticket={ticket}\n",
        crate::gateway::sessions::TICKET_MS / 60_000
    );
    let tty = std::io::stdout().is_terminal();
    let mut stdout = std::io::stdout();

    let stop = until_stopped(args.duration);
    tokio::pin!(stop);
    let title = format!("poolgate demo · gateway {base}");
    let mut view = View::new(running.gateway.clone(), start_ms, title, families(&sim));
    let mut ticks = tokio::time::interval(TICK);
    write!(stdout, "{intro}")?;
    let counts = if args.traffic {
        let traffic = Traffic::start(&base, &client_key, args.sessions)?;
        writeln!(stdout, "Driving {} sessions through the gateway.\n", args.sessions)?;
        Some(drive(traffic, &mut view, &mut ticks, stop.as_mut(), tty, &mut stdout).await?)
    } else {
        writeln!(
            stdout,
            "Waiting for requests (Ctrl-C stops); each decision is printed as it is made. `--traffic` sends some."
        )?;
        watch(&mut view, &mut ticks, stop.as_mut(), &mut stdout).await?;
        None
    };
    // Ctrl-C again while open streams finish: stop at once.
    running.shutdown(signals::Stop::Close, signals::Signals::new()?).await?;
    let refreshes = sim.refreshes();
    sim.stop().await;
    write!(stdout, "{}", view.summary(counts.as_ref()))?;
    writeln!(
        stdout,
        "OAuth seat {SEAT}: its token lives {}s; the gateway refreshed it {refreshes} times, rotating its refresh \
         token each time",
        crate::sim::TOKEN_LIFETIME_S
    )?;
    stdout.flush()?;
    drop(keys);
    Ok(())
}

/// The gateway over the simulated upstream; a taken address says how to pick
/// another, since a second demo is the usual cause.
async fn start_gateway(config: Config, listen: &str) -> Result<server::Running> {
    let engine = PolicyEngine::new(config.cache_dir())?;
    server::Running::start(config, engine, None).await.map_err(|e| {
        let in_use = e
            .chain()
            .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse));
        if in_use {
            e.context(format!("{listen} is taken (another demo?); `--listen 127.0.0.1:0` picks a free port"))
        } else {
            e
        }
    })
}

/// Ends at Ctrl-C (or SIGTERM), or after `duration` seconds when given.
async fn until_stopped(duration: Option<u64>) {
    match duration {
        Some(secs) => {
            tokio::select! {
                () = signals::termination() => {}
                () = tokio::time::sleep(Duration::from_secs(secs)) => {}
            }
        }
        None => signals::termination().await,
    }
}

/// The quota family of each simulated weekly window, keyed as the view names
/// the window (`7d_<bucket>`).
fn families(sim: &SimUpstream) -> BTreeMap<String, String> {
    sim.scenario()
        .accounts
        .iter()
        .flat_map(|a| &a.buckets)
        .map(|b| (format!("7d_{}", b.name), b.family.clone()))
        .collect()
}

/// Runs `traffic` until `stop`, redrawing the view each tick (in place on a
/// terminal); the final counts, drawn once more after the sessions ended.
async fn drive(
    traffic: Traffic,
    view: &mut View,
    ticks: &mut tokio::time::Interval,
    mut stop: Pin<&mut impl Future<Output = ()>>,
    tty: bool,
    stdout: &mut std::io::Stdout,
) -> Result<Counts> {
    let mut screen = tty.then(Screen::default);
    loop {
        let text = match &mut screen {
            Some(screen) => screen.draw(&view.frame(Some(&traffic.counts()))),
            None => view.lines(),
        };
        write!(stdout, "{text}")?;
        stdout.flush()?;
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
    }
    let counts = traffic.stop().await;
    let text = match &mut screen {
        Some(screen) => screen.draw(&view.frame(Some(&counts))),
        None => view.lines(),
    };
    write!(stdout, "{text}")?;
    drop(screen);
    Ok(counts)
}

/// Prints each new decision as it is made, until `stop`.
async fn watch(
    view: &mut View,
    ticks: &mut tokio::time::Interval,
    mut stop: Pin<&mut impl Future<Output = ()>>,
    stdout: &mut std::io::Stdout,
) -> Result<()> {
    loop {
        write!(stdout, "{}", view.lines())?;
        stdout.flush()?;
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
    }
    Ok(())
}

/// The simulated account the demo logs in as an OAuth subscription seat.
const SEAT: &str = "delta";

/// The demo's configuration, built as a user would write it.
fn config(args: &Args, sim: &SimUpstream, keys: &KeyDir, client_key: &str, admin_token: &str) -> Result<Config> {
    let mut config = Config::default();
    config.server.listen = args.listen.clone();
    config.server.client_keys = vec![ClientKey {
        name: "demo".into(),
        sha256: Some(hex::encode(crate::config::digest(client_key))),
        key_env: None,
        ..Default::default()
    }];
    config.server.admin_token_sha256 = Some(hex::encode(crate::config::digest(admin_token)));
    // Nothing a demo serves is worth a long wait at exit.
    config.server.shutdown_grace_ms = 2_000;
    config.policy.chain = args
        .chain
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .map(|p| StageConfig {
            plugin: p.to_string(),
            name: None,
            scope: None,
            timeout_ms: None,
            memory_mb: None,
            freshness_ms: None,
            config: None,
        })
        .collect();
    // The seat refreshes at the simulator's token endpoint, well ahead of its
    // short (compressed-clock) expiry.
    config.oauth.token_url = format!("{}/v1/oauth/token", sim.url());
    config.oauth.refresh_before_ms = 3_000;
    config.oauth.check_interval_ms = 1_000;
    config.oauth.usage_poll_ms = 0;
    for account in sim.accounts() {
        let mut entry = AccountConfig {
            id: account.name.clone(),
            base_url: Some(sim.url()),
            max_in_flight: Some(MAX_IN_FLIGHT),
            enabled: true,
            ..AccountConfig::default()
        };
        if account.name == SEAT {
            let t = sim.seat(SEAT)?;
            let stored = crate::oauth::StoredCredential {
                access_token: t.access_token.expose().to_string(),
                refresh_token: t.refresh_token.expose().to_string(),
                expires_at_ms: t.expires_at_ms,
                scopes: vec!["user:inference".into()],
                identity: Default::default(),
                obtained_at_ms: now_ms(),
            };
            let path = keys.0.join(format!("{SEAT}.json"));
            stored.write(&path)?;
            entry.kind = crate::config::AccountKind::Oauth;
            entry.credentials = Some(path);
        } else {
            entry.token_file = Some(keys.write(&account.name, account.key.expose())?);
            // The simulator bills these keys like subscription seats (unified
            // 5h/7d windows), so they are not pay-as-you-go overflow beside
            // the OAuth seat.
            entry.overflow = Some(false);
        }
        config.accounts.push(entry);
    }
    Ok(config)
}

/// What the demo prints first: where the simulated accounts live and what is
/// special about them, and how to point a client at the gateway.
fn intro(base: &str, sim: &SimUpstream, chain: &str, client_key: &str, admin_token: &str) -> String {
    let t = sim.scenario().timescale;
    let mut out = String::from(
        "poolgate demo: the gateway in front of a simulated Anthropic upstream (no credentials, no network)\n\n",
    );
    let _ = writeln!(
        out,
        "Simulated upstream {} with {} accounts; a \"5h\" window lasts {}, a \"7d\" window {}:",
        sim.url(),
        sim.accounts().len(),
        span(t.five_hour),
        span(t.seven_day)
    );
    for a in sim.accounts() {
        let _ = writeln!(out, "  {:<9}{}", a.name, a.note);
    }
    let _ = writeln!(out, "Policy chain: {chain}\n\nPoint a client at the gateway:");
    let _ = writeln!(out, "  ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={client_key} claude");
    let _ = writeln!(
        out,
        "  curl {base}/v1/messages -H 'x-api-key: {client_key}' -H 'anthropic-version: 2023-06-01' \\\n    \
         -H 'content-type: application/json' \\\n    \
         -d '{{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":200,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'"
    );
    let _ = writeln!(out, "What the gateway knows and decided (admin token):");
    let _ = writeln!(out, "  curl -H 'authorization: Bearer {admin_token}' {base}/status");
    let _ = writeln!(out, "  curl -H 'authorization: Bearer {admin_token}' '{base}/admin/decisions?limit=5'\n");
    out
}

/// A window length, short: `60s`, `10m`, `5h`.
fn span(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 120 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A private temporary directory for the simulated accounts' keys, removed
/// when dropped.
struct KeyDir(PathBuf);

impl KeyDir {
    fn create() -> Result<KeyDir> {
        let path = std::env::temp_dir().join(format!("poolgate-demo-{}-{}", std::process::id(), random_hex(4)?));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(KeyDir(path))
    }

    /// Writes `secret` to `<name>.key`, readable by the owner only.
    fn write(&self, name: &str, secret: &str) -> Result<PathBuf> {
        let path = self.0.join(format!("{name}.key"));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path).with_context(|| format!("cannot create {}", path.display()))?;
        file.write_all(secret.as_bytes())?;
        Ok(path)
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
