//! The cluster schedule (`STAMPEDE_CHAOS_CLUSTER=1`): the same workers, calls, locks and
//! leader, and the same checker, on a 3-master, 3-replica Redis Cluster the run starts, with
//! faults of its own next to the workers' kills and pauses:
//! - `CLUSTER FAILOVER` and `CLUSTER FAILOVER FORCE` sent to a replica (the forced one does not
//!   wait for its master to agree: the old master goes on taking writes until it hears);
//! - a master SIGKILLed (its replica is promoted after the node timeout), restarted a few
//!   seconds later (it rejoins as a replica, empty, and syncs);
//! - a master SIGSTOPped past the node timeout, then SIGCONTed (it comes back as a replica);
//! - the slot of a hot key moved to another master under load (`CLUSTER SETSLOT
//!   IMPORTING`/`MIGRATING`, `MIGRATE`, `SETSLOT NODE`).
//!
//! All four of the first kinds count as `failover` in the faults line, each also under its own
//! name; a move counts as `migrate`. One cluster fault at a time, each begun only when the
//! cluster is settled again (every node up, three masters with a replica each).
//!
//! The server's side is read from every node's MONITOR (one log per node and life, restarted
//! with the node) and merged by time into one log that says which node ran each script
//! (`N <node>` lines) and which entries a migration moves (`M <node> <entry>...`): only masters
//! run scripts (`[0 lua]`), and a Redis 7.0 replica's MONITOR shows nothing of what it
//! replicates, so each decision appears once, on the node that was master for it. What a
//! failover did to an entry's fencing counter is worked out by the replay (`fences.rs`).
//! Not run here: the near tier and serve-while-down (their faults are the proxies', and a
//! cluster client connects to the nodes' own addresses), the outside writer and eviction
//! pressure (the single-server schedule's).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::checker::{check, documented, documented_kinds};
use crate::history::{Call, Ending, FailoverWindow, History, Outcome, Rollback, ServerEvent};
use crate::support::cluster::{NodeView, RedisCluster};
use crate::support::{now_us, signal, RedisServer};
use crate::{read_worker_log, replay, Controller, MonitorLog, CALL_BOUND, LEASE};
use crate::{NAMESPACE, WORKERS};

/// The node timeout: a failed or paused master's replica is promoted about this long after.
const NODE_TIMEOUT_MS: u64 = 1000;
/// The hash tags of every key the workers use: the cache's entries, the locks, the leader,
/// the tags' epochs and the clear key. A failover window lists those its master served.
const KEY_TAGS: &[&str] = &[
    "k0", "k1", "k2", "L0", "L1", "leader", "%t:t0", "%t:t1", "%t:t2", "%c",
];
/// The entries whose slot the migration fault moves (the hot ones: the cache's keys and the
/// locks).
const MOVED_TAGS: &[&str] = &["k0", "k1", "k2", "L0", "L1", "leader"];
/// The probe of a fencing counter (see `Nodes::probe_counters`; read by `replay.rs`).
const PROBE: &str = "local v = redis.call('GET', KEYS[1]) or '0'
redis.call('ECHO', 'probe ' .. KEYS[1] .. ' ' .. v)
return v";
/// How long a killed master stays down before it is restarted (ms): past the node timeout and
/// the election, so that its replica has taken over.
const KILLED_MS: std::ops::Range<u64> = 2500..5000;
/// How long a paused master stays stopped (ms): past the node timeout and the election.
const PAUSED_MS: std::ops::Range<u64> = 2500..4000;
/// The longest a fault may take to settle before the run gives up on the cluster.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster fault in progress, if any.
enum Fault {
    /// A failover asked of a replica (`force` or not): under way until the replica says it is
    /// a master (or `until` passes: a replica may give up).
    Asked { replica: usize, until: Instant },
    /// Over once the cluster settles.
    Failover,
    /// A master killed: restarted at `restart_at`.
    Killed { node: usize, restart_at: Instant },
    /// A master stopped: continued at `resume_at`.
    Paused { node: usize, resume_at: Instant },
}

/// A fault's record until the cluster settles: when it began, its kind, the tags it touched.
struct Open {
    fault: Fault,
    window: FailoverWindow,
}

/// The cluster, each node's monitor, and the record of the faults.
struct Nodes {
    cluster: RedisCluster,
    dir: PathBuf,
    monitors: Vec<Option<MonitorLog>>,
    lives: Vec<u32>,
    /// The monitor logs written so far, with their node.
    logs: Vec<(usize, PathBuf)>,
    /// The migration markers for the merged log: when, to which node, which entries.
    moves: Vec<(u64, usize, Vec<String>)>,
    slots: BTreeMap<&'static str, u16>,
}

impl Nodes {
    fn start(dir: &Path) -> Self {
        let cluster = RedisCluster::start_with_timeout(NODE_TIMEOUT_MS);
        let mut conn = cluster.nodes[0].conn();
        let slots = KEY_TAGS
            .iter()
            .map(|tag| {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(format!("{{{tag}}}"))
                    .query(&mut conn)
                    .expect("CLUSTER KEYSLOT");
                (*tag, slot)
            })
            .collect();
        let mut nodes = Nodes {
            monitors: (0..cluster.nodes.len()).map(|_| None).collect(),
            lives: vec![0; cluster.nodes.len()],
            cluster,
            dir: dir.to_path_buf(),
            logs: Vec::new(),
            moves: Vec::new(),
            slots,
        };
        for i in 0..nodes.cluster.nodes.len() {
            nodes.watch(i);
        }
        nodes
    }

    /// Starts the monitor of node `i`'s current life.
    fn watch(&mut self, i: usize) {
        let path = self.dir.join(format!("monitor-n{i}-{}.log", self.lives[i]));
        self.monitors[i] = Some(MonitorLog::start(&self.cluster.nodes[i], path));
    }

    /// Stops the monitor of node `i` (its node killed, or the run over).
    fn unwatch(&mut self, i: usize) {
        if let Some(monitor) = self.monitors[i].take() {
            self.logs.push((i, monitor.stop()));
            self.lives[i] += 1;
        }
    }

    /// The cluster as some answering node sees it.
    fn view(&self, skip: Option<usize>) -> Option<Vec<NodeView>> {
        (0..self.cluster.nodes.len())
            .filter(|i| Some(*i) != skip)
            .find_map(|i| self.cluster.view(i))
    }

    /// The tags whose slot `master` serves.
    fn tags_of(&self, master: &NodeView) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(_, slot)| master.slots.iter().any(|(lo, hi)| (lo..=hi).contains(slot)))
            .map(|(tag, _)| tag.to_string())
            .collect()
    }

    /// The merged log of every node's monitor, by time (see the module's docs).
    fn merged(&self) -> Vec<String> {
        let mut groups: Vec<(u64, usize, Vec<String>)> = Vec::new();
        for (node, path) in &self.logs {
            let lines: Vec<String> = std::io::BufReader::new(File::open(path).expect("a log"))
                .lines()
                .map_while(Result::ok)
                .collect();
            for script in lines.split(|l| l == "C").filter(|s| !s.is_empty()) {
                let at = script[0]
                    .split(' ')
                    .next()
                    .and_then(|t| t.replace('.', "").parse::<u64>().ok())
                    .unwrap_or(0);
                let mut group = vec![format!("N {node}")];
                group.extend(script.iter().cloned());
                groups.push((at, groups.len(), group));
            }
        }
        for (at, node, entries) in &self.moves {
            groups.push((
                *at,
                groups.len(),
                vec![format!("M {node} {}", entries.join(" "))],
            ));
        }
        groups.sort_by_key(|(at, n, _)| (*at, *n));
        let mut merged = Vec::new();
        for (_, _, group) in groups {
            merged.extend(group);
            merged.push("C".to_string());
        }
        merged
    }
}

/// The short cluster run of `cargo test --test chaos` (200 rounds, seed 25: about half a
/// minute), left out when `STAMPEDE_CHAOS_CLUSTER=1` makes `chaos_run` the cluster run itself.
pub fn short_cluster_run() {
    if std::env::var("STAMPEDE_CHAOS_CLUSTER").is_ok_and(|v| v == "1") {
        println!("chaos: the cluster run is chaos_run's (STAMPEDE_CHAOS_CLUSTER=1)");
        return;
    }
    cluster_run(200, 25);
}

/// Runs the cluster schedule: `rounds` rounds from `seed`, then the checker; panics on a
/// violation (the documented kinds of a failover are counted, not failures).
pub fn cluster_run(rounds: u64, seed: u64) {
    if crate::waits_for_replicas() {
        println!("chaos cluster: lock and fencing writes wait for a replica (WAIT 1, 250 ms)");
    }
    let began = Instant::now();
    let tmp = tempfile::tempdir().expect("a temp dir for the history");
    let dir = tmp.path().to_path_buf();
    let mut nodes = Nodes::start(&dir);
    let sink = RedisServer::start();
    let seeds = nodes.cluster.urls().join(",");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = Controller::on_cluster(&dir, seeds, sink.url(), seed);
    let mut fault_log = BufWriter::new(File::create(dir.join("faults.log")).expect("faults.log"));
    let mut failovers = Vec::new();
    let mut open: Option<Open> = None;
    // The next cluster fault waits for this: a settled cluster, and a moment of load.
    let mut calm_from = Instant::now();
    for _ in 0..rounds {
        std::thread::sleep(Duration::from_millis(rng.random_range(20..100)));
        let now = Instant::now();
        c.end_worker_faults(now);
        if let Some(o) = open.take() {
            open = nodes.advance(o, now, &mut failovers, &mut fault_log);
            if open.is_none() {
                calm_from = now + Duration::from_millis(rng.random_range(200..1000));
            }
        }
        let counted = c.faults.clone();
        let dice = rng.random_range(0..100);
        let target = match dice {
            0..4 => c.kill_worker(now, &mut rng),
            4..9 => c.stop_worker(now, &mut rng),
            20..33 if open.is_none() && now >= calm_from && nodes.cluster.is_settled() => {
                let (o, target) = nodes.cluster_fault(dice, &mut rng, &mut c.faults);
                open = o;
                target
            }
            _ => String::new(),
        };
        if let Some((kind, _)) = c.faults.iter().find(|(k, n)| counted.get(*k) != Some(*n)) {
            let _ = writeln!(fault_log, "{} {kind} {target}", now_us());
        }
    }
    // Wind down: the fault in progress ends, the cluster settles, the workers stop.
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    while let Some(o) = open.take() {
        assert!(Instant::now() < deadline, "the cluster did not settle");
        std::thread::sleep(Duration::from_millis(50));
        open = nodes.advance(o, Instant::now(), &mut failovers, &mut fault_log);
    }
    let _ = fault_log.flush();
    c.stop_workers();
    let h = nodes.history(&mut c, &sink, failovers);
    report(&c, &h, rounds, seed, began.elapsed());
    let violations = check(&h);
    if !violations.is_empty() {
        let all: String = violations.iter().map(|v| format!("{v}\n")).collect();
        let _ = std::fs::write(dir.join("violations.log"), all);
        println!("chaos: history kept in {}", tmp.keep().display());
    }
    assert!(violations.is_empty(), "{} violations", violations.len());
    assert_did_something(&c, &h, rounds);
}

impl Nodes {
    /// Starts cluster fault `dice` (20..33), returning it (if it began) and its target.
    fn cluster_fault(
        &mut self,
        dice: u32,
        rng: &mut StdRng,
        faults: &mut BTreeMap<&'static str, u64>,
    ) -> (Option<Open>, String) {
        let Some(view) = self.view(None) else {
            return (None, String::new());
        };
        let masters: Vec<&NodeView> = view.iter().filter(|n| n.master).collect();
        let replicas: Vec<&NodeView> = view.iter().filter(|n| !n.master).collect();
        let (kind, fault, master, target) = match dice {
            20..25 => {
                let replica = replicas[rng.random_range(0..replicas.len())];
                let Some((kind, fault, master)) = self.ask_failover(replica, &masters, dice >= 23)
                else {
                    return (None, String::new());
                };
                (kind, fault, master, format!("to node {}", replica.index))
            }
            25..27 => {
                let master = masters[rng.random_range(0..masters.len())];
                self.cluster.nodes[master.index].kill();
                self.unwatch(master.index);
                let restart_at = Instant::now() + ms(rng.random_range(KILLED_MS));
                let fault = Fault::Killed {
                    node: master.index,
                    restart_at,
                };
                (
                    "master_kill",
                    fault,
                    master,
                    format!("node {}", master.index),
                )
            }
            27..29 => {
                let master = masters[rng.random_range(0..masters.len())];
                let Some(pid) = self.cluster.nodes[master.index].pid() else {
                    return (None, String::new());
                };
                signal(pid, "STOP");
                let resume_at = Instant::now() + ms(rng.random_range(PAUSED_MS));
                let fault = Fault::Paused {
                    node: master.index,
                    resume_at,
                };
                (
                    "master_pause",
                    fault,
                    master,
                    format!("node {}", master.index),
                )
            }
            _ => {
                let target = self.migrate(&masters, rng);
                if !target.is_empty() {
                    *faults.entry("migrate").or_default() += 1;
                }
                return (None, target);
            }
        };
        *faults.entry("failover").or_default() += 1;
        *faults.entry(kind).or_default() += 1;
        let window = FailoverWindow {
            from_us: now_us(),
            to_us: u64::MAX,
            kind: kind.to_string(),
            tags: self.tags_of(master),
        };
        (Some(Open { fault, window }), target)
    }

    /// Sends `CLUSTER FAILOVER` (`FORCE`) to `replica`: the fault's kind and state, and the
    /// master it replaces, if the replica took the request.
    fn ask_failover<'v>(
        &self,
        replica: &NodeView,
        masters: &[&'v NodeView],
        force: bool,
    ) -> Option<(&'static str, Fault, &'v NodeView)> {
        let master = masters
            .iter()
            .find(|m| replica.master_id.as_deref() == Some(m.id.as_str()))?;
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        if force {
            cmd.arg("FORCE");
        }
        let mut conn = self
            .cluster
            .node_conn(replica.index, Duration::from_secs(2))?;
        cmd.query::<()>(&mut conn).ok()?;
        let kind = if force {
            "cluster_failover_force"
        } else {
            "cluster_failover"
        };
        let fault = Fault::Asked {
            replica: replica.index,
            until: Instant::now() + Duration::from_secs(5),
        };
        Some((kind, fault, master))
    }

    /// Moves the slot of a hot key from its master to another one, under load. Returns what
    /// moved where, or nothing if it could not begin.
    fn migrate(&mut self, masters: &[&NodeView], rng: &mut StdRng) -> String {
        let tag = MOVED_TAGS[rng.random_range(0..MOVED_TAGS.len())];
        let slot = self.slots[tag];
        let Some(source) = masters
            .iter()
            .find(|m| m.slots.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)))
        else {
            return String::new();
        };
        let others: Vec<&&NodeView> = masters.iter().filter(|m| m.id != source.id).collect();
        let dest = others[rng.random_range(0..others.len())];
        let timeout = Duration::from_secs(5);
        let (Some(mut src), Some(mut dst)) = (
            self.cluster.node_conn(source.index, timeout),
            self.cluster.node_conn(dest.index, timeout),
        ) else {
            return String::new();
        };
        let setslot = |conn: &mut redis::Connection, how: &str, id: &str| {
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(how)
                .arg(id)
                .query::<()>(conn)
        };
        if setslot(&mut dst, "IMPORTING", &source.id).is_err() {
            return String::new();
        }
        if setslot(&mut src, "MIGRATING", &dest.id).is_err() {
            let _ = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("STABLE")
                .query::<()>(&mut dst);
            return String::new();
        }
        // Marked before any key moves: a script of these entries on the destination from now
        // on found the counter the migration carried.
        let entries: Vec<String> = MOVED_TAGS
            .iter()
            .filter(|t| self.slots[**t] == slot)
            .map(|t| t.to_string())
            .collect();
        self.moves.push((now_us(), dest.index, entries.clone()));
        let port = self.cluster.nodes[dest.index].port();
        let moved = move_keys(&mut src, slot, port);
        // The slot is the destination's from now on, whatever moved: a key left behind would
        // be lost, which the checker would then find.
        for conn in [&mut dst, &mut src] {
            let _ = setslot(conn, "NODE", &dest.id);
        }
        for m in masters
            .iter()
            .filter(|m| m.id != source.id && m.id != dest.id)
        {
            if let Some(mut conn) = self.cluster.node_conn(m.index, timeout) {
                let _ = setslot(&mut conn, "NODE", &dest.id);
            }
        }
        format!(
            "slot {slot} ({}) from node {} to node {}: {moved} keys",
            entries.join(" "),
            source.index,
            dest.index
        )
    }

    /// Moves an open fault on: restarts a killed master, continues a stopped one, and closes
    /// the fault's window once the cluster has settled.
    fn advance(
        &mut self,
        mut o: Open,
        now: Instant,
        failovers: &mut Vec<FailoverWindow>,
        log: &mut impl std::io::Write,
    ) -> Option<Open> {
        match o.fault {
            Fault::Killed { node, restart_at } if restart_at <= now => {
                self.cluster.nodes[node].restart();
                self.watch(node);
                let _ = writeln!(log, "{} master_restarted node {node}", now_us());
                o.fault = Fault::Failover;
            }
            Fault::Paused { node, resume_at } if resume_at <= now => {
                if let Some(pid) = self.cluster.nodes[node].pid() {
                    signal(pid, "CONT");
                }
                let _ = writeln!(log, "{} master_resumed node {node}", now_us());
                o.fault = Fault::Failover;
            }
            Fault::Asked { replica, until } => {
                let promoted = self
                    .cluster
                    .view(replica)
                    .and_then(|v| v.into_iter().find(|n| n.index == replica))
                    .is_some_and(|n| n.master);
                if promoted || until <= now {
                    o.fault = Fault::Failover;
                }
            }
            Fault::Failover if self.cluster.is_settled() => {
                self.probe_counters();
                o.window.to_us = now_us();
                let _ = writeln!(log, "{} settled {}", now_us(), o.window.kind);
                failovers.push(o.window);
                return None;
            }
            _ => {}
        }
        Some(o)
    }

    /// Reads every hot entry's fencing counter inside its master, in a script that prints it
    /// to MONITOR (`ECHO "probe <key> <value>"`): the replay's proof of the counter a new
    /// master went on from, for the entries no cache write follows (the locks, the leader).
    fn probe_counters(&self) {
        let Some(view) = self.view(None) else {
            return;
        };
        for tag in MOVED_TAGS {
            let slot = self.slots[tag];
            let master = view
                .iter()
                .find(|n| n.master && n.slots.iter().any(|(lo, hi)| (lo..=hi).contains(&&slot)));
            let conn = master.and_then(|m| self.cluster.node_conn(m.index, ms(2000)));
            if let Some(mut conn) = conn {
                let _: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
                    .arg(PROBE)
                    .arg(1)
                    .arg(format!("{NAMESPACE}:{{{tag}}}_fence"))
                    .query(&mut conn);
            }
        }
    }

    /// The history of the run: the workers' logs, the merged server log replayed, the lock
    /// keys left on the masters after the run and one lease later.
    fn history(
        &mut self,
        c: &mut Controller,
        sink: &RedisServer,
        failovers: Vec<FailoverWindow>,
    ) -> History {
        // On the masters only: a replica holds copies (and answers a key's PTTL with MOVED).
        let lock_keys = |nodes: &Nodes| -> Vec<(String, i64)> {
            let view = nodes.view(None).expect("a node answers after the run");
            let mut found = Vec::new();
            for master in view.iter().filter(|n| n.master) {
                let timeout = Duration::from_secs(5);
                let mut conn = nodes
                    .cluster
                    .node_conn(master.index, timeout)
                    .expect("a master answers after the run");
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{NAMESPACE}:*_lock"))
                    .query(&mut conn)
                    .expect("KEYS");
                for key in keys {
                    let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).expect("PTTL");
                    if pttl != -2 {
                        found.push((key, pttl));
                    }
                }
            }
            found
        };
        let locks_after_run = lock_keys(self);
        std::thread::sleep(LEASE + Duration::from_millis(50));
        let locks_after_lease = lock_keys(self).into_iter().map(|(k, _)| k).collect();
        for i in 0..self.cluster.nodes.len() {
            self.unwatch(i);
        }
        let mut h = History {
            pauses: c.pauses.clone(),
            endings: c.endings.clone(),
            locks_after_run,
            locks_after_lease,
            lease_ms: LEASE.as_millis() as u64,
            call_bound_us: CALL_BOUND.as_micros() as u64,
            failovers,
            ..History::default()
        };
        let (events, changes) = replay::replay(NAMESPACE, 0, &self.merged());
        h.server = events;
        h.changes = changes;
        let sink_log: Vec<String> = redis::cmd("LRANGE")
            .arg("sinklog")
            .arg(0)
            .arg(-1)
            .query(&mut sink.conn())
            .expect("the sink's log");
        let mut sink_results: BTreeMap<(String, u64), (u32, u32)> = BTreeMap::new();
        for line in &sink_log {
            let f: Vec<&str> = line.split(' ').collect();
            let entry = sink_results
                .entry((f[0].to_string(), f[1].parse().expect("section id")))
                .or_default();
            entry.0 += 1;
            entry.1 += u32::from(f[4] == "1");
        }
        let mut near_stats = [0u64; 6];
        for instance in &c.instances {
            read_worker_log(&c.dir, instance, &sink_results, &mut h, &mut near_stats);
        }
        h
    }
}

/// Moves every key of `slot` from the source (`src`) to the node on `port`, a hundred at a
/// time, until none is left; returns how many moved.
fn move_keys(src: &mut redis::Connection, slot: u16, port: u16) -> usize {
    let mut moved = 0;
    for _ in 0..50 {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(src)
            .unwrap_or_default();
        if keys.is_empty() {
            break;
        }
        let sent: redis::RedisResult<redis::Value> = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(src);
        if sent.is_ok() {
            moved += keys.len();
        }
    }
    moved
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Controller {
    /// The workers' controller on a cluster (`seeds`: its nodes' URLs, comma-separated, in the
    /// place of the proxies' URL), its workers started.
    fn on_cluster(dir: &Path, seeds: String, sink_url: String, seed: u64) -> Self {
        let mut c = Controller {
            dir: dir.to_path_buf(),
            proxy_urls: [seeds.clone(), seeds],
            sink_url,
            seed,
            slots: crate::new_slots(WORKERS),
            faults: BTreeMap::new(),
            pauses: Vec::new(),
            endings: Vec::new(),
            restarts_us: Vec::new(),
            instances: Vec::new(),
        };
        for i in 0..WORKERS {
            c.spawn(i);
        }
        c
    }

    /// Ends the worker faults that are due: pauses resumed, killed workers started again.
    fn end_worker_faults(&mut self, now: Instant) {
        for i in 0..WORKERS {
            if self.slots[i].resume_at.is_some_and(|t| t <= now) {
                self.resume(i);
            }
            if self.slots[i].respawn_at.is_some_and(|t| t <= now) {
                self.slots[i].respawn_at = None;
                self.spawn(i);
            }
        }
    }

    /// SIGKILLs a running worker (if three or more run); it is started again later.
    fn kill_worker(&mut self, now: Instant, rng: &mut StdRng) -> String {
        let running = self.running();
        if running.len() < 3 {
            return String::new();
        }
        let i = running[rng.random_range(0..running.len())];
        let mut w = self.slots[i].worker.take().expect("a running worker");
        signal(w.pid(), "KILL");
        let _ = w.child.wait();
        let instance = self.slots[i].instance.clone();
        self.endings.push(Ending {
            instance: instance.clone(),
            killed: true,
            clean_exit: false,
            in_flight: None,
        });
        self.slots[i].respawn_at = Some(now + ms(rng.random_range(50..400)));
        *self.faults.entry("kill").or_default() += 1;
        instance
    }

    /// SIGSTOPs a running worker for longer than the lease (at most two paused at once).
    fn stop_worker(&mut self, now: Instant, rng: &mut StdRng) -> String {
        let running = self.running();
        if running.len() < 2 || WORKERS - running.len() >= 2 {
            return String::new();
        }
        let i = running[rng.random_range(0..running.len())];
        let slot = &mut self.slots[i];
        let w = slot.worker.as_ref().expect("a running worker");
        signal(w.pid(), "STOP");
        slot.paused_since = Some((now_us(), now));
        let span = LEASE.mul_f64(rng.random_range(1.25..3.0));
        slot.resume_at = Some(now + span);
        *self.faults.entry("stop").or_default() += 1;
        format!("{} for {span:?}", slot.instance)
    }
}

/// The run's figures: rounds, faults by kind, calls by outcome, the server's decisions, the
/// documented kinds of a failover (counted), and the violations.
fn report(c: &Controller, h: &History, rounds: u64, seed: u64, took: Duration) {
    let calls_done: Vec<&Call> = h.calls.iter().filter(|c| c.end_us.is_some()).collect();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for call in &calls_done {
        let kind = match &call.outcome {
            Outcome::Value(_) | Outcome::Done | Outcome::Queued => format!("{} ok", call.op),
            Outcome::Error(kind) => format!("{} {kind}", call.op),
            Outcome::Pending => "pending".into(),
        };
        *outcomes.entry(kind).or_default() += 1;
    }
    let count = |f: fn(&ServerEvent) -> bool| h.server.iter().filter(|e| f(e)).count();
    let accepted = count(|e| matches!(e, ServerEvent::Write(w) if w.computed));
    let acquisitions = count(|e| matches!(e, ServerEvent::Acquire { .. }));
    let sections_ok = h
        .sections
        .iter()
        .filter(|s| s.writes > 0 && s.accepted == s.writes)
        .count();
    let refused = h.sections.iter().filter(|s| s.accepted < s.writes).count();
    let fault_total: u64 = c
        .faults
        .iter()
        .filter(|(k, _)| ["kill", "stop", "failover", "migrate"].contains(k))
        .map(|(_, n)| n)
        .sum();
    let documented = documented(h);
    println!("chaos: cluster (3 masters, 3 replicas, node timeout {NODE_TIMEOUT_MS} ms): seed {seed}, {rounds} rounds in {took:.0?}");
    println!("chaos: faults injected {fault_total}: {:?}", c.faults);
    println!(
        "chaos: calls completed {} ({outcomes:?}); worker processes {} ({} killed)",
        calls_done.len(),
        c.instances.len(),
        c.endings.iter().filter(|e| e.killed).count()
    );
    println!(
        "chaos: server: {acquisitions} lock acquisitions, {accepted} computed values accepted; \
         {}; lock/leader sections: {} ({sections_ok} accepted by the fenced sink, {refused} \
         refused)",
        failover_figures(h),
        h.sections.len()
    );
    println!(
        "chaos: documented kinds {}: {:?}",
        documented.len(),
        documented_kinds(&documented)
    );
    for d in documented.iter().take(20) {
        println!("  {d}");
    }
    let violations = check(h);
    println!("chaos: violations {}", violations.len());
    for v in violations.iter().take(50) {
        println!("  {v}");
    }
}

/// What the failovers did to the entries' counters, as the replay proved it.
fn failover_figures(h: &History) -> String {
    let rollbacks: Vec<_> = h
        .server
        .iter()
        .filter_map(|e| match e {
            ServerEvent::Rollback(r) => Some(r),
            _ => None,
        })
        .collect();
    let proven = rollbacks.iter().filter(|r| r.to.is_some()).count();
    let reseeded = rollbacks.iter().filter(|r| r.reseeded).count();
    let raised = rollbacks.iter().filter(|r| r.raised).count();
    // The bumps lost with an old master, by what made them, and the lost acquisitions whose
    // token the new master handed out again.
    let mut lost: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, what) in rollbacks.iter().flat_map(|r| &r.lost) {
        *lost.entry(what).or_default() += 1;
    }
    // Handed out again: by an acquisition after the switch (the lost one itself came before).
    let switched_at = |r: &Rollback| {
        h.server
            .iter()
            .position(|e| matches!(e, ServerEvent::Rollback(x) if std::ptr::eq(x, r)))
            .unwrap_or(0)
    };
    let reissued = rollbacks
        .iter()
        .flat_map(|r| r.lost.iter().map(move |(token, what)| (r, *token, *what)))
        .filter(|(r, token, what)| {
            *what == "acquisition"
                && h.server[switched_at(r)..].iter().any(|e| {
                    matches!(e, ServerEvent::Acquire { key, token: t } if *key == r.key && t == token)
                })
        })
        .count();
    format!(
        "entries switched to another node by a failover {} ({proven} proven from the new \
         master's first write or the controller's probe, {reseeded} found their counter gone \
         and reseeded, {raised} raised to the new master's clock at its first bump, {} \
         unproven), bumps lost with an old master {lost:?} ({reissued} lost \
         acquisitions whose token was handed out again)",
        rollbacks.len(),
        rollbacks.len() - proven - reseeded - raised,
    )
}

/// The run must have done something worth checking.
fn assert_did_something(c: &Controller, h: &History, rounds: u64) {
    let calls_done = h.calls.iter().filter(|c| c.end_us.is_some()).count();
    assert!(calls_done as u64 >= rounds, "too few calls completed");
    let accepted = h
        .server
        .iter()
        .any(|e| matches!(e, ServerEvent::Write(w) if w.computed));
    assert!(accepted && h.sections.iter().any(|s| s.accepted > 0));
    // A short run (the default test's) may draw no fault of some kind.
    if rounds >= 1000 {
        for kind in ["kill", "stop", "failover", "migrate"] {
            assert!(
                c.faults.get(kind).is_some_and(|n| *n > 0),
                "no {kind} injected"
            );
        }
    }
}
