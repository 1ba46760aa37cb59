//! A real PostgreSQL server for the shared-ledger tests, on a free loopback
//! port, in a data directory of its own that goes with it (stopped and
//! removed on drop). `./test.sh` installs it from Debian's packages.
//!
//! `initdb` and `postgres` refuse to run as root, and tests run as root in
//! containers (and maybe CI): then they run as the `postgres` system user
//! (else `nobody`) through `runuser`, on directories given to that user.
//! Trust authentication on 127.0.0.1 (a password in the URL is accepted and
//! ignored, which lets a test check it is never shown); `fsync` off, as
//! nothing here must survive a power loss.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::tempdir;

/// A running (or stopped, between [`PostgresServer::stop`] and
/// [`PostgresServer::start`]) PostgreSQL server.
pub struct PostgresServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    bin: PathBuf,
    /// The user it runs as when the tests run as root.
    user: Option<String>,
    dir: tempdir::Dir,
    running: bool,
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`: on `PATH`, else
/// Debian's `/usr/lib/postgresql/<version>/bin` (the newest).
fn bin_dir() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.join("initdb").is_file());
    let debian = || {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|d| d.join("initdb").is_file())
            .collect();
        dirs.sort_by_key(|d| d.parent().and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok()));
        dirs.pop()
    };
    // The real directory, not a link's: `pg_ctl` finds `postgres` beside itself.
    let initdb = on_path.or_else(debian).map(|d| d.join("initdb")).expect(
        "PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql/*/bin): \
         ./test.sh installs it (apt-get install postgresql)",
    );
    std::fs::canonicalize(&initdb).unwrap().parent().unwrap().to_path_buf()
}

/// Whom to run the server as: nobody special unless we are root.
fn run_as() -> Option<String> {
    let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    if !root {
        return None;
    }
    let exists =
        |u: &str| Command::new("id").arg("-u").arg(u).stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    Some(if exists("postgres") { "postgres" } else { "nobody" }.to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PostgresServer {
    /// A fresh cluster on a free port, started and accepting connections.
    pub fn start() -> PostgresServer {
        let dir = tempdir::Dir::new("postgres");
        let mut pg = PostgresServer { port: free_port(), bin: bin_dir(), user: run_as(), dir, running: false };
        std::fs::create_dir_all(pg.socket_dir()).unwrap();
        if let Some(user) = &pg.user {
            let owned = Command::new("chown").arg("-R").arg(user).arg(&pg.dir.0).status().unwrap();
            assert!(owned.success(), "chown {user} {}", pg.dir.0.display());
        }
        let data = pg.data_dir();
        pg.run("initdb", &["-D", path(&data), "--auth=trust", "-U", "poolgate", "-E", "UTF8", "--no-sync"]);
        pg.start_again();
        pg
    }

    /// `postgres://poolgate:<password>@127.0.0.1:<port>/postgres` (the
    /// server trusts loopback: the password is there to be hidden).
    pub fn url(&self) -> String {
        format!("postgres://poolgate:pg-secret-pw@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops it (a fast shutdown: clients are disconnected), keeping its data.
    pub fn stop(&mut self) {
        if self.running {
            let data = self.data_dir();
            self.run("pg_ctl", &["-D", path(&data), "-m", "fast", "-w", "stop"]);
            self.running = false;
        }
    }

    /// Starts it again on the same port, with the same data.
    pub fn start_again(&mut self) {
        let (data, log) = (self.data_dir(), self.dir.0.join("sock").join("server.log"));
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.socket_dir().display()
        );
        self.run("pg_ctl", &["-D", path(&data), "-l", path(&log), "-o", &options, "-w", "-t", "60", "start"]);
        self.running = true;
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    /// The Unix socket's directory (and the server's log), the server's own.
    fn socket_dir(&self) -> PathBuf {
        self.dir.0.join("sock")
    }

    /// Runs the PostgreSQL program `program` with `args`, as the server's
    /// user; panics with what it said when it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program).args(args).stdin(Stdio::null()).output().expect(program);
        let log = std::fs::read_to_string(self.socket_dir().join("server.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{program} {args:?} failed:\n{}{}\nserver log:\n{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl PostgresServer {
    /// The PostgreSQL program `program`, to be run as the server's user, in
    /// a directory that user may enter (not the test's).
    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        let mut cmd = match &self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.current_dir(&self.dir.0);
        cmd
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.running {
            let data = self.data_dir();
            // Immediate: the data goes with it.
            let _ = self
                .command("pg_ctl")
                .args(["-D", path(&data), "-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
