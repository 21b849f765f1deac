//! Real `redis-server` processes for the tests: each on a free loopback port, in its own temp
//! dir, killed (by pid, as a child of the test) on drop. No server on the default port is used.
//! `src/store/memory_model_tests.rs` includes this file too (it compares the memory store with
//! a real server).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `redis-server` child process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// Extra command-line settings (passwords, ACL users, TLS), kept for restarts.
    args: Vec<String>,
    /// `user:password@` or `:password@` for `url()`, when the server wants authentication.
    userinfo: String,
}

pub const INSTALL_HINT: &str = "redis-server was not found on PATH. The integration tests start \
their own Redis servers: install it (Debian/Ubuntu: `apt-get install redis-server`, macOS: \
`brew install redis`) or run `bash .ci/test`, which installs it.";

impl RedisServer {
    /// Starts a server with extra settings (`--requirepass`, `--user`, `--tls-port`...);
    /// `userinfo` (`":password@"`, `"user:password@"`) is what `url()` and `conn()` log in with.
    pub fn start_with(args: &[String], userinfo: &str) -> Self {
        for _ in 0..5 {
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir: tempfile::tempdir().expect("a temp dir for redis-server"),
                args: args.to_vec(),
                userinfo: userinfo.to_owned(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not come up on any of 5 free ports");
    }

    /// Spawns the process on `self.port`; false if it did not answer within 10 s (port taken).
    fn spawn(&mut self) -> bool {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping() {
                return true;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// Starts the process on `self.port`, without waiting for it.
    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(&self.args)
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(e) => panic!("could not start redis-server: {e}"),
        };
        self.child = Some(child);
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// `redis://` URL of database 0, with the login the server wants.
    pub fn url(&self) -> String {
        format!("redis://{}127.0.0.1:{}/0", self.userinfo, self.port)
    }

    /// SIGKILLs the server and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What only some test files call. rustc checks dead code per test binary, so a method that one
/// binary leaves out would warn there; the members of a type that several files share carry a
/// scoped `allow` (here, and in `proxy.rs` and `worker.rs`), while every free helper sits in a
/// module of its own, declared only by the files that use it and checked in each.
#[allow(
    dead_code,
    reason = "each test binary calls a different subset of these methods"
)]
impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[], "")
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id while it runs (for SIGSTOP and SIGKILL).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A plain synchronous connection, for inspecting and tampering with the server's state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("a connection to the test redis-server")
    }

    /// Kills the server and starts it again on the same port from its RDB file (written by
    /// `SAVE`), returning as soon as it accepts connections, which may be while it still loads
    /// the file (it answers `LOADING` then; see `--key-load-delay` to make that last).
    pub fn restart_loading(&mut self) {
        self.kill();
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("redis-server did not listen again on port {}", self.port);
    }

    /// Kills the server and starts a new, empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not come back on port {}", self.port);
    }
}

/// A port that was free a moment ago on 127.0.0.1.
/// At most 55535: a cluster node also listens on its port + 10000 (the cluster bus).
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if port <= 55535 {
            return port;
        }
    }
}
