//! Refreshes shared by replicas (`crate::oauth::share`): the lock, and the
//! newest pair, in Redis.

use async_trait::async_trait;
use redis::AsyncCommands;

use super::Redis;
use crate::oauth::{CredentialShare, SharedLock, StoredCredential};

#[async_trait]
impl CredentialShare for Redis {
    async fn lock(&self, account: &str) -> SharedLock {
        let key = self.key(&format!("oauth:{account}:lock"));
        let token = format!(
            "{}:{}",
            self.replica,
            crate::random::random_hex(8).unwrap_or_else(|_| self.clock.now_ms().to_string())
        );
        let ms = self.cfg.refresh_lock_ms;
        let set: Option<Option<String>> = self
            .run("oauth", async |c| {
                redis::cmd("SET").arg(&key).arg(&token).arg("NX").arg("PX").arg(ms).query_async(c).await
            })
            .await;
        match set {
            Some(Some(_)) => SharedLock::Acquired(token),
            Some(None) => SharedLock::Held,
            None => SharedLock::Unavailable,
        }
    }

    async fn unlock(&self, account: &str, token: &str) {
        let key = self.key(&format!("oauth:{account}:lock"));
        self.run("oauth", async |c| self.scripts.unlock.key(&key).arg(token).invoke_async::<i64>(c).await).await;
    }

    async fn load(&self, account: &str) -> Option<StoredCredential> {
        if !self.cfg.share_credentials {
            return None;
        }
        let key = self.key(&format!("oauth:{account}:cred"));
        let text: Option<String> = self.run("oauth", async |c| c.get(&key).await).await.flatten();
        match serde_json::from_str(&text?) {
            Ok(c) => Some(c),
            Err(_) => {
                self.garbage("shared credentials that do not parse");
                None
            }
        }
    }

    async fn store(&self, account: &str, credential: &StoredCredential) -> bool {
        if !self.cfg.share_credentials {
            // Shared through a credentials file, if at all: nothing to wait for.
            return true;
        }
        let key = self.key(&format!("oauth:{account}:cred"));
        let Ok(text) = serde_json::to_string(credential) else { return false };
        // Kept a day past the access token's expiry: its refresh token is
        // what the next refresh needs.
        let ttl = credential.expires_at_ms.saturating_sub(self.clock.now_ms()).saturating_add(24 * 3600 * 1000);
        self.run("oauth", async |c| c.pset_ex::<_, _, ()>(&key, text, ttl).await).await.is_some()
    }

    fn lock_ms(&self) -> u64 {
        self.cfg.refresh_lock_ms
    }
}
