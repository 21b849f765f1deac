//! A Redis Cluster on loopback ports. Needs `server` and `poll` declared beside it.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::poll::eventually;
use super::server::{not_started, RedisServer};

/// A Redis Cluster of 3 masters and 3 replicas on loopback ports, with a short node timeout so
/// that a killed master's replica is promoted within a few seconds.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// This process's one turn to run a cluster, given back after the nodes are gone (fields
    /// drop in order). The node timeout is short (1 s) so that failover tests are quick; with
    /// every test of a file starting its six nodes at once (48 servers on the 2-core machine)
    /// the cluster bus can miss it, and a master is failed over before the test's own fault:
    /// a CI run saw a `get` time out before anything was killed. One cluster at a time keeps
    /// the only failovers the ones a test makes.
    _turn: Turn,
}

/// A turn to run a cluster in this process: one at a time, handed on when dropped.
struct Turn;

/// Whether a cluster of this process holds the turn, and the tests waiting for it.
static TURN: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

impl Turn {
    /// Waits until no other cluster of this process runs.
    fn take() -> Turn {
        let (busy, freed) = &TURN;
        let mut busy = busy.lock().unwrap_or_else(|p| p.into_inner());
        while *busy {
            busy = freed.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
        *busy = true;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let (busy, freed) = &TURN;
        *busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
        freed.notify_one();
    }
}

/// What only some test files call (rustc checks dead code per test binary; see `server.rs`).
#[allow(
    dead_code,
    reason = "each test binary calls a different subset of these methods"
)]
impl RedisCluster {
    /// A cluster for tests that make no fault: its node timeout (5 s) outlasts the stalls of
    /// a loaded machine, so no master is failed over by itself (with 1 s, the stall of a busy
    /// CI run can pass for a death; see [`Turn`]), and its nodes still learn their roles from
    /// each other within a few seconds.
    pub fn start() -> Self {
        Self::start_with_timeout(5_000)
    }

    /// A cluster that fails a killed master over within a few seconds (node timeout 1 s), for
    /// the tests that kill one.
    pub fn failing_over() -> Self {
        Self::start_with_timeout(1000)
    }

    /// A cluster whose nodes call a master failing after `node_timeout_ms` without an answer
    /// (its replica is promoted shortly after). Each node keeps its `nodes.conf` in its own dir,
    /// so a node restarted with [`RedisServer::restart`] comes back with its identity and
    /// rejoins (as a replica, if its slots were taken over meanwhile).
    pub fn start_with_timeout(node_timeout_ms: u64) -> Self {
        let turn = Turn::take();
        let node_timeout = node_timeout_ms.to_string();
        let args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout,
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
        let mut create = nodes[0].cli();
        let created = create
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("{}", not_started(create.get_program().as_ref(), &e)));
        // Its own words say why (a node refused, a slot already taken, ...): once it failed in a
        // CI run with nothing else to go on.
        assert!(
            created.status.success(),
            "{create:?} failed ({}):\n{}{}",
            created.status,
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = RedisCluster { nodes, _turn: turn };
        assert!(
            eventually(Duration::from_secs(30), || cluster.is_healthy()
                && cluster.roles_agree()),
            "the cluster did not become healthy, every node seeing three masters with one \
             replica each"
        );
        cluster
    }

    /// Every live node reports `cluster_state:ok` with all slots served.
    pub fn is_healthy(&self) -> bool {
        self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
            let Ok(client) = redis::Client::open(n.admin_url()) else {
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

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
#[allow(
    dead_code,
    reason = "read only by the test binaries that drive a cluster's faults"
)]
pub struct NodeView {
    /// Its index in [`RedisCluster::nodes`].
    pub index: usize,
    pub id: String,
    pub master: bool,
    /// Flagged failing (`fail` or `fail?`) by the node asked.
    pub failing: bool,
    /// For a replica, its master's id.
    pub master_id: Option<String>,
    /// For a master, the slot ranges it serves.
    pub slots: Vec<(u16, u16)>,
}

#[allow(
    dead_code,
    reason = "each test binary calls a different subset of these methods"
)]
impl RedisCluster {
    /// A connection to node `i` that gives up after `timeout` on connecting and on each reply
    /// (a node stopped by SIGSTOP accepts connections and never answers).
    pub fn node_conn(&self, i: usize, timeout: Duration) -> Option<redis::Connection> {
        let client = redis::Client::open(self.nodes[i].admin_url()).ok()?;
        let conn = client.get_connection_with_timeout(timeout).ok()?;
        conn.set_read_timeout(Some(timeout)).ok()?;
        conn.set_write_timeout(Some(timeout)).ok()?;
        Some(conn)
    }

    /// The cluster as node `i` sees it (`CLUSTER NODES`), or `None` if it does not answer.
    pub fn view(&self, i: usize) -> Option<Vec<NodeView>> {
        let mut conn = self.node_conn(i, Duration::from_millis(500))?;
        let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn).ok()?;
        text.lines().map(|line| self.node_view(line)).collect()
    }

    /// One line of `CLUSTER NODES`: `id ip:port@bus flags master ping pong epoch link slots...`.
    fn node_view(&self, line: &str) -> Option<NodeView> {
        let f: Vec<&str> = line.split(' ').collect();
        let port: u16 = f
            .get(1)?
            .split('@')
            .next()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        let index = self.nodes.iter().position(|n| n.port() == port)?;
        let flags = f.get(2)?;
        let slots = f
            .get(8..)
            .unwrap_or_default()
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                None => s.parse().ok().map(|n| (n, n)),
            })
            .collect();
        Some(NodeView {
            index,
            id: f[0].to_string(),
            master: flags.contains("master"),
            failing: flags.contains("fail"),
            master_id: (f.get(3)? != &"-").then(|| f[3].to_string()),
            slots,
        })
    }

    /// Healthy in the strict sense a fault schedule needs before its next fault: every node
    /// runs and answers, says `cluster_state:ok` with every slot served, and node 0 sees three
    /// masters, each with one replica, and no node failing.
    pub fn is_settled(&self) -> bool {
        let all_ok = (0..self.nodes.len()).all(|i| {
            let Some(mut conn) = self.node_conn(i, Duration::from_millis(500)) else {
                return false;
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .unwrap_or_default();
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        });
        all_ok && self.view(0).is_some_and(|view| settled(&view))
    }

    /// Every node sees three masters, each with one replica, and no node failing: after
    /// `--cluster create` the nodes learn who replicates whom by gossip, and a node that has
    /// not yet heard it still lists a replica as a master (a client that trusts its listing
    /// writes there and is refused `READONLY`).
    pub fn roles_agree(&self) -> bool {
        (0..self.nodes.len()).all(|i| self.view(i).is_some_and(|view| settled(&view)))
    }
}

/// A view of three masters, each with one replica, and no node failing.
fn settled(view: &[NodeView]) -> bool {
    let masters: Vec<&NodeView> = view.iter().filter(|n| n.master).collect();
    masters.len() == 3
        && view.iter().all(|n| !n.failing)
        && masters.iter().all(|m| {
            view.iter()
                .filter(|n| n.master_id.as_deref() == Some(m.id.as_str()))
                .count()
                == 1
        })
}
