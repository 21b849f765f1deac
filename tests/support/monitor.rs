//! `MONITOR` (over `RedisServer::monitor`'s socket, so also on a managed-like server that
//! renames it), to count the commands a client sends. Needs `server` declared beside it.

use std::time::Duration;

use super::server::{MonitorSocket, RedisServer};

/// `MONITOR` on a server: the commands clients send, in order, without the ones that
/// scripts run inside the server and without connection set-up. Counts round trips as the
/// server sees them.
pub struct Monitor {
    _socket: MonitorSocket,
    lines: std::sync::mpsc::Receiver<String>,
}

#[allow(
    dead_code,
    reason = "each test binary calls a different subset of these methods"
)]
impl Monitor {
    pub fn start(server: &RedisServer) -> Self {
        let (socket, monitored) = server.monitor();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in monitored {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // MONITOR answers OK once it is active; only then are later commands seen.
        let ok = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR starts");
        assert_eq!(ok, "OK");
        Monitor {
            _socket: socket,
            lines,
        }
    }

    /// Every line seen so far (scripts' commands included), as the server wrote it, ended by a
    /// marker sent now.
    pub fn lines_until_now(&self, server: &RedisServer) -> Vec<String> {
        let marker = "stampede-guard-monitor-marker";
        let _: String = redis::cmd("ECHO")
            .arg(marker)
            .query(&mut server.conn())
            .unwrap();
        let mut lines = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(10))
                .expect("the marker reaches the monitor");
            if line.contains(marker) {
                return lines;
            }
            lines.push(line);
        }
    }

    /// The commands seen so far (names, upper case), ended by a marker sent now.
    pub fn commands_until_now(self, server: &RedisServer) -> Vec<String> {
        let mut commands = Vec::new();
        for line in self.lines_until_now(server) {
            // `1700000000.123456 [0 127.0.0.1:5000] "GET" "key"`; script commands say `[0 lua]`.
            if line.contains(" lua] ") {
                continue;
            }
            let mut quoted = line.split('"').skip(1).step_by(2);
            let Some(name) = quoted.next().map(str::to_uppercase) else {
                continue;
            };
            let first = quoted.next().unwrap_or_default();
            if !is_connection_set_up(&name, &first.to_uppercase()) && !is_learning(&name, first) {
                commands.push(name);
            }
        }
        commands
    }
}

/// What a client sends when it opens a connection, before any command of the crate's: redis-rs
/// sends `CLIENT SETINFO LIB-NAME`/`LIB-VER` on every new connection (and `HELLO`, `AUTH`,
/// `SELECT`, `CLIENT SETNAME` when the URL asks for them); a near tier's feed connection may
/// turn on `CLIENT TRACKING` (`ID` goes with it). Redis 7.0 does not know `CLIENT SETINFO` (7.2
/// added it) and refuses it before MONITOR sees it; Valkey 8 runs it and shows it, from the
/// marker's own connection and from any connection the crate opens while the monitor watches.
/// The counts the tests assert are of the commands that do the crate's work (`GET`, `MGET`,
/// `EVALSHA`...), which these are not, so they are left out here, by name and subcommand, on
/// every server: a test's expected list is the same on Redis and on Valkey. `PING` stays in:
/// the crate sends it as its own probe, not as set-up.
#[allow(
    dead_code,
    reason = "used by `commands_until_now`, which some binaries do not call"
)]
fn is_connection_set_up(name: &str, subcommand: &str) -> bool {
    match name {
        "HELLO" | "AUTH" | "SELECT" => true,
        "CLIENT" => matches!(
            subcommand,
            "SETINFO" | "SETNAME" | "ID" | "TRACKING" | "CACHING"
        ),
        _ => false,
    }
}

/// The read of the namespace's epoch under tracking (`CLIENT CACHING yes`, then `GET ns:{%c}`),
/// which a single server's store sends once, and again after each `clear`, so that its hits read
/// their values alone (`src/store/redis/held_epoch.rs`): in the background, when the first
/// read asks for the epoch, so a test cannot say in which window it falls. Left out as the
/// connection's set-up is.
#[allow(
    dead_code,
    reason = "used by `commands_until_now`, which some binaries do not call"
)]
fn is_learning(name: &str, key: &str) -> bool {
    name == "GET" && key.ends_with(":{%c}")
}

/// The reads a client sent among `lines` (`GET` and `MGET`, each with its keys), without the
/// read of the namespace's epoch under tracking (see [`is_learning`]) and the scripts' own.
#[allow(
    dead_code,
    reason = "used by the binaries that wait for a hit to read its value alone"
)]
pub fn reads(lines: &[String]) -> Vec<Vec<String>> {
    lines
        .iter()
        .filter(|line| !line.contains(" lua] "))
        .filter_map(|line| {
            let words: Vec<String> = line
                .split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            let name = words.first()?.to_uppercase();
            let key = words.get(1).map_or("", String::as_str);
            (matches!(name.as_str(), "GET" | "MGET") && !is_learning(&name, key)).then_some(words)
        })
        .collect()
}

/// Calls `hit` (a read of the value key `value_key`) until one is a read of that key alone
/// (`GET value_key`): the store learns the namespace's epoch in the background after its first
/// answered read, and from then on its hits read one key (`src/store/redis/held_epoch.rs`).
/// Whether it did: a managed-like server ([`managed`](super::server::managed)) refuses
/// `CLIENT TRACKING`, so the epoch is never held there and every read asks for it (false at
/// once). Fails after 5 s otherwise.
#[allow(
    dead_code,
    reason = "used by the binaries that wait for a hit to read its value alone"
)]
pub async fn until_a_hit_reads_alone<F, Fut>(server: &RedisServer, value_key: &str, hit: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if super::server::managed() {
        return false;
    }
    for _ in 0..250 {
        let monitor = Monitor::start(server);
        hit().await;
        if reads(&monitor.lines_until_now(server)) == [vec!["GET".to_owned(), value_key.to_owned()]]
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("a hit never read its value alone: the namespace's epoch was never held");
}
