//! The processes a chaos run starts and watches: `poolgate serve` replicas and
//! a `redis-server`, each on a free loopback port, each killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parking_lot::Mutex;

/// A free port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// What a gateway's stderr said that the run reports: panics, and the last
/// lines (for a failure's message).
#[derive(Default)]
struct Log {
    tail: Vec<String>,
}

/// One `poolgate serve` process.
pub struct Gateway {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The config file it serves (rewritten for a reload).
    pub config: PathBuf,
    log: Arc<Mutex<Log>>,
    panics: Arc<AtomicU64>,
}

impl Gateway {
    /// Starts `binary serve --config <config>` on a free port with `env`, and
    /// waits (up to a minute) for it to say where it listens.
    pub fn start(binary: &Path, config: &Path, env: &[(String, String)], state_dir: &Path) -> Result<Gateway> {
        let mut cmd = Command::new(binary);
        cmd.arg("serve").arg("--config").arg(config).arg("--listen").arg("127.0.0.1:0");
        cmd.env("POOLGATE_LOG", "warn").env("XDG_STATE_HOME", state_dir).env_remove("POOLGATE_CONFIG");
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let log = Arc::new(Mutex::new(Log::default()));
        let panics = Arc::new(AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let (l, p) = (log.clone(), panics.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("poolgate listening on ").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                // The host's own panics, as Rust prints them (a plugin's
                // panic reaches the log inside a warning, as its cause).
                if line.starts_with("thread '") && line.contains("panicked") {
                    p.fetch_add(1, Ordering::Relaxed);
                }
                let mut l = l.lock();
                if l.tail.len() >= 200 {
                    l.tail.remove(0);
                }
                l.tail.push(line);
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                bail!("poolgate did not start:\n{}", log.lock().tail.join("\n"));
            }
        };
        Ok(Gateway { child, url, config: config.to_path_buf(), log, panics })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks it to reload its config (SIGHUP, as an operator does).
    pub fn reload(&self) {
        // SAFETY: kill(2) with a pid we own and a valid signal number.
        unsafe { libc::kill(self.pid() as i32, libc::SIGHUP) };
    }

    /// Whether it is still running (not gone, not a zombie).
    pub fn alive(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let state = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next());
        matches!(state, Some(s) if s != "Z" && s != "X")
    }

    /// Panics its stderr reported.
    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// The last lines of its log.
    pub fn tail(&self, n: usize) -> String {
        let l = self.log.lock();
        l.tail[l.tail.len().saturating_sub(n)..].join("\n")
    }

    /// Resident memory now and at its peak (`VmRSS`, `VmHWM`), KiB.
    pub fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Open file descriptors now.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map(|d| d.count()).unwrap_or(0)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `redis-server` without persistence (a restart comes back empty: the
/// hardest case for replicas writing their state back).
pub struct Redis {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts one on a free port, its files under `dir`.
    pub fn start(dir: &Path) -> Result<Redis> {
        let mut r = Redis { child: None, port: free_port(), dir: dir.to_path_buf() };
        r.spawn()?;
        Ok(r)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> Result<()> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("redis-server is not installed (./test.sh installs Debian's redis-server)")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!("redis-server did not start on port {}", self.port);
            }
            #[allow(
                clippy::disallowed_methods,
                reason = "a start-up wait on the injector's own thread, before the run"
            )]
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills it at once (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// Whether it is running.
    pub fn up(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
