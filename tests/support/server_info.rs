//! What a server has done so far, from its own `INFO`: commands processed, bytes sent to
//! clients, CPU spent, clients connected. The benches that ask what an operation costs Redis
//! take two readings and divide the difference by the operations between them.

use std::ops::{Add, Sub};

/// A server's running totals (or the difference of two readings).
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerCounters {
    /// `total_commands_processed`.
    pub commands: f64,
    /// `total_net_output_bytes`: replies, pub/sub messages and tracking reports; not the
    /// replication stream, which Redis counts apart.
    pub bytes_out: f64,
    /// `used_cpu_user` + `used_cpu_sys`, in seconds.
    pub cpu_seconds: f64,
    /// `connected_clients` (a level, not a total: a difference of it means nothing).
    pub clients: f64,
}

/// Reads the counters of the server behind `conn` (`INFO all`; the call itself counts as one
/// command and a few hundred bytes, negligible over the thousands of operations measured).
pub fn server_counters(conn: &mut redis::Connection) -> ServerCounters {
    let info: String = redis::cmd("INFO").arg("all").query(conn).expect("INFO");
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO has no {name}"))
    };
    ServerCounters {
        commands: field("total_commands_processed:"),
        bytes_out: field("total_net_output_bytes:"),
        cpu_seconds: field("used_cpu_user:") + field("used_cpu_sys:"),
        clients: field("connected_clients:"),
    }
}

/// The sum over several servers (a cluster's nodes).
impl Add for ServerCounters {
    type Output = ServerCounters;
    fn add(self, o: ServerCounters) -> ServerCounters {
        ServerCounters {
            commands: self.commands + o.commands,
            bytes_out: self.bytes_out + o.bytes_out,
            cpu_seconds: self.cpu_seconds + o.cpu_seconds,
            clients: self.clients + o.clients,
        }
    }
}

/// What happened between two readings (`after - before`).
impl Sub for ServerCounters {
    type Output = ServerCounters;
    fn sub(self, o: ServerCounters) -> ServerCounters {
        ServerCounters {
            commands: self.commands - o.commands,
            bytes_out: self.bytes_out - o.bytes_out,
            cpu_seconds: self.cpu_seconds - o.cpu_seconds,
            clients: self.clients - o.clients,
        }
    }
}
