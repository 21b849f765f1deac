//! `MONITOR` through the command-line client (`redis-cli`, or the one `server::programs` picks),
//! to count the commands a client sends. Needs `server` declared beside it.

use std::process::{Child, Stdio};
use std::time::Duration;

use super::server::{not_started, RedisServer};

/// `MONITOR` on a server: the commands clients send, in order, without the ones that
/// scripts run inside the server. Counts round trips as the server sees them.
pub struct Monitor {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Monitor {
    pub fn start(server: &RedisServer) -> Self {
        use std::io::BufRead;
        let mut monitor = server.cli();
        let mut child = monitor
            .arg("monitor")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}", not_started(monitor.get_program().as_ref(), &e)));
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
