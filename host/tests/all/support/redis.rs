//! A real `redis-server` for the replica tests, on a free loopback port, with
//! no persistence (a restart comes back empty, the hardest case for a
//! replica's write-back), stopped when dropped. `./test.sh` installs it from
//! Debian's packages.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::tempdir;

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempdir::Dir,
    password: Option<String>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(None)
    }

    /// One that asks clients for `password` (`requirepass`).
    pub fn start_with(password: Option<&str>) -> RedisServer {
        let password = password.map(str::to_string);
        let mut r = RedisServer { child: None, port: free_port(), dir: tempdir::Dir::new("redis"), password };
        r.spawn();
        r
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "waits a few ms for the server's start-up, before or between the test's steps; the gateways are other processes"
    )]
    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .args(self.password.iter().flat_map(|p| ["--requirepass", p.as_str()]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: ./test.sh installs it (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = poolgate::clock::machine_instant() + Duration::from_secs(10);
        while self.cli(&["PING"]).trim() != "PONG" {
            assert!(poolgate::clock::machine_instant() < deadline, "redis-server did not start on port {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it at once (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `redis-cli` against it; what it printed.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(self.password.iter().flat_map(|p| ["--no-auth-warning", "-a", p.as_str()]))
            .args(args)
            .stderr(Stdio::null())
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
