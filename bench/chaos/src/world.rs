//! Everything a chaos run points the gateway at — the mock upstream and its
//! accounts, forwarders, seats, the fallback backend, Redis — and the
//! configurations it reloads between.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use poolgate_mock_upstream::{Account, Config, Identity, MockUpstream, Quota, Seat};

use crate::Settings;
use crate::fallback::Fallback;
use crate::forward::Forwarder;
use crate::process::{Gateway, Redis};

/// The admin token of the run's gateways.
pub const ADMIN: &str = "chaos-admin";

/// The client keys requests are sent with (each a `[[server.client_keys]]`).
pub const CLIENT_KEYS: [&str; 3] = ["chaos-client-1", "chaos-client-2", "chaos-client-3"];

/// The model the hostile plugin misbehaves for: not the one a reload's
/// smoke test ranks, so a hostile swap is applied, then misbehaves under load.
pub const HOSTILE_MODEL: &str = "claude-haiku-4-5";

/// How long a seat's access token lives: short, so refreshes happen all
/// through the run and meet the token endpoint's outages.
const SEAT_LIFETIME: Duration = Duration::from_secs(6);

/// One upstream account of the pool.
pub struct Member {
    /// Its id in the config.
    pub id: String,
    /// The mock's account behind it.
    pub account: Account,
    /// Its forwarder, for the accounts reached through one.
    pub forwarder: Option<Forwarder>,
    /// Its seat and credentials file, for the OAuth seats.
    pub seat: Option<(Seat, PathBuf)>,
    /// The reserve: never faulted outside an exhaustion window, so some
    /// account can always serve there.
    pub reserve: bool,
}

/// A chain the injector reloads to.
#[derive(Clone, Debug)]
pub enum Chain {
    /// Built-in strategies, by name.
    Builtins(Vec<&'static str>),
    /// The hostile test plugin first (with this fault), then a built-in.
    Hostile(&'static str),
    /// A plugin file that is not a component: the reload must be refused.
    NotAPlugin,
    /// A config that does not parse: the reload must be refused.
    Unreadable,
}

impl Chain {
    /// Whether a reload to it must be refused (the hostile plugin passes the
    /// smoke test: it misbehaves only for [`HOSTILE_MODEL`]).
    pub fn invalid(&self) -> bool {
        matches!(self, Chain::NotAPlugin | Chain::Unreadable)
    }

    /// The stage names `/status` lists for a valid chain.
    pub fn names(&self) -> Vec<String> {
        match self {
            Chain::Builtins(names) => names.iter().map(|n| format!("builtin:{n}")).collect(),
            Chain::Hostile(_) => vec!["hostile".into(), "builtin:headroom".into()],
            Chain::NotAPlugin | Chain::Unreadable => Vec::new(),
        }
    }
}

/// The chain every replica starts with.
pub fn first_chain() -> Chain {
    Chain::Builtins(vec!["affinity", "headroom"])
}

/// The run's world.
pub struct World {
    /// The mock upstream.
    pub mock: MockUpstream,
    /// The pool.
    pub members: Vec<Member>,
    /// The fallback backend.
    pub fallback: Fallback,
    /// Redis, shared by the replicas (when there are two).
    pub redis: Option<Arc<Mutex<Redis>>>,
    /// The gateway replicas.
    pub gateways: Vec<Gateway>,
    /// The run's files.
    pub dir: PathBuf,
    hostile: Option<PathBuf>,
}

impl World {
    /// Starts the mock, the pool, the fallback, Redis and the replicas.
    pub async fn start(s: &Settings) -> Result<World> {
        let dir = s.dir.clone();
        std::fs::create_dir_all(dir.join("seats"))?;
        let mock = MockUpstream::start_with(Config { record: false, ..Config::default() }).await;
        let mut members = Vec::new();
        for (i, id) in ["k0", "k1", "k2", "k3", "f1", "f2"].iter().enumerate() {
            let account = mock.account(&format!("chaos-upstream-{id}"));
            account.set_quota(Quota::unified(0.2 + 0.05 * i as f64, 0.1));
            let forwarder = match id.starts_with('f') {
                true => Some(Forwarder::start(mock.addr()).await?),
                false => None,
            };
            members.push(Member { id: id.to_string(), account, forwarder, seat: None, reserve: i == 0 });
        }
        for id in ["s1", "s2"] {
            let account = mock.account(&format!("chaos-seat-{id}"));
            account.set_quota(Quota::unified(0.3, 0.2));
            let seat = mock.oauth().seat(&account, Identity::new(id));
            seat.set_lifetime(SEAT_LIFETIME);
            let path = dir.join("seats").join(format!("{id}.json"));
            write_credentials(&path, &seat)?;
            members.push(Member { id: id.into(), account, forwarder: None, seat: Some((seat, path)), reserve: false });
        }
        let fallback = Fallback::start().await?;
        let redis = match s.replicas > 1 {
            true => {
                Some(Arc::new(Mutex::new(Redis::start(&dir).context("the replicas share state through redis-server")?)))
            }
            false => None,
        };
        let garbage = dir.join("not-a-plugin.wasm");
        std::fs::write(&garbage, b"\0asm but not a component")?;
        let mut world =
            World { mock, members, fallback, redis, gateways: Vec::new(), dir, hostile: s.hostile_plugin.clone() };
        for r in 0..s.replicas {
            let path = world.dir.join(format!("poolgate-{r}.toml"));
            std::fs::write(&path, world.config(&first_chain()))?;
            let state = world.dir.join(format!("state-{r}"));
            world.gateways.push(Gateway::start(&s.gateway, &path, &env(&world.members), &state)?);
        }
        Ok(world)
    }

    /// The chains a reload may switch to (the hostile ones only when the
    /// hostile plugin's path was given).
    pub fn chains(&self) -> Vec<Chain> {
        let mut out = vec![
            Chain::Builtins(vec!["affinity", "headroom"]),
            Chain::Builtins(vec!["headroom-first"]),
            Chain::Builtins(vec!["fill-first"]),
            Chain::Builtins(vec!["skip-exhausted", "headroom"]),
            Chain::NotAPlugin,
            Chain::Unreadable,
        ];
        if self.hostile.is_some() {
            out.extend(["trap", "loop", "oom", "unknown", "duplicate", "empty", "error", "sleep"].map(Chain::Hostile));
        }
        out
    }

    /// The config of every replica with `chain`.
    pub fn config(&self, chain: &Chain) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "[server]\nadmin_token_env = \"CHAOS_ADMIN\"\nshutdown_grace_ms = 2000\ndrain_ms = 0\n");
        for (i, _) in CLIENT_KEYS.iter().enumerate() {
            let _ = writeln!(s, "[[server.client_keys]]\nname = \"team-{i}\"\nkey_env = \"CHAOS_CLIENT_{i}\"\n");
        }
        let _ = writeln!(s, "[gateway]\nresponse_timeout_ms = 15000\nconnect_timeout_ms = 2000\n");
        // Short cooldowns, so a faulted account is back within the run, as
        // an operator with a small pool might set them.
        let _ = writeln!(
            s,
            "[cooldowns]\ntransient_ms = 2000\nunified_ms = 3000\noverloaded_ms = 500\noverloaded_max_ms = 4000\n\
             upstream_error_ms = 500\nupstream_error_max_ms = 4000\nauth_ms = 2000\nauth_max_ms = 8000\n"
        );
        let base = self.mock.base_url();
        let _ = writeln!(s, "[oauth]\ntoken_url = \"{base}/v1/oauth/token\"\nusage_poll_ms = 0\n");
        if let Some(redis) = &self.redis {
            let url = redis.lock().url();
            let _ = writeln!(s, "[state]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"chaos:\"\n");
        }
        let _ = writeln!(
            s,
            "[[fallback]]\nname = \"backup\"\nbase_url = \"{}\"\nmodel = \"backup-model\"\ncooldown_ms = 1000\n",
            self.fallback.url
        );
        s.push_str(&self.chain(chain));
        for m in &self.members {
            let _ = writeln!(s, "[[accounts]]\nid = \"{}\"", m.id);
            match (&m.seat, &m.forwarder) {
                (Some((_, path)), _) => {
                    let _ =
                        writeln!(s, "kind = \"oauth\"\ncredentials = \"{}\"\nbase_url = \"{base}\"", path.display());
                }
                (None, Some(f)) => {
                    let _ = writeln!(s, "api_key_env = \"CHAOS_{}\"\nbase_url = \"{}\"", m.id.to_uppercase(), f.url());
                }
                (None, None) => {
                    let _ = writeln!(s, "api_key_env = \"CHAOS_{}\"\nbase_url = \"{base}\"", m.id.to_uppercase());
                }
            }
            s.push('\n');
        }
        s
    }

    fn chain(&self, chain: &Chain) -> String {
        let stage = |plugin: &str| format!("[[policy.chain]]\nplugin = \"{plugin}\"\n\n");
        match chain {
            Chain::Builtins(names) => names.iter().map(|n| stage(&format!("builtin:{n}"))).collect(),
            Chain::Hostile(fault) => {
                let path = self.hostile.as_deref().unwrap_or(Path::new("missing.wasm"));
                format!(
                    "[[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\ntimeout_ms = 50\n\
                     config = {{ fault = \"{fault}\", on_model = \"{HOSTILE_MODEL}\", ms = 400, bytes = 1048576 }}\n\n{}",
                    path.display(),
                    stage("builtin:headroom")
                )
            }
            Chain::NotAPlugin => stage(&self.dir.join("not-a-plugin.wasm").display().to_string()),
            Chain::Unreadable => "[[policy.chain]\nplugin = \"builtin:headroom\"\n\n".into(),
        }
    }

    /// Writes `chain` into replica `r`'s config and signals it to reload.
    pub fn reload(&self, r: usize, chain: &Chain) -> Result<()> {
        let g = &self.gateways[r];
        std::fs::write(&g.config, self.config(chain))?;
        g.reload();
        Ok(())
    }
}

/// The environment of every replica: account keys, client keys, the admin
/// token.
fn env(members: &[Member]) -> Vec<(String, String)> {
    let mut env = vec![("CHAOS_ADMIN".to_string(), ADMIN.to_string())];
    for m in members.iter().filter(|m| m.seat.is_none()) {
        env.push((format!("CHAOS_{}", m.id.to_uppercase()), m.account.credential().to_string()));
    }
    for (i, k) in CLIENT_KEYS.iter().enumerate() {
        env.push((format!("CHAOS_CLIENT_{i}"), k.to_string()));
    }
    env
}

/// A login of `seat` written where the gateway reads its credentials.
pub fn write_credentials(path: &Path, seat: &Seat) -> Result<()> {
    let t = seat.issue();
    let c = serde_json::json!({
        "access_token": t.access_token,
        "refresh_token": t.refresh_token,
        "expires_at_ms": t.expires_at_ms,
        "scopes": t.scopes,
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, c.to_string())?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
