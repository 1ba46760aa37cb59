//! Running the real `poolgate` binary against the mock upstream, for end-to-end
//! tests.

pub mod hostile_components;
pub mod otlp;
pub mod postgres;
pub mod redis;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

/// A running `poolgate serve`.
pub struct Gateway {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Everything the process wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
    /// Disconnects when the thread copying stderr into `log` has ended,
    /// which it does when the process has.
    reader: std::sync::mpsc::Receiver<String>,
    config: std::path::PathBuf,
    _dir: tempdir::Dir,
}

/// A throwaway directory.
pub mod tempdir {
    /// Removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("poolgate-{tag}-{}-{}", std::process::id(), rand_suffix()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
            ^ (poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64)
    }
}

impl Gateway {
    /// Starts the binary with `config` (TOML; `listen` is forced to an ephemeral
    /// loopback port) and `env`, and waits until it listens.
    pub fn start(config: &str, env: &[(&str, &str)]) -> Gateway {
        let dir = tempdir::Dir::new("gw");
        let path = dir.0.join("poolgate.toml");
        std::fs::write(&path, config).unwrap();
        Self::start_file(&path, env, dir)
    }

    /// Starts the binary on an existing config file.
    pub fn start_file(path: &std::path::Path, env: &[(&str, &str)], dir: tempdir::Dir) -> Gateway {
        Self::serve(Command::new(env!("CARGO_BIN_EXE_poolgate")), path, env, dir)
    }

    /// Starts the binary on an existing config file without `--listen`: it
    /// listens where the file says (a test that needs this picks a free port).
    pub fn start_file_as_written(path: &std::path::Path, env: &[(&str, &str)], dir: tempdir::Dir) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_poolgate"));
        cmd.arg("serve").arg("--config").arg(path);
        Self::spawn(cmd, env, dir, path)
    }

    /// As [`Gateway::start`], under an open-file limit of `nofile` (`ulimit
    /// -n` sets the soft and the hard limit, so the gateway cannot raise it).
    pub fn start_with_open_files(config: &str, env: &[(&str, &str)], nofile: u64) -> Gateway {
        let dir = tempdir::Dir::new("gw");
        let path = dir.0.join("poolgate.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = Command::new("sh");
        // `exec` keeps the pid: signals reach the gateway itself.
        cmd.arg("-c").arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\"")).arg(env!("CARGO_BIN_EXE_poolgate"));
        Self::serve(cmd, &path, env, dir)
    }

    /// `cmd` (the binary, or a wrapper that execs it) told to serve `path`
    /// on an ephemeral loopback port.
    fn serve(mut cmd: Command, path: &std::path::Path, env: &[(&str, &str)], dir: tempdir::Dir) -> Gateway {
        cmd.arg("serve").arg("--config").arg(path).arg("--listen").arg("127.0.0.1:0");
        Self::spawn(cmd, env, dir, path)
    }

    /// Starts the binary in a network namespace of its own, listening on
    /// [`NETNS_ADDR`] — an address that is not loopback, yet reaches nothing
    /// outside the namespace (`unshare -rn`: a user and network namespace, no
    /// privilege needed). Reach it with [`Gateway::curl`].
    pub fn start_in_netns(path: &std::path::Path, env: &[(&str, &str)], dir: tempdir::Dir) -> Gateway {
        let mut cmd = Command::new("unshare");
        cmd.args(["-rn", "sh", "-c"])
            .arg(format!("ip link set lo up && ip addr add {NETNS_ADDR}/32 dev lo && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_poolgate"))
            .arg("serve")
            .arg("--config")
            .arg(path)
            .arg("--listen")
            .arg(format!("{NETNS_ADDR}:0"));
        Self::spawn(cmd, env, dir, path)
    }

    /// Runs `curl` inside the gateway's network namespace (see
    /// [`Gateway::start_in_netns`]) with `args` and the URL `path` on it; the
    /// HTTP status and the body.
    pub fn curl(&self, args: &[&str], path: &str) -> (u16, String) {
        let pid = self.pid().to_string();
        let out = Command::new("nsenter")
            .args(["-t", &pid, "-U", "-n", "--preserve-credentials", "curl", "-s", "-m", "30", "-w", "\n%{http_code}"])
            .args(args)
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("nsenter curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        (status.trim().parse().unwrap_or(0), body.to_string())
    }

    /// The config file it was started on (a test rewrites it to reload).
    pub fn config_path(&self) -> &std::path::Path {
        &self.config
    }

    fn spawn(mut cmd: Command, env: &[(&str, &str)], dir: tempdir::Dir, path: &std::path::Path) -> Gateway {
        cmd.env("POOLGATE_LOG", "info,poolgate=debug").env_remove("POOLGATE_CONFIG").env_remove("POOLGATE_LISTEN");
        // The default state file goes in the state directory: the test's own,
        // not the user's (a test that restarts names its file in `[state]`).
        cmd.env("XDG_STATE_HOME", dir.0.join("xdg-state")).env_remove("STATE_DIRECTORY");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn poolgate");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("poolgate listening on ").nth(1) {
                        let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                    }
                    let mut l = log.lock();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                panic!("poolgate did not start:\n{}", log.lock());
            }
        };
        Gateway { child, url, log, reader: rx, config: path.to_path_buf(), _dir: dir }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.log.lock().clone()
    }

    /// Waits until the log holds `needle`; false if `timeout` passes first.
    /// A test that sends a second signal waits for the first to be seen, so
    /// the two are never coalesced into one.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        let start = poolgate::clock::machine_instant();
        while start.elapsed() < timeout {
            if self.log.lock().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// An HTTP client for the gateway.
    pub fn client() -> reqwest::Client {
        poolgate::https::install_crypto();
        reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
    }

    /// GETs the admin route `path` (with its query) as `token`; the JSON body.
    pub async fn admin_json(&self, path: &str, token: &str) -> serde_json::Value {
        admin_json(&self.url, path, token).await
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends the signal `name` (`TERM`, `INT`, `HUP`).
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status();
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = poolgate::clock::machine_instant();
        while start.elapsed() < timeout {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            #[allow(
                clippy::disallowed_methods,
                reason = "a bounded poll of a child process, on the test's own thread"
            )]
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    /// Stops the process, and fails the test if the gateway panicked while it
    /// ran: a panic is a bug whatever the test was about (the connection it
    /// happened on just closes, which a test may not otherwise notice).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Wait (briefly) for the last lines to be copied: a panic is often
        // the last thing the process wrote.
        let until = poolgate::clock::machine_instant() + Duration::from_secs(2);
        while let Some(left) = until.checked_duration_since(poolgate::clock::machine_instant()) {
            match self.reader.recv_timeout(left) {
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        let panics: Vec<String> = self
            .log
            .lock()
            .lines()
            .filter(|l| l.contains("poolgate::panic"))
            .map(|l| l.chars().take(600).collect())
            .collect();
        if panics.is_empty() {
            return;
        }
        let panics = format!("the gateway panicked:\n{}", panics.join("\n"));
        if std::thread::panicking() {
            eprintln!("{panics}");
        } else {
            panic!("{panics}");
        }
    }
}

/// The address [`Gateway::start_in_netns`] listens on: not loopback, and
/// private to the gateway's own network namespace.
pub const NETNS_ADDR: &str = "10.9.0.1";

/// POSTs the admin action `path` (e.g. `/admin/accounts/a/disable`) with
/// `body` as `token` (none: no credential); the status and the JSON answer.
pub async fn admin_post(base: &str, path: &str, token: Option<&str>, body: &str) -> (u16, serde_json::Value) {
    let mut req = Gateway::client().post(format!("{base}{path}")).body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// A config with one `[[accounts]]` per `(id, env var)` pointing at `base_url`,
/// plus `extra` TOML appended.
pub fn config(base_url: &str, accounts: &[(&str, &str)], extra: &str) -> String {
    let mut s = String::from("[server]\nadmin_token_env = \"PG_ADMIN\"\n\n");
    for (id, var) in accounts {
        s.push_str(&format!("[[accounts]]\nid = \"{id}\"\napi_key_env = \"{var}\"\nbase_url = \"{base_url}\"\n\n"));
    }
    s.push_str(extra);
    s
}

/// GETs the admin route `path` of the gateway at `base` as `token`; the JSON body.
pub async fn admin_json(base: &str, path: &str, token: &str) -> serde_json::Value {
    Gateway::client().get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap().json().await.unwrap()
}

/// A minimal Messages request body.
pub fn message(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{ "role": "user", "content": "hello" }],
    })
}

/// POSTs a minimal Messages request for `model` to the gateway at `base`.
pub async fn send_message(client: &reqwest::Client, base: &str, model: &str) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{base}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(&message(model, false))
        .send()
        .await
}

/// Polls `ready` every 10 ms until it holds; fails the test naming `what`
/// once `limit` has passed — instead of sleeping a fixed time and hoping.
pub async fn eventually(what: &str, limit: Duration, mut ready: impl AsyncFnMut() -> bool) {
    let started = poolgate::clock::machine_instant();
    while !ready().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Writes `tokens` (from the mock's OAuth authority) as a poolgate
/// credentials file, creating its directory.
pub fn write_credentials(path: &std::path::Path, tokens: &poolgate_mock_upstream::Tokens) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let c = serde_json::json!({
        "access_token": tokens.access_token,
        "refresh_token": tokens.refresh_token,
        "expires_at_ms": tokens.expires_at_ms,
        "scopes": tokens.scopes,
    });
    std::fs::write(path, c.to_string()).unwrap();
}

/// Sends Messages requests to `gw` one after another, `every` apart, until
/// `stop`; every status seen (0 for no answer).
pub fn drive(
    gw: &Gateway,
    stop: Arc<std::sync::atomic::AtomicBool>,
    every: Duration,
) -> tokio::task::JoinHandle<Vec<u16>> {
    let url = gw.url.clone();
    tokio::spawn(async move {
        let client = Gateway::client();
        let mut statuses = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let r = send_message(&client, &url, "claude-sonnet-4-5").await;
            statuses.push(r.map(|r| r.status().as_u16()).unwrap_or(0));
            tokio::time::sleep(every).await;
        }
        statuses
    })
}

/// One Claude Code turn of `session` for `model`: the session id travels in
/// `metadata.user_id` as Claude Code sends it.
pub async fn turn(gw: &Gateway, session: &str, model: &str) -> reqwest::Response {
    let user_id = serde_json::json!({ "device_id": "d", "account_uuid": "u", "session_id": session }).to_string();
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({
            "model": model,
            "max_tokens": 64,
            "metadata": { "user_id": user_id },
            "messages": [{ "role": "user", "content": "hello" }],
        }))
        .send()
        .await
        .unwrap()
}

/// The sum of `usage`.
pub fn sum_usage(usage: &[poolgate_wire::usage::Usage]) -> poolgate_wire::usage::Usage {
    usage.iter().fold(poolgate_wire::usage::Usage::default(), |a, u| poolgate_wire::usage::Usage {
        input_tokens: a.input_tokens + u.input_tokens,
        output_tokens: a.output_tokens + u.output_tokens,
        cache_read_input_tokens: a.cache_read_input_tokens + u.cache_read_input_tokens,
        cache_creation_input_tokens: a.cache_creation_input_tokens + u.cache_creation_input_tokens,
    })
}

/// The four token counts of a usage row or period (`/admin/usage`,
/// `/v1/usage`).
pub fn usage_of(v: &serde_json::Value) -> poolgate_wire::usage::Usage {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    poolgate_wire::usage::Usage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_read_input_tokens: n("cache_read_input_tokens"),
        cache_creation_input_tokens: n("cache_creation_input_tokens"),
    }
}

/// A Messages request for `model` as the client key `key`.
pub async fn messages(gw: &Gateway, key: &str, model: &str, stream: bool) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", key)
        .json(&message(model, stream))
        .send()
        .await
        .unwrap()
}

/// The tokens `key` spent today, as the gateway's meter for it says
/// (`/v1/usage`: what admission holds the key's budgets to).
pub async fn spent_tokens(gw: &Gateway, key: &str) -> u64 {
    let r = Gateway::client().get(format!("{}/v1/usage", gw.url)).header("x-api-key", key).send().await.unwrap();
    r.json::<serde_json::Value>().await.unwrap()["usage"][0]["tokens"].as_u64().unwrap()
}
