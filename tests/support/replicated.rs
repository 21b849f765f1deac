//! Servers with replicas: a master with one replica on loopback ports, and the replica of a
//! Redis Cluster master. Needs `server` and `poll` declared beside it.

use std::time::Duration;

use super::poll::eventually;
use super::server::RedisServer;

/// A master and one replica of it (`--replicaof`), the replica's link up.
pub struct Replicated {
    pub master: RedisServer,
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

/// The index in `nodes` of a replica of `nodes[master]` that is online.
pub fn replica_of(nodes: &[RedisServer], master: usize) -> usize {
    let mut replica = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            let ports = online_replicas(&nodes[master]);
            replica = nodes.iter().position(|n| ports.contains(&n.port()));
            replica.is_some()
        }),
        "node {master} has no online replica"
    );
    replica.unwrap_or_default()
}

/// `GET key` on a replica, as a replica answers it: a cluster replica redirects reads unless
/// the connection says `READONLY` first (a plain replica accepts it too).
pub fn get_on_replica(replica: &RedisServer, key: &str) -> Option<String> {
    let mut conn = replica.conn();
    let _: redis::RedisResult<()> = redis::cmd("READONLY").query(&mut conn);
    redis::cmd("GET")
        .arg(key)
        .query(&mut conn)
        .expect("GET on the replica")
}
