//! The credentials file the gateway owns for one OAuth seat: access token,
//! refresh token, expiry, scopes and the identity they belong to.
//!
//! Refresh tokens are single-use and rotate, so this file is the seat's life:
//! it is written atomically (a temporary file `.<name>.<pid>.tmp` in the same
//! directory, synced, then renamed over the old one), so a crash leaves either
//! the old pair or the new one, never half of each; it is `0600` in a `0700`
//! directory; and its contents are never logged ([`StoredCredential`]'s
//! `Debug` hides them).
//!
//! A crash *between* the write and the rename leaves the new pair only in the
//! temporary file — and the old file's refresh token is already spent
//! upstream. So the gateway, at start, before it reads any credentials file,
//! recovers such a leftover ([`recover_leftovers`]; the rule is
//! [`judge`]'s): a temporary file that parses whole and holds a pair newer
//! than the file's is renamed over it (atomically, like a write).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Who a credential belongs to, as the token endpoint said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The organization's uuid (also `anthropic-organization-id` on answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organization: Option<String>,
    /// The account's uuid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The account's email.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

/// One seat's tokens, as stored.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredCredential {
    /// The bearer token requests carry.
    pub access_token: String,
    /// The single-use token that gets the next pair.
    pub refresh_token: String,
    /// When the access token expires, ms since the epoch.
    pub expires_at_ms: u64,
    /// The scopes granted.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Who the tokens belong to, when known.
    #[serde(default)]
    pub identity: Identity,
    /// When this pair was obtained, ms since the epoch.
    #[serde(default)]
    pub obtained_at_ms: u64,
}

impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredential")
            .field("access_token", &"***")
            .field("refresh_token", &"***")
            .field("expires_at_ms", &self.expires_at_ms)
            .field("identity", &self.identity)
            .finish()
    }
}

impl StoredCredential {
    /// Reads the credentials file at `path`.
    pub fn read(path: &Path) -> Result<StoredCredential> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read credentials {}", path.display()))?;
        Self::parse(&text, path)
    }

    /// The credentials in `text`, the contents of the file at `path` (named
    /// in errors). Apart from [`StoredCredential::read`] so that what a file
    /// holds can be judged without a file (the fuzzing entry points do).
    pub fn parse(text: &str, path: &Path) -> Result<StoredCredential> {
        let c: StoredCredential = serde_json::from_str(text).map_err(|e| {
            anyhow::anyhow!("credentials {} are not a poolgate credentials file (line {})", path.display(), e.line())
        })?;
        if c.access_token.trim().is_empty() || c.refresh_token.trim().is_empty() {
            bail!("credentials {} hold an empty token; run `poolgate login`", path.display());
        }
        Ok(c)
    }

    /// Writes it to `path` atomically, `0600` in a `0700` directory (created
    /// if missing).
    pub fn write(&self, path: &Path) -> Result<()> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        create_private_dir(dir)?;
        let tmp = dir.join(temp_name(&file_name(path), std::process::id()));
        let text = serde_json::to_vec_pretty(self).context("encoding credentials")?;
        {
            let mut f = open_private(&tmp)?;
            f.write_all(&text).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
        // The rename is durable once the directory is.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Claude Code's own credentials file (`~/.claude/.credentials.json`:
    /// `{"claudeAiOauth": {"accessToken", "refreshToken", "expiresAt" (ms),
    /// "scopes"}}`), as a stored credential.
    pub fn from_claude_code(text: &str, now_ms: u64) -> Result<StoredCredential> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Oauth {
            access_token: String,
            refresh_token: String,
            expires_at: u64,
            #[serde(default)]
            scopes: Vec<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct File {
            claude_ai_oauth: Oauth,
        }
        let f: File = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("not a Claude Code credentials file (no claudeAiOauth tokens): {e}"))?;
        let o = f.claude_ai_oauth;
        if o.access_token.is_empty() || o.refresh_token.is_empty() {
            bail!("the Claude Code credentials hold an empty token");
        }
        Ok(StoredCredential {
            access_token: o.access_token,
            refresh_token: o.refresh_token,
            expires_at_ms: o.expires_at,
            scopes: o.scopes,
            identity: Identity::default(),
            obtained_at_ms: now_ms,
        })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "credentials".into())
}

/// The temporary file process `pid` writes credentials file `name` through.
fn temp_name(name: &str, pid: u32) -> String {
    format!(".{name}.{pid}.tmp")
}

/// The pid in `file`, if it is a temporary file of credentials file `name`.
fn temp_pid(file: &str, name: &str) -> Option<u32> {
    let pid = file.strip_prefix('.')?.strip_prefix(name)?.strip_prefix('.')?.strip_suffix(".tmp")?;
    pid.bytes().all(|b| b.is_ascii_digit()).then(|| pid.parse().ok()).flatten()
}

/// A temporary file younger than this whose writer still runs may be a write
/// in progress (another replica sharing the file, or `poolgate accounts
/// import` running now): left alone. A write and its rename take
/// milliseconds; an older file is a leftover whose pid was reused.
pub const WRITE_IN_PROGRESS_MS: u64 = 30_000;

/// One leftover temporary file, as [`judge`] sees it.
#[derive(Debug, Clone)]
pub struct Leftover {
    /// What it holds, if it parses whole as a credentials file.
    pub credential: Option<StoredCredential>,
    /// When it was last written.
    pub modified: Option<std::time::SystemTime>,
    /// Its writer still runs, and is not this process.
    pub writer_runs: bool,
    /// How old it is, ms.
    pub age_ms: u64,
}

/// What to do with a leftover temporary file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Rename it over the credentials file: it holds the newest pair.
    Recover,
    /// Remove it, for the reason given: it holds nothing the file lacks.
    Discard(&'static str),
    /// Leave it: its writer may be about to rename it.
    Keep,
}

/// The recovery rule. A leftover is recovered when its writer is gone (or
/// is this process, which has written nothing yet, or it is older than
/// [`WRITE_IN_PROGRESS_MS`]), it parses whole, and its pair is newer than the
/// file's: the file is missing or unreadable, or the leftover's pair was
/// obtained later (`obtained_at_ms`), or — equal there, as for files written
/// by hand — it was written later. Anything else the file already
/// supersedes, except a write that may still be in progress.
pub fn judge(
    leftover: &Leftover,
    file: Option<&StoredCredential>,
    file_modified: Option<std::time::SystemTime>,
) -> Verdict {
    if leftover.writer_runs && leftover.age_ms < WRITE_IN_PROGRESS_MS {
        return Verdict::Keep;
    }
    let Some(pair) = &leftover.credential else {
        return Verdict::Discard("incomplete: the write was cut short");
    };
    let Some(file) = file else { return Verdict::Recover };
    if pair.refresh_token == file.refresh_token {
        return Verdict::Discard("the file holds the same pair");
    }
    let newer = match pair.obtained_at_ms.cmp(&file.obtained_at_ms) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => leftover.modified.zip(file_modified).is_some_and(|(l, f)| l > f),
    };
    if newer { Verdict::Recover } else { Verdict::Discard("the file holds a newer pair") }
}

/// Recovers the pair a process killed between writing credentials file
/// `path`'s temporary file and renaming it left behind (see [`judge`]), and
/// removes leftovers that hold nothing the file lacks. Runs at start, before
/// this process writes any credentials. Says what it did, one line per file
/// (names and times, never tokens).
pub fn recover_leftovers(path: &Path, now: std::time::SystemTime) -> Vec<String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = file_name(path);
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let own = std::process::id();
    let mut leftovers: Vec<(std::path::PathBuf, Leftover)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid = temp_pid(&e.file_name().to_string_lossy(), &name)?;
            let modified = e.metadata().and_then(|m| m.modified()).ok();
            let age_ms = modified.and_then(|m| now.duration_since(m).ok()).map_or(0, |d| d.as_millis() as u64);
            let leftover = Leftover {
                credential: StoredCredential::read(&e.path()).ok(),
                modified,
                writer_runs: pid != own && process_runs(pid),
                age_ms,
            };
            Some((e.path(), leftover))
        })
        .collect();
    // Newest first: once it is recovered, the others are older than the file.
    leftovers.sort_by_key(|(_, l)| std::cmp::Reverse((l.credential.as_ref().map(|c| c.obtained_at_ms), l.modified)));
    let mut said = Vec::new();
    for (temp, leftover) in leftovers {
        let file = StoredCredential::read(path).ok();
        let file_modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let shown = temp.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match judge(&leftover, file.as_ref(), file_modified) {
            Verdict::Keep => {}
            Verdict::Recover => match std::fs::rename(&temp, path) {
                Ok(()) => {
                    if let Ok(d) = std::fs::File::open(dir) {
                        let _ = d.sync_all();
                    }
                    said.push(format!(
                        "recovered {} from {shown}: the rotated OAuth pair a stopped process wrote but never renamed \
                         into place",
                        path.display()
                    ));
                }
                Err(e) => said.push(format!("could not recover {} from {shown}: {e}", path.display())),
            },
            Verdict::Discard(why) => match std::fs::remove_file(&temp) {
                Ok(()) => said.push(format!("removed {shown} beside {}: {why}", path.display())),
                Err(e) => said.push(format!("could not remove {shown} beside {}: {e}", path.display())),
            },
        }
    }
    said
}

/// Whether process `pid` runs (it may belong to another user).
#[cfg(unix)]
fn process_runs(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only asks whether `pid` exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether process `pid` runs: unknown here, so every writer is assumed to
/// (a leftover is recovered once it is older than [`WRITE_IN_PROGRESS_MS`]).
#[cfg(not(unix))]
fn process_runs(_pid: u32) -> bool {
    true
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let mode = std::fs::metadata(dir).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

#[cfg(unix)]
fn open_private(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

#[cfg(not(unix))]
fn open_private(path: &Path) -> Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredCredential {
        StoredCredential {
            access_token: "sk-ant-oat-secret".into(),
            refresh_token: "sk-ant-ort-secret".into(),
            expires_at_ms: 1_800_000_000_000,
            scopes: vec!["user:inference".into()],
            identity: Identity { organization: Some("org-1".into()), ..Default::default() },
            obtained_at_ms: 1,
        }
    }

    #[test]
    fn a_written_credential_reads_back_private_and_never_prints() {
        let dir = std::env::temp_dir().join(format!("pg-store-{}", std::process::id()));
        let path = dir.join("seats").join("a.json");
        sample().write(&path).unwrap();
        assert_eq!(StoredCredential::read(&path).unwrap(), sample());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), 0o600);
            assert_eq!(mode(path.parent().unwrap()), 0o700);
        }
        let shown = format!("{:?}", sample());
        assert!(!shown.contains("secret"), "{shown}");
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_the_stores_own_temporary_names_are_leftovers() {
        assert_eq!(temp_pid(&temp_name("a.json", 4242), "a.json"), Some(4242));
        for other in
            [".a.json.x.tmp", ".a.json..tmp", ".ab.json.1.tmp", "a.json.1.tmp", ".a.json.1.tmp~", ".a.json.-1.tmp"]
        {
            assert_eq!(temp_pid(other, "a.json"), None, "{other}");
        }
    }

    #[test]
    fn a_leftover_is_recovered_only_when_whole_newer_and_not_being_written() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |ms: u64| Some(UNIX_EPOCH + Duration::from_millis(ms));
        let file = StoredCredential { obtained_at_ms: 100, ..sample() };
        let newer = StoredCredential { refresh_token: "rotated".into(), obtained_at_ms: 200, ..sample() };
        let dead = |c: Option<&StoredCredential>| Leftover {
            credential: c.cloned(),
            modified: at(5_000),
            writer_runs: false,
            age_ms: 60_000,
        };
        assert_eq!(judge(&dead(Some(&newer)), Some(&file), at(1_000)), Verdict::Recover);
        assert_eq!(judge(&dead(Some(&newer)), None, None), Verdict::Recover, "the file is missing or unreadable");
        assert!(matches!(judge(&dead(None), Some(&file), at(1_000)), Verdict::Discard(_)), "cut short");
        let older = StoredCredential { refresh_token: "older".into(), obtained_at_ms: 50, ..sample() };
        assert!(matches!(judge(&dead(Some(&older)), Some(&file), at(1_000)), Verdict::Discard(_)));
        assert!(matches!(judge(&dead(Some(&file)), Some(&file), at(1_000)), Verdict::Discard(_)), "same pair");
        // Hand-written files (no `obtained_at_ms`): the later write wins.
        let (a, b) = (
            StoredCredential { obtained_at_ms: 0, ..sample() },
            StoredCredential { refresh_token: "b".into(), obtained_at_ms: 0, ..sample() },
        );
        assert_eq!(judge(&dead(Some(&b)), Some(&a), at(1_000)), Verdict::Recover);
        assert!(matches!(judge(&dead(Some(&b)), Some(&a), at(9_000)), Verdict::Discard(_)));
        // A writer that runs may be about to rename it — until it is too old
        // to be a write in progress (its pid was reused).
        let running = Leftover { writer_runs: true, age_ms: 10, ..dead(Some(&newer)) };
        assert_eq!(judge(&running, Some(&file), at(1_000)), Verdict::Keep);
        assert_eq!(judge(&running, None, None), Verdict::Keep);
        let stale = Leftover { age_ms: WRITE_IN_PROGRESS_MS, ..running };
        assert_eq!(judge(&stale, Some(&file), at(1_000)), Verdict::Recover);
    }

    #[test]
    fn leftovers_are_recovered_newest_first_and_the_rest_removed() {
        let dir = std::env::temp_dir().join(format!("pg-leftover-{}", std::process::id()));
        let path = dir.join("seats").join("a.json");
        StoredCredential { obtained_at_ms: 100, ..sample() }.write(&path).unwrap();
        let seats = path.parent().unwrap();
        let put = |pid: u32, c: &StoredCredential| {
            std::fs::write(seats.join(temp_name("a.json", pid)), serde_json::to_vec(c).unwrap()).unwrap();
        };
        let newest = StoredCredential { refresh_token: "newest".into(), obtained_at_ms: 300, ..sample() };
        // This process's own pid: a leftover of an earlier process that had it.
        put(std::process::id(), &newest);
        put(999_999_991, &StoredCredential { refresh_token: "between".into(), obtained_at_ms: 200, ..sample() });
        std::fs::write(seats.join(temp_name("a.json", 999_999_992)), b"{\"access_token\": \"sk-ant-o").unwrap();
        let said = recover_leftovers(&path, crate::clock::system_time());
        assert_eq!(StoredCredential::read(&path).unwrap(), newest);
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(said.iter().all(|l| !l.contains("secret") && !l.contains("newest")), "{said:?}");
        let left: Vec<_> = std::fs::read_dir(seats).unwrap().collect();
        assert_eq!(left.len(), 1, "only the credentials file remains");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn claude_codes_file_imports() {
        let text = r#"{"claudeAiOauth":{"accessToken":"at","refreshToken":"rt","expiresAt":1800000000000,"scopes":["user:inference"],"subscriptionType":"max"}}"#;
        let c = StoredCredential::from_claude_code(text, 5).unwrap();
        assert_eq!(
            (c.access_token.as_str(), c.refresh_token.as_str(), c.expires_at_ms),
            ("at", "rt", 1_800_000_000_000)
        );
        assert!(StoredCredential::from_claude_code("{}", 5).is_err());
    }
}
