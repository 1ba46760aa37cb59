//! `poolgate keys`: client keys managed at run time, in the usage ledger the
//! config names — created, listed, changed and revoked without a restart
//! (a running gateway reads them within `gateway::keys::REFRESH`). The same
//! as `/admin/keys`, for an operator at the machine.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::config::Config;
use crate::ledger::Store;
use crate::ledger::calendar::rfc3339;
use crate::ledger::keys::{self, KeyLimits, KeySpec};

/// `poolgate keys …`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Create a key and print it (once: only its hash is kept).
    ///
    /// Example:
    ///   poolgate keys create ci --team build --budget-usd-day 20 --max-in-flight 4 --config poolgate.toml
    #[command(verbatim_doc_comment)]
    Create(Change),
    /// List the keys (never a key: the first 8 hex digits of its hash).
    List(Target),
    /// Change a key's team, owner, expiry or limits (what is not given stays).
    Update(Change),
    /// Refuse a key from now on (its usage stays under its name).
    Revoke(Named),
}

/// Which config (and so which ledger).
#[derive(clap::Args)]
pub struct Target {
    /// The gateway's config file: its `[ledger] file` holds the keys.
    #[arg(long, short, env = "POOLGATE_CONFIG", default_value = "poolgate.toml")]
    config: PathBuf,
}

/// A key by name.
#[derive(clap::Args)]
pub struct Named {
    /// The key's name.
    name: String,
    #[command(flatten)]
    target: Target,
}

/// A key's name and what to set.
#[derive(clap::Args)]
pub struct Change {
    /// The key's name (1–64 of letters, digits, - _ . @).
    name: String,
    #[command(flatten)]
    target: Target,
    /// A team tag (reports group by it).
    #[arg(long)]
    team: Option<String>,
    /// Who holds it.
    #[arg(long)]
    owner: Option<String>,
    /// When it expires: YYYY-MM-DD, RFC 3339 or ms since the epoch.
    #[arg(long)]
    expires: Option<String>,
    /// The models it may use: names or prefix*, comma-separated.
    #[arg(long, value_delimiter = ',')]
    models: Option<Vec<String>>,
    /// Most requests in flight at once.
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Most requests started in any 60 s.
    #[arg(long)]
    requests_per_minute: Option<u32>,
    /// Most tokens answered in any 60 s.
    #[arg(long)]
    tokens_per_minute: Option<u64>,
    /// Tokens per UTC day.
    #[arg(long)]
    budget_tokens_day: Option<u64>,
    /// Tokens per ISO week.
    #[arg(long)]
    budget_tokens_week: Option<u64>,
    /// Tokens per calendar month.
    #[arg(long)]
    budget_tokens_month: Option<u64>,
    /// USD per UTC day.
    #[arg(long)]
    budget_usd_day: Option<f64>,
    /// USD per ISO week.
    #[arg(long)]
    budget_usd_week: Option<f64>,
    /// USD per calendar month.
    #[arg(long)]
    budget_usd_month: Option<f64>,
}

impl Change {
    fn spec(&self) -> KeySpec {
        KeySpec {
            name: Some(self.name.clone()),
            team: self.team.clone(),
            owner: self.owner.clone(),
            expires: self.expires.clone(),
            limits: KeyLimits {
                models: self.models.clone(),
                max_in_flight: self.max_in_flight,
                requests_per_minute: self.requests_per_minute,
                tokens_per_minute: self.tokens_per_minute,
                budget_tokens_day: self.budget_tokens_day,
                budget_tokens_week: self.budget_tokens_week,
                budget_tokens_month: self.budget_tokens_month,
                budget_usd_day: self.budget_usd_day,
                budget_usd_week: self.budget_usd_week,
                budget_usd_month: self.budget_usd_month,
            },
        }
    }
}

/// The config's ledger store and its keys' names (reserved for run-time keys).
fn open(config: &Path) -> Result<(Box<dyn Store>, Vec<String>)> {
    let (mut c, _) = Config::read(config)?;
    c.ledger.locate_file(config);
    let Some(store) = crate::ledger::open(c.ledger.url.as_deref(), c.ledger.file_path.as_deref(), c.ledger.setting())?
    else {
        bail!("{}: [ledger] file is \"\": run-time keys live in the usage ledger", config.display())
    };
    Ok((store, c.server.client_keys.iter().map(|k| k.name.clone()).collect()))
}

/// Runs `poolgate keys …`.
pub fn run(cmd: Command) -> Result<ExitCode> {
    let now = crate::clock::system_time().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    match cmd {
        Command::Create(change) => {
            let (mut store, reserved) = open(&change.target.config)?;
            let (record, secret) =
                keys::create(&change.spec(), &store.keys()?, &reserved, now).map_err(anyhow::Error::msg)?;
            store.put_key(&record)?;
            println!("created key `{}`; it is shown once, keep it now:\n{secret}", record.name);
        }
        Command::Update(change) => {
            let (mut store, _) = open(&change.target.config)?;
            let key = store.keys()?.into_iter().find(|k| k.name == change.name);
            let key = key.with_context(|| format!("no run-time key `{}`", change.name))?;
            store.put_key(&keys::change(&key, &change.spec()).map_err(anyhow::Error::msg)?)?;
            println!("key `{}` changed", change.name);
        }
        Command::Revoke(named) => {
            let (mut store, _) = open(&named.target.config)?;
            let key = store.keys()?.into_iter().find(|k| k.name == named.name);
            let key = key.with_context(|| format!("no run-time key `{}`", named.name))?;
            store.put_key(&crate::ledger::KeyRecord { revoked_ms: key.revoked_ms.or(Some(now)), ..key })?;
            println!("key `{}` revoked", named.name);
        }
        Command::List(target) => {
            let (mut store, _) = open(&target.config)?;
            println!("{:<24} {:<9} {:<12} {:<21} state", "name", "sha256", "team", "expires");
            for k in store.keys()? {
                let state = k.refused(now).unwrap_or_else(|| "active".into());
                let expires = k.expires_ms.map(rfc3339).unwrap_or_else(|| "-".into());
                let team = k.team.clone().unwrap_or_else(|| "-".into());
                println!(
                    "{:<24} {:<9} {:<12} {:<21} {state}",
                    k.name,
                    k.sha256.get(..8).unwrap_or_default(),
                    team,
                    expires
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
