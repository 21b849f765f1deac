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
        // acknowledge nothing yet: a test's first `WAIT` would then time out (a CI failure of
        // failover_safe_locks). The replica's acknowledgement of the master's offset first.
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(10_000)
            .query(&mut master.conn())
            .expect("WAIT on the master");
        assert_eq!(acked, 1, "the replica acknowledged nothing within 10 s");
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
