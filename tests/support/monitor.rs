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
            let subcommand = quoted.next().unwrap_or_default().to_uppercase();
            if !is_connection_set_up(&name, &subcommand) {
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
        "CLIENT" => matches!(subcommand, "SETINFO" | "SETNAME" | "ID" | "TRACKING"),
        _ => false,
    }
}
