//! A TCP forwarder in front of the mock upstream, for the faults the mock
//! cannot make from inside an HTTP server: a port that refuses connections,
//! and a connection closed cleanly (FIN, no answer) once the request is in.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;

/// What the forwarder does with connections now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Pipes both ways to the mock.
    Pass = 0,
    /// Closes its listening socket: connects are refused.
    Refuse = 1,
    /// Accepts, reads the request's first bytes, then closes without a byte.
    CloseEarly = 2,
}

/// A forwarder on its own loopback port.
#[derive(Clone)]
pub struct Forwarder {
    /// Its address (kept across a refusal: it rebinds the same port).
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    changed: Arc<Notify>,
}

impl Forwarder {
    /// Starts one forwarding to `to`.
    pub async fn start(to: SocketAddr) -> std::io::Result<Forwarder> {
        let listener = bind("127.0.0.1:0".parse().expect("an address"))?;
        let addr = listener.local_addr()?;
        let f = Forwarder { addr, mode: Arc::new(AtomicU8::new(Mode::Pass as u8)), changed: Arc::new(Notify::new()) };
        tokio::spawn(f.clone().serve(listener, to));
        Ok(f)
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches its behaviour for new connections.
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            1 => Mode::Refuse,
            2 => Mode::CloseEarly,
            _ => Mode::Pass,
        }
    }

    async fn serve(self, mut listener: tokio::net::TcpListener, to: SocketAddr) {
        loop {
            if self.mode() == Mode::Refuse {
                drop(listener);
                while self.mode() == Mode::Refuse {
                    let changed = self.changed.notified();
                    if self.mode() != Mode::Refuse {
                        break;
                    }
                    changed.await;
                }
                listener = loop {
                    match bind(self.addr) {
                        Ok(l) => break l,
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
                    }
                };
            }
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = self.changed.notified() => continue,
            };
            let Ok((client, _)) = accepted else { continue };
            let mode = self.mode();
            tokio::spawn(async move {
                match mode {
                    Mode::CloseEarly => close_early(client).await,
                    _ => pipe(client, to).await,
                }
            });
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn close_early(mut client: TcpStream) {
    let mut buf = [0u8; 1024];
    let _ = client.read(&mut buf).await;
    // Dropped: a FIN after the request, no status line.
}

async fn pipe(mut client: TcpStream, to: SocketAddr) {
    if let Ok(mut upstream) = TcpStream::connect(to).await {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}
