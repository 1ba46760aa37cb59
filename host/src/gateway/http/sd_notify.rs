//! Readiness for systemd (`Type=notify`): the `sd_notify` protocol, which is
//! one datagram of `KEY=value` lines sent to the unix socket named by
//! `NOTIFY_SOCKET` (a path, or an abstract name when it starts with `@`). Too
//! small to need a crate.
//!
//! poolgate sends `READY=1` once it listens, `RELOADING=1` and `READY=1`
//! around a reload, and `STOPPING=1` when a shutdown begins. Without
//! `NOTIFY_SOCKET` (not run by systemd) nothing is sent; a send that fails is
//! logged and otherwise ignored — it never stops the gateway.

/// Sends `state` (`KEY=value` lines) to the service manager, if there is one.
/// Whether it was sent.
pub fn notify(state: &str) -> bool {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return false };
    match send(&socket, state) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, socket = %socket.to_string_lossy(), "cannot notify the service manager");
            false
        }
    }
}

/// `READY=1`, with a status line for `systemctl status`.
pub fn ready(status: &str) -> bool {
    notify(&format!("READY=1\nSTATUS={}", one_line(status)))
}

/// `RELOADING=1`, with the monotonic time systemd asks for with it.
pub fn reloading() -> bool {
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the configuration", monotonic_usec()))
}

/// `STOPPING=1`, with a status line.
pub fn stopping(status: &str) -> bool {
    notify(&format!("STOPPING=1\nSTATUS={}", one_line(status)))
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(unix)]
fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::net::UnixDatagram;
    let bytes = socket.as_bytes();
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
            return Ok(());
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = name;
            return Err(std::io::Error::other("abstract socket names exist on Linux only"));
        }
    }
    sock.send_to(state.as_bytes(), std::path::Path::new(socket))?;
    Ok(())
}

#[cfg(not(unix))]
fn send(_socket: &std::ffi::OsStr, _state: &str) -> std::io::Result<()> {
    Err(std::io::Error::other("sd_notify needs unix sockets"))
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd reads `MONOTONIC_USEC` in.
fn monotonic_usec() -> u64 {
    #[cfg(unix)]
    {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime only writes the timespec it is given.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } == 0 {
            return t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000;
        }
    }
    0
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn a_state_arrives_as_one_datagram_on_a_path_and_on_an_abstract_name() {
        let dir = std::env::temp_dir().join(format!("pg-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=x").unwrap();
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");
        let _ = std::fs::remove_dir_all(&dir);

        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt as _;
            let name = format!("pg-notify-test-{}", std::process::id());
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let rx = UnixDatagram::bind_addr(&addr).unwrap();
            send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"STOPPING=1");
        }
    }

    #[test]
    fn status_lines_stay_one_line_and_time_moves_forward() {
        assert_eq!(one_line("a\nb\rc"), "a b c");
        let a = monotonic_usec();
        assert!(a > 0 && monotonic_usec() >= a);
    }
}
