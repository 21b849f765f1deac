//! Real `redis-server` processes for the tests: each on a free loopback port, in its own temp
//! dir, killed (by pid, as a child of the test) on drop. No server on the default port is used.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod history;
pub mod proxy;

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

const INSTALL_HINT: &str = "redis-server was not found on PATH. The integration tests start \
their own Redis servers: install it (Debian/Ubuntu: `apt-get install redis-server`, macOS: \
`brew install redis`) or run `bash .ci/test`, which installs it.";

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[], "")
    }

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

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://{}127.0.0.1:{}/0", self.userinfo, self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A plain synchronous connection, for inspecting and tampering with the server's state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("a connection to the test redis-server")
    }

    /// SIGKILLs the server and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of 3 masters and 3 replicas on loopback ports, with a short node timeout so
/// that a killed master's replica is promoted within a few seconds.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
            // A replica may always take over, however long ago it last heard from its master:
            // the test kills masters of freshly created clusters.
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(String::from)
        .to_vec();
        // Started in parallel: each waits for its own PING.
        let nodes: Vec<RedisServer> = std::thread::scope(|s| {
            let starting: Vec<_> = (0..6)
                .map(|_| s.spawn(|| RedisServer::start_with(&args, "")))
                .collect();
            starting
                .into_iter()
                .map(|h| h.join().expect("a cluster node"))
                .collect()
        });
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("redis-cli: {e}. {INSTALL_HINT}"));
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        assert!(
            eventually(Duration::from_secs(30), || cluster.is_healthy()),
            "the cluster did not become healthy"
        );
        cluster
    }

    /// Every live node reports `cluster_state:ok` with all slots served.
    pub fn is_healthy(&self) -> bool {
        self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
            let Ok(client) = redis::Client::open(n.url()) else {
                return false;
            };
            let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500))
            else {
                return false;
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .unwrap_or_default();
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        })
    }

    /// Seed URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port()))
            .collect()
    }

    /// The node serving `key`'s slot as master.
    pub fn master_of(&self, key: &str) -> usize {
        let mut conn = self.nodes[0].conn();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).unwrap();
        for range in slots {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(master)),
            ) = (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&i64::from(slot)) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return self
                        .nodes
                        .iter()
                        .position(|n| i64::from(n.port()) == *port)
                        .expect("a node of this cluster");
                }
            }
        }
        panic!("no master serves slot {slot}");
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

/// Microseconds since the Unix epoch: the one clock that a test and the processes it starts share.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// [`now_us`] in milliseconds.
pub fn now_ms() -> u64 {
    now_us() / 1000
}

/// Sends a signal to a process this test started (by pid).
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("the kill command");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Polls `check` every 10 ms until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `redis-cli monitor` on a server: the commands clients send, in order, without the ones that
/// scripts run inside the server. Counts round trips as the server sees them.
pub struct Monitor {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Monitor {
    pub fn start(server: &RedisServer) -> Self {
        use std::io::BufRead;
        let mut child = Command::new("redis-cli")
            .args(["-p", &server.port().to_string(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-cli: {e}. {INSTALL_HINT}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // MONITOR answers OK once it is active; only then are later commands seen.
        let ok = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("redis-cli monitor starts");
        assert_eq!(ok, "OK");
        Monitor { child, lines }
    }

    /// The commands seen so far (names, upper case), ended by a marker sent now.
    pub fn commands_until_now(self, server: &RedisServer) -> Vec<String> {
        let marker = "stampede-guard-monitor-marker";
        let _: String = redis::cmd("ECHO")
            .arg(marker)
            .query(&mut server.conn())
            .unwrap();
        let mut commands = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(10))
                .expect("the marker reaches the monitor");
            if line.contains(marker) {
                break;
            }
            // `1700000000.123456 [0 127.0.0.1:5000] "GET" "key"`; script commands say `[0 lua]`.
            if line.contains(" lua] ") {
                continue;
            }
            if let Some(name) = line.split('"').nth(1) {
                commands.push(name.to_uppercase());
            }
        }
        commands
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// For a bench with its own `main` (`harness = false`): whether the filters `cargo bench` was
/// given leave out the bench called `name` (with filters, only the benches they name run).
pub fn bench_filtered_out(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str()))
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of `sorted` samples, in milliseconds.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1000.0
}

/// The `main` of a test binary with `harness = false` that re-executes itself as child processes:
/// run as a child (`STAMPEDE_CHILD` names its role), it runs `child` and exits with its outcome;
/// otherwise it runs the tests as [`run_tests`] does.
pub fn run_child_or_tests(
    binary: &str,
    tests: &[(&str, fn())],
    child: fn(&str) -> Result<(), String>,
) {
    if let Ok(role) = std::env::var("STAMPEDE_CHILD") {
        if let Err(e) = child(&role) {
            eprintln!("{binary}: child {role} failed: {e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    run_tests(binary, tests);
}

/// The `main` of a test binary with `harness = false`: runs the tests whose names contain one of
/// the command-line filters (all without filters), prints libtest-like lines and a summary, and
/// exits non-zero if any failed.
pub fn run_tests(binary: &str, tests: &[(&str, fn())]) {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("\n{binary}: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

/// A worker process started from this test binary, with its stdout lines collected (with the
/// moment each arrived) as it runs.
pub struct Worker {
    pub child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
    /// The thread collecting `lines`; it ends at the child's end of output.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Re-executes this test binary with `STAMPEDE_CHILD=role` and the given variables.
    pub fn spawn(role: &str, vars: &[(&str, String)]) -> Self {
        use std::io::BufRead;
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
        cmd.env("STAMPEDE_CHILD", role).stdout(Stdio::piped());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("a worker process");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().unwrap().push((Instant::now(), line));
            }
        });
        Worker {
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// The lines printed so far.
    pub fn lines(&self) -> Vec<(Instant, String)> {
        self.lines.lock().unwrap().clone()
    }

    /// The last line starting with `prefix`, if any.
    pub fn last(&self, prefix: &str) -> Option<(Instant, String)> {
        self.lines()
            .into_iter()
            .rev()
            .find(|(_, l)| l.starts_with(prefix))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to end; true if it exited with success. Its output is then
    /// collected whole: the reader is joined, so a line printed just before the exit is in
    /// `lines` (a test once read the lines before the reader had taken the last one).
    pub fn wait_success(&mut self) -> bool {
        let success = self.child.wait().map(|s| s.success()).unwrap_or(false);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        success
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.is_alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
