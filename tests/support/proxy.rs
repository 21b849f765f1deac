//! A loopback TCP proxy the test controls, to put network faults between clients and a real
//! redis-server: cut every connection, add latency, black-hole traffic (bytes held, not
//! forwarded, then either delivered late or dropped with the connection), or hold new connections
//! (while the server restarts). It listens on 127.0.0.1 only and forwards to 127.0.0.1 only.
//!
//! It runs on its own tokio runtime (one thread), so a synchronous test controller can drive it.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How the proxy treats traffic right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    dead_code,
    reason = "each test binary injects a different subset of the faults"
)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Forward each chunk after this delay (order kept).
    Delay(Duration),
    /// Forward nothing, in either direction, and accept but do not connect new clients; what is
    /// held is delivered when the mode changes, unless the connections are cut first.
    Blackhole,
    /// Accept new clients but do not connect them upstream yet; existing connections pass.
    Hold,
}

struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped to cut every open connection.
    cuts: watch::Sender<u64>,
}

pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let shared = Arc::new(Shared {
            mode: watch::Sender::new(Mode::Pass),
            cuts: watch::Sender::new(0),
        });
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port for the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let accepting = Arc::clone(&shared);
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                tokio::spawn(serve(client, upstream, Arc::clone(&accepting)));
            }
        });
        Proxy {
            port,
            shared,
            runtime: Some(runtime),
        }
    }

    /// A redis URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Treats traffic as `mode` says from now on.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }
}

/// What only some test files do with a proxy (rustc checks dead code per test binary).
#[allow(
    dead_code,
    reason = "each test binary injects a different subset of the faults"
)]
impl Proxy {
    /// Closes every open connection at once (both sides); new ones are accepted as the mode says.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn serve(client: TcpStream, upstream: u16, shared: Arc<Shared>) {
    let mut cuts = shared.cuts.subscribe();
    cuts.borrow_and_update();
    let mut mode = shared.mode.subscribe();
    // New clients wait while the upstream is held or black-holed.
    let ready = mode.wait_for(|m| matches!(m, Mode::Pass | Mode::Delay(_)));
    tokio::select! {
        r = ready => if r.is_err() { return },
        _ = cuts.changed() => return,
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let up = pump(client_r, server_w, shared.mode.subscribe());
    let down = pump(server_r, client_w, shared.mode.subscribe());
    // Either direction ending (EOF, error) or a cut closes the whole connection.
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cuts.changed() => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass | Mode::Hold => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
