//! The command line: `serve`, `check`, `rank`, `plugin …`, `demo`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;
mod demo;
mod keys;
mod login;
mod plugin;
mod rank;
mod serve;
mod simulate;

/// poolgate — a gateway for LLM APIs that sends every request to the best account
/// of a pool, as decided by a chain of sandboxed WebAssembly policy plugins.
#[derive(Parser)]
#[command(
    name = "poolgate",
    version,
    about,
    after_help = "Examples:\n  \
    poolgate demo --traffic                       # try it: simulated upstream, live decisions\n  \
    poolgate check --config poolgate.toml         # validate a config (every problem, with its line)\n  \
    poolgate serve --config poolgate.toml         # run the gateway\n  \
    poolgate plugin new my-ranker --lang python   # start a plugin of your own\n\n\
Point a client at it: ANTHROPIC_BASE_URL=http://127.0.0.1:8787 ANTHROPIC_API_KEY=<client key>.\n\
Docs: docs/configuration.md, docs/strategies.md, docs/writing-plugins.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the configured chain on one JSON case and print the decision record.
    ///
    /// The case holds the accounts with their state, the request facts and the
    /// clock (`now_ms`); see docs/writing-plugins.md for the format. A fixture
    /// file (or directory) with several cases works too: pick one with `--case`
    /// (its number or name); a case's `expect` is checked and reported. The chain
    /// comes from `--config` (its `[[policy.chain]]`), or is the default chain.
    ///
    /// Examples:
    ///   poolgate rank --config poolgate.toml --input case.json
    ///   poolgate rank --config poolgate.toml --input my-ranker/fixtures --case 2
    #[command(verbatim_doc_comment)]
    Rank(rank::Args),
    /// Run the gateway: proxy the Anthropic API across the configured pool.
    ///
    /// Point clients at it with ANTHROPIC_BASE_URL=http://<listen>; every
    /// response carries x-poolgate-account and x-poolgate-reason. Stops on
    /// SIGINT/SIGTERM after in-flight requests finish (server.shutdown_grace_ms).
    ///
    /// Example:
    ///   poolgate serve --config poolgate.toml
    #[command(verbatim_doc_comment)]
    Serve(serve::Args),
    /// Validate a config file exactly as `serve` would, without starting.
    ///
    /// Reports every problem at once — unknown keys, wrong types, out-of-range
    /// values, duplicate account ids, unreadable credentials, unknown built-ins,
    /// missing or invalid .wasm files, plugins whose configure rejects their
    /// options — each with its key path and line. Exits non-zero on any problem.
    ///
    /// Example:
    ///   poolgate check --config poolgate.toml
    #[command(verbatim_doc_comment)]
    Check(check::Args),
    /// Replay a workload through several configurations' real gateways on
    /// virtual time, and compare what each would have done to the pool.
    ///
    /// Each config's chain (built-ins or .wasm plugins), cooldowns, affinity
    /// and fallbacks run as `serve` runs them; its accounts become simulated
    /// ones whose 5h/7d windows and per-model buckets fill and reset (plans
    /// from --pool). Prints a side-by-side table — requests served, answered
    /// 429, mid-session switches and A→B→A, cache-creation tokens, quota left
    /// unused at resets — and writes report.json and SVG plots to --out.
    /// The workload: generated (--generate team), a JSONL trace (--workload),
    /// or a day your gateway recorded (--from-decisions).
    /// The same workload, configs and seed give the same report.
    ///
    /// Examples:
    ///   poolgate simulate --generate team --people 10 --days 7 \
    ///     --config fill-first.toml --config headroom.toml --config mine.toml
    ///   poolgate simulate --workload day.jsonl --config poolgate.toml --pool pool.toml
    ///   poolgate simulate --from-decisions decisions.json --config poolgate.toml --config next.toml
    #[command(verbatim_doc_comment)]
    Simulate(simulate::Args),
    /// Try poolgate with no credentials and no network: the gateway in front of
    /// a simulated Anthropic upstream.
    ///
    /// The simulated upstream holds four accounts whose 5h and 7d windows fill
    /// as they serve and reset on a compressed clock (a "5h" window lasts 60 s):
    /// one starts cooling, one has its Fable bucket near its limit, and one is an
    /// OAuth subscription seat whose 6 s token the gateway keeps refreshing. The demo
    /// prints the ANTHROPIC_BASE_URL and key to point Claude Code or an SDK at;
    /// with --traffic it drives its own sessions and shows a live table of
    /// accounts, headroom, in-flight requests and the gateway's decisions.
    ///
    /// Example:
    ///   poolgate demo --traffic
    #[command(verbatim_doc_comment)]
    Demo(demo::Args),
    /// Tools for plugin authors: start, build, test and inspect a plugin.
    ///
    /// `plugin build` runs the plugin's build.sh, tests the component with its
    /// fixtures and only then places it (dist/ or --out) by an atomic rename.
    ///
    /// Example:
    ///   poolgate plugin new least-busy --lang python
    ///   poolgate plugin build least-busy --config poolgate.toml --out plugins/least-busy.wasm
    #[command(subcommand, verbatim_doc_comment)]
    Plugin(plugin::Command),
    /// Log an OAuth subscription seat in: approve in a browser, paste the code.
    ///
    /// The account needs `kind = "oauth"` and a `credentials` file in its
    /// [[accounts]] entry; the tokens go there (0600), and the gateway
    /// refreshes them from then on. Endpoints and client id: [oauth].
    ///
    /// Example:
    ///   poolgate login work --config poolgate.toml
    #[command(verbatim_doc_comment)]
    Login(login::LoginArgs),
    /// Manage account credentials (import an existing Claude Code login).
    #[command(subcommand)]
    Accounts(login::AccountsCommand),
    /// Manage client keys at run time: create, list, update, revoke.
    ///
    /// Keys live in the usage ledger the config names, hashed; a running
    /// gateway reads them within 2 s. Limits and budgets as in
    /// [[server.client_keys]] (docs/keys.md); the same over /admin/keys.
    ///
    /// Example:
    ///   poolgate keys create ci --team build --budget-usd-day 20 --config poolgate.toml
    #[command(subcommand, verbatim_doc_comment)]
    Keys(keys::Command),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    // The compiler child process (see `policy::compile`): not a user command.
    if std::env::args().nth(1).as_deref() == Some(crate::policy::compile::SUBCOMMAND) {
        return match crate::policy::engine::bare_engine() {
            Ok(engine) => crate::policy::compile::run_child(&engine),
            Err(e) => {
                eprintln!("cannot build the plugin engine: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Ok(exe) = std::env::current_exe() {
        crate::policy::compile::compile_in_subprocess(exe);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match &cli.command {
        // Known before the config is loaded, so that an error loading it is
        // written in the format the operator's log collector expects.
        Command::Serve(args) => crate::logs::set_format(serve::log_format(args)),
        // A replay answers thousands of 429s on purpose: only errors.
        Command::Simulate(_) => crate::logs::init(crate::config::LogFormat::Text, "error"),
        // No line per request: the demo's live table would scroll away.
        _ => init_tracing(crate::config::LogFormat::Text, false),
    }
    let serving = matches!(cli.command, Command::Serve(_));
    let result = match cli.command {
        Command::Rank(args) => rank::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Check(args) => check::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Plugin(cmd) => plugin::run(cmd),
        Command::Login(args) => login::login(args),
        Command::Accounts(login::AccountsCommand::Import(args)) => login::import(args),
        Command::Keys(cmd) => keys::run(cmd),
    };
    match result {
        Ok(code) => code,
        // `serve`'s last word is a log line like the others (one line, in
        // its format); the other commands talk to a person at a terminal.
        Err(e) if serving => {
            crate::logs::fatal(&e);
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A command line clap refused (or `--help`, `--version`). When JSON logs
/// were asked for — by `POOLGATE_LOG_FORMAT` or `--log-format json` — a
/// usage error is one JSON line too: a unit file's typo must not be the one
/// line a log collector cannot parse.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let code = ExitCode::from(e.exit_code().clamp(0, 255) as u8);
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) || !json_asked() {
        let _ = e.print();
        return code;
    }
    crate::logs::set_format(crate::config::LogFormat::Json);
    let message = e.render().to_string();
    crate::logs::line(tracing::Level::ERROR, "poolgate", message.trim_end(), &[]);
    code
}

/// Whether the environment or the raw arguments ask for JSON logs.
fn json_asked() -> bool {
    let args: Vec<String> = std::env::args().collect();
    std::env::var("POOLGATE_LOG_FORMAT").is_ok_and(|v| v == "json")
        || args.iter().any(|a| a == "--log-format=json")
        || args.windows(2).any(|w| w[0] == "--log-format" && w[1] == "json")
}

/// Logs go to stderr, filtered by `POOLGATE_LOG`, else `RUST_LOG` (e.g.
/// `info`, `poolgate::decision=debug`); `json` writes one object per line
/// (see [`crate::logs`]). `requests`: whether the default filter keeps the one
/// line per request.
pub(crate) fn init_tracing(format: crate::config::LogFormat, requests: bool) {
    // Text logs are for people: one line per request (`poolgate::request`),
    // poolgate's own events (reloads, cooldowns, plugin output) at info,
    // everything else only when something is wrong; the full decision record
    // of each request is at debug. JSON logs are for machines: the records too.
    let default = match (format, requests) {
        (crate::config::LogFormat::Json, _) => "info,poolgate::decision=debug",
        (crate::config::LogFormat::Text, true) => "warn,poolgate=info",
        (crate::config::LogFormat::Text, false) => "warn,poolgate=info,poolgate::request=warn",
    };
    crate::logs::init(format, default);
}

/// The config file and what the command line or the environment override in
/// it. `serve` and `check` take the same arguments, so `check` judges exactly
/// what `serve` would run — and every reload reads the file with them too.
#[derive(clap::Args)]
pub(crate) struct ConfigArgs {
    /// The config file (TOML).
    #[arg(long, short, env = "POOLGATE_CONFIG")]
    pub config: PathBuf,
    /// Listen address; overrides `server.listen` (at start and on every reload).
    #[arg(long, env = "POOLGATE_LISTEN")]
    pub listen: Option<String>,
    /// `text` or `json` log lines; overrides `server.log_format`.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

impl ConfigArgs {
    /// What these arguments override in the file.
    pub fn overrides(&self) -> crate::config::Overrides {
        crate::config::Overrides {
            listen: self.listen.clone(),
            log_format: self
                .log_format
                .as_deref()
                .map(|f| if f == "json" { crate::config::LogFormat::Json } else { crate::config::LogFormat::Text }),
        }
    }
}

/// A config path argument shared by several subcommands.
pub(crate) fn load_config(path: Option<&PathBuf>) -> anyhow::Result<crate::config::Config> {
    match path {
        Some(p) => crate::config::Config::read(p).map(|(c, _)| c),
        None => Ok(crate::config::Config::default()),
    }
}
