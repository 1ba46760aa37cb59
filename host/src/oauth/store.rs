//! The credentials file the gateway owns for one OAuth seat: access token,
//! refresh token, expiry, scopes and the identity they belong to.
//!
//! Refresh tokens are single-use and rotate, so this file is the seat's life:
//! it is written atomically (a temporary file in the same directory, synced,
//! then renamed over the old one), so a crash leaves either the old pair or the
//! new one, never half of each; it is `0600` in a `0700` directory; and its
//! contents are never logged ([`StoredCredential`]'s `Debug` hides them).

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
        let c: StoredCredential = serde_json::from_str(&text).map_err(|e| {
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
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "credentials".into());
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
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
