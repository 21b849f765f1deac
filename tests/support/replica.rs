//! A cluster master's replica, and reading from a replica. Needs `server`, `poll` and
//! `replicated` declared beside it.

use std::time::Duration;

use super::poll::eventually;
use super::replicated::online_replicas;
use super::server::RedisServer;

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
