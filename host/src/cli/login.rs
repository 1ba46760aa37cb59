//! `poolgate login` and `poolgate accounts import`: getting an OAuth seat's
//! first tokens into the credentials file the gateway owns.
//!
//! `login` runs the authorization-code flow with PKCE (RFC 7636) the way
//! Claude Code's manual login does: it prints the authorize URL, the operator
//! approves in a browser and pastes back the code shown (`code#state`), and
//! the code is exchanged at the token endpoint. `import` takes the tokens of
//! an existing Claude Code login (`~/.claude/.credentials.json`). Either way
//! the file is written `0600` in a `0700` directory, atomically, and a running
//! gateway adopts it at its next refresh check (or the seat's next 401) — a
//! pair whose access token has expired (Claude Code's file after a night) by
//! trading its refresh token, once, for a new pair.
//!
//! An imported login is taken over, not shared: refresh tokens are single-use,
//! so once poolgate refreshes the pair, the Claude Code it came from holds a
//! spent token and must log in again (and if Claude Code refreshes first,
//! poolgate's copy is the spent one). `import` says so.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::config::{AccountConfig, Config, OAuthConfig};
use crate::oauth::{StoredCredential, TokenClient};

/// Arguments of `poolgate login`.
#[derive(clap::Args)]
pub struct LoginArgs {
    /// The account (`id` in `[[accounts]]`, with `kind = "oauth"` and `credentials`).
    pub account: String,
    /// The config file (TOML).
    #[arg(long, short, env = "POOLGATE_CONFIG")]
    pub config: PathBuf,
    /// The code the authorize page showed (`code#state`); read from stdin if not given.
    #[arg(long)]
    pub code: Option<String>,
}

/// `poolgate accounts …`.
#[derive(clap::Subcommand)]
pub enum AccountsCommand {
    /// Store the tokens of an existing Claude Code login as an account's credentials.
    ///
    /// Example:
    ///   poolgate accounts import work --from ~/.claude/.credentials.json --config poolgate.toml
    #[command(verbatim_doc_comment)]
    Import(ImportArgs),
}

/// Arguments of `poolgate accounts import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// The account (`id` in `[[accounts]]`).
    pub account: String,
    /// Claude Code's credentials file.
    #[arg(long)]
    pub from: PathBuf,
    /// The config file (TOML).
    #[arg(long, short, env = "POOLGATE_CONFIG")]
    pub config: PathBuf,
}

/// The account's entry and the `[oauth]` settings, from the config file —
/// read without resolving it, since the credentials file may not exist yet.
fn seat_config(path: &Path, id: &str) -> Result<(AccountConfig, PathBuf, OAuthConfig)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut config: Config =
        toml::from_str(&text).with_context(|| format!("{} is not a valid config", path.display()))?;
    if let Some(dir) = path.parent() {
        config.resolve_paths(dir);
    }
    let ids: Vec<&str> = config.accounts.iter().map(|a| a.id.as_str()).collect();
    let Some(account) = config.accounts.iter().find(|a| a.id == id) else {
        bail!("no account `{id}` in {}; accounts: {}", path.display(), ids.join(", "));
    };
    let Some(file) = account.credentials.clone() else {
        bail!(
            "account `{id}` has no `credentials` file: add `kind = \"oauth\"` and `credentials = \"seats/{id}.json\"` \
             to its [[accounts]] entry"
        );
    };
    Ok((account.clone(), file, config.oauth.clone()))
}

/// `poolgate accounts import`.
pub fn import(args: ImportArgs) -> Result<ExitCode> {
    let (_, file, _) = seat_config(&args.config, &args.account)?;
    let text = std::fs::read_to_string(&args.from).with_context(|| format!("cannot read {}", args.from.display()))?;
    let credential = StoredCredential::from_claude_code(&text, crate::clock::now_ms())
        .with_context(|| args.from.display().to_string())?;
    credential.write(&file)?;
    println!("{}", stored(&args.account, &file, &credential));
    println!(
        "note: poolgate now owns this login. Refresh tokens are single-use: once poolgate refreshes it, the Claude \
         Code that wrote {} must log in again (give each a login of its own with `poolgate login {}`)",
        args.from.display(),
        args.account
    );
    Ok(ExitCode::SUCCESS)
}

/// Recovers, before `poolgate serve` reads them, the credentials files of
/// the seats in config file `path` that a gateway killed mid-write left only
/// in a temporary file (`crate::oauth::store::recover_leftovers`). What was
/// done, one line per file, for the log. A config that does not parse is
/// left to the load to report.
pub fn recover_seats(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let Ok(mut config) = toml::from_str::<Config>(&text) else { return Vec::new() };
    if let Some(dir) = path.parent() {
        config.resolve_paths(dir);
    }
    let now = crate::clock::system_time();
    let files: std::collections::BTreeSet<PathBuf> =
        config.accounts.iter().filter_map(|a| a.credentials.clone()).collect();
    files.iter().flat_map(|f| crate::oauth::store::recover_leftovers(f, now)).collect()
}

/// `poolgate login`.
pub fn login(args: LoginArgs) -> Result<ExitCode> {
    let (_, file, oauth) = seat_config(&args.config, &args.account)?;
    let verifier = base64url(&random_bytes(32)?);
    let challenge = base64url(&Sha256::digest(verifier.as_bytes()));
    let state = base64url(&random_bytes(16)?);
    let url = authorize_url(&oauth, &challenge, &state);
    println!("Open this URL in a browser, sign in to the subscription for account `{}` and approve:\n", args.account);
    println!("  {url}\n");
    println!("Then paste the code the page shows (code#state) and press Enter:");
    let pasted = match args.code {
        Some(c) => c,
        None => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).context("reading the code from stdin")?;
            line
        }
    };
    let (code, returned_state) = match pasted.trim().split_once('#') {
        Some((c, s)) => (c.to_string(), Some(s.to_string())),
        None => (pasted.trim().to_string(), None),
    };
    if code.is_empty() {
        bail!("no code was pasted");
    }
    if returned_state.as_deref().is_some_and(|s| s != state) {
        bail!("the code belongs to another login attempt (its state does not match); run `poolgate login` again");
    }
    let client = TokenClient::new(oauth)?;
    let now = crate::clock::now_ms();
    let grant =
        crate::policy::block_on(client.exchange(&code, &state, &verifier, now)).map_err(|e| anyhow::anyhow!("{e}"))?;
    grant.credential.write(&file)?;
    println!("{}", stored(&args.account, &file, &grant.credential));
    Ok(ExitCode::SUCCESS)
}

fn stored(account: &str, file: &Path, c: &StoredCredential) -> String {
    let now = crate::clock::now_ms();
    let (token, next) = if c.expires_at_ms > now {
        (
            format!("access token valid {} more min", (c.expires_at_ms - now) / 60_000),
            "the gateway refreshes it from now on; a running one picks the file up",
        )
    } else {
        (
            format!("access token expired {} min ago", (now - c.expires_at_ms) / 60_000),
            "the gateway trades its refresh token for a new pair at start; a running one",
        )
    };
    format!(
        "stored the credentials of account `{account}` in {} ({token}); {next} at its next check (`[oauth] \
         check_interval_ms`)",
        file.display()
    )
}

/// The URL the operator opens to approve access (Claude Code's manual flow:
/// `code=true` makes the page show the code to paste).
pub fn authorize_url(oauth: &OAuthConfig, challenge: &str, state: &str) -> String {
    use crate::oauth::token::encode;
    let params = [
        ("code", "true"),
        ("client_id", oauth.client_id.as_str()),
        ("response_type", "code"),
        ("redirect_uri", oauth.redirect_uri.as_str()),
        ("scope", oauth.scopes.as_str()),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
        ("state", state),
    ];
    let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
    format!("{}?{}", oauth.authorize_url, query.join("&"))
}

fn random_bytes(n: usize) -> Result<Vec<u8>> {
    hex::decode(crate::random::random_hex(n)?).context("random bytes")
}

/// Base64url without padding (RFC 4648 §5), as PKCE wants.
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_matches_rfc_4648_and_the_pkce_example() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        // RFC 7636 appendix B.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert_eq!(base64url(&Sha256::digest(verifier.as_bytes())), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    }

    #[test]
    fn the_authorize_url_carries_the_challenge() {
        let url = authorize_url(&OAuthConfig::default(), "abc", "st");
        assert!(url.starts_with("https://claude.ai/oauth/authorize?code=true&client_id=9d1c250a"), "{url}");
        assert!(url.contains("code_challenge=abc&code_challenge_method=S256&state=st"), "{url}");
        assert!(url.contains("scope=org%3Acreate_api_key%20user%3Aprofile%20user%3Ainference"), "{url}");
    }
}
