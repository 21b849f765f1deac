//! A master with one replica on loopback ports. Needs `server` and `poll` declared beside it.

use std::time::Duration;

use super::poll::eventually;
use super::server::RedisServer;

/// A master and one replica of it (`--replicaof`), the replica's link up.
pub struct Replicated {
    pub master: RedisServer,
    #[allow(
        dead_code,
        reason = "the benches only keep the replica alive; the tests stop it"
    )]
    pub replica: RedisServer,
}

impl Replicated {
    /// Starts both and waits until the master counts the replica as online.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(
            &["--replicaof", "127.0.0.1", &master.port().to_string()].map(String::from),
            "",
        );
        assert!(
            eventually(Duration::from_secs(10), || online_replicas(&master)
                .contains(&replica.port())),
            "the replica did not come online"
        );
        // Online on the master's side, the replica may still be loading what it was sent and
        // acknowledge nothing yet: a test's first `WAIT` would then time out (CI failures of
        // failover_safe_locks). So a write, and the replica's acknowledgement of it: `WAIT`
        // counts the replicas that acknowledged the connection's last write, and a connection
        // that wrote nothing is answered at once, whatever the replica is doing.
        let mut conn = master.conn();
        let (acked,): (i64,) = redis::pipe()
            .cmd("SET")
            .arg("replicated:started")
            .arg(1)
            .ignore()
            .cmd("WAIT")
            .arg(1)
            .arg(10_000)
            .query(&mut conn)
            .expect("SET and WAIT on the master");
        assert_eq!(acked, 1, "the replica acknowledged no write within 10 s");
        let _: () = redis::cmd("DEL")
            .arg("replicated:started")
            .query(&mut conn)
            .expect("DEL on the master");
        Replicated { master, replica }
    }
}

/// The ports of the replicas that `master` counts as online (`INFO replication`).
pub fn online_replicas(master: &RedisServer) -> Vec<u16> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut master.conn())
        .unwrap_or_default();
    info.lines()
        .filter(|line| line.starts_with("slave") && line.contains("state=online"))
        .filter_map(|line| {
            let port = line
                .split(',')
                .find_map(|field| field.strip_prefix("port="))?;
            port.parse().ok()
        })
        .collect()
}
