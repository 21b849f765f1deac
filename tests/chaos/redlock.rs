//! The Redlock schedule (`STAMPEDE_CHAOS_REDLOCK=1`): five independent redis-servers without
//! persistence, worker processes whose critical sections run under `Redlock` locks and write
//! to the fenced sink, and a seeded schedule of worker kills, worker pauses (SIGSTOP) past the
//! lease, and node restarts that forget every lock the node held.
//!
//! A node restart kills the node and starts a new, empty one on the same port, either at once
//! (`STAMPEDE_CHAOS_RESTART_DELAY=0`) or after the node stayed down for a delay (`lease`, the
//! default, or a number of ms): the *delayed restarts* the Redis docs' Redlock page advises, so
//! that a node never rejoins while a lock it forgot can still be valid. Restarts come in bursts
//! of one to three nodes within one lease: one forgotten lock never hands a majority to a
//! second client (a holder takes the lock on every node it reaches), two or three can.
//!
//! Each holder writes `acq` and `held` lines to its history as `lock_loop` does in `main.rs`
//! (read back by the same `read_worker_log`), and in a second file the nodes it found holding
//! its lock right after the acquisition, and its failed acquisitions by kind. The checker is
//! `redlock_checker.rs`.
//!
//! `cargo test --test chaos chaos_redlock` runs a short version (300 rounds, delayed restarts);
//! `STAMPEDE_CHAOS_REDLOCK=1 STAMPEDE_CHAOS_RESTART_DELAY=0 STAMPEDE_CHAOS_ROUNDS=2000 cargo test
//! --release --test chaos chaos_run` a long one without delay (seed: `STAMPEDE_CHAOS_SEED`).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use stampede_guard::{CallOptions, Error, Lock, Redlock};

use crate::history::{Ending, History, Pause};
use crate::redlock_checker::{check, Granted, NodeRestart, RedlockHistory, SinkWrite, Verdict};
use crate::support::{now_us, runtime, signal, RedisServer, Worker};
use crate::{read_worker_log, resume_slot, running_slots, stop_slots, Log, Slot, NAMESPACE, SINK};

/// The worker role of this schedule.
pub const ROLE: &str = "chaos-redlock-worker";
/// Short, so that a burst of restarts falls within one holder's lease.
const LEASE: Duration = Duration::from_millis(300);
const WAIT_TIMEOUT: Duration = Duration::from_secs(3);
/// Above the default (1/20 of the lease, 15 ms): on a loaded 2-core machine a node busy for 15
/// ms is common, and the nodes the schedule does not touch should count as up.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const NODES: usize = 5;
const LOCKS: &[&str] = &["R0", "R1"];
const WORKERS: usize = 4;
/// Holder loops per worker process: two holders in one process contend like two processes.
/// The even one renews its lease (every lease / 3, the crate's default); the odd one takes it
/// once (`CallOptions::renew(false)`), Redlock as the Redis docs describe it, whose holder never
/// learns that its lock was lost before its validity runs out.
const HOLDERS: u64 = 2;
/// The share of steps (in %) that stall between their lease check and their write for longer
/// than the lease: the late writes the fenced sink must refuse.
const STALLS_PERCENT: u32 = 4;
/// At most this many nodes down or about to restart at once: three leave no majority for a
/// while (acquisitions fail with `NoQuorum`, holders lose their lease), four would only add
/// idle rounds.
const MAX_NODES_OUT: usize = 3;

/// The short run `cargo test --test chaos` includes.
pub const TESTS: &[(&str, fn())] = &[(
    "chaos_redlock_with_delayed_restarts_has_no_overlap",
    chaos_redlock_with_delayed_restarts_has_no_overlap,
)];

/// Whether `STAMPEDE_CHAOS_REDLOCK=1` selects this schedule for `chaos_run`.
pub fn selected() -> bool {
    std::env::var("STAMPEDE_CHAOS_REDLOCK").is_ok_and(|v| v == "1")
}

/// `STAMPEDE_CHAOS_RESTART_DELAY`: `lease` (the default), `0`, or a number of ms.
fn restart_delay() -> Duration {
    match std::env::var("STAMPEDE_CHAOS_RESTART_DELAY").as_deref() {
        Err(_) | Ok("lease") => LEASE,
        Ok(ms) => Duration::from_millis(
            ms.parse()
                .expect("STAMPEDE_CHAOS_RESTART_DELAY is `lease` or a number of ms"),
        ),
    }
}

/// `chaos_run` under `STAMPEDE_CHAOS_REDLOCK=1`: rounds and seed as the main schedule reads them.
pub fn chaos_run() {
    let var = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
            .unwrap_or(default)
    };
    let rounds = var("STAMPEDE_CHAOS_ROUNDS", 400);
    let outcome = run(rounds, var("STAMPEDE_CHAOS_SEED", 7), restart_delay());
    outcome.assert_sound(rounds);
}

/// The default run's Redlock part: delayed restarts promise no overlap, so any is a failure.
fn chaos_redlock_with_delayed_restarts_has_no_overlap() {
    let outcome = run(300, 11, LEASE);
    outcome.assert_sound(300);
    let overlaps = &outcome.verdict.overlaps;
    assert!(overlaps.is_empty(), "{overlaps:?}");
}

/// What a run found, and what it did.
struct Outcome {
    verdict: Verdict,
    faults: BTreeMap<String, u64>,
    /// Sections that wrote to the sink.
    sections: usize,
}

impl Outcome {
    /// No violation, and the run did something worth checking: sections written, and (in a
    /// run of 200 rounds or more) every kind of fault, bursts of two and three restarts too.
    fn assert_sound(&self, rounds: u64) {
        let violations = &self.verdict.violations;
        assert!(violations.is_empty(), "{} violations", violations.len());
        assert!(self.sections > 0, "no section wrote to the sink");
        if rounds >= 200 {
            for kind in ["kill", "stop", "restart_burst_of_2", "restart_burst_of_3"] {
                assert!(self.faults.get(kind).is_some_and(|n| *n > 0), "no {kind}");
            }
        }
    }
}

// =============================================================================================
// The controller.

/// The five nodes, and what the schedule has planned for them.
struct Nodes {
    servers: Vec<RedisServer>,
    /// Restarts and comebacks due: (when, node, comes back up).
    due: Vec<(Instant, usize, bool)>,
    /// Per node: the index in `restarts` of its restart while it is down.
    down: Vec<Option<usize>>,
    restarts: Vec<NodeRestart>,
    delay: Duration,
}

impl Nodes {
    fn start(delay: Duration) -> Self {
        let servers = std::thread::scope(|s| {
            let starting: Vec<_> = (0..NODES).map(|_| s.spawn(RedisServer::start)).collect();
            starting
                .into_iter()
                .map(|h| h.join().expect("a node"))
                .collect()
        });
        Nodes {
            servers,
            due: Vec::new(),
            down: vec![None; NODES],
            restarts: Vec::new(),
            delay,
        }
    }

    /// Nodes neither down nor due to restart.
    fn idle(&self) -> Vec<usize> {
        (0..NODES)
            .filter(|n| self.down[*n].is_none() && !self.due.iter().any(|d| d.1 == *n))
            .collect()
    }

    /// Plans a burst: `size` idle nodes, the first now, the others within one lease.
    fn plan_burst(&mut self, rng: &mut StdRng, size: usize, now: Instant) -> usize {
        let mut idle = self.idle();
        let size = size.min(MAX_NODES_OUT.saturating_sub(NODES - idle.len()));
        for k in 0..size {
            let node = idle.swap_remove(rng.random_range(0..idle.len()));
            let offset = if k == 0 {
                Duration::ZERO
            } else {
                LEASE.mul_f64(rng.random_range(0.0..1.0))
            };
            self.due.push((now + offset, node, false));
        }
        size
    }

    /// Carries out what is due (all of it when `all`); returns the restarts begun.
    fn tick(&mut self, now: Instant, all: bool) -> usize {
        let (ready, later): (Vec<_>, Vec<_>) = self.due.drain(..).partition(|d| all || d.0 <= now);
        self.due = later;
        let mut begun = 0;
        for (_, node, up) in ready {
            if up {
                self.servers[node].restart();
                if let Some(i) = self.down[node].take() {
                    self.restarts[i].up_us = now_us();
                }
                continue;
            }
            begun += 1;
            let down_us = now_us();
            self.restarts.push(NodeRestart {
                node,
                down_us,
                up_us: down_us,
            });
            if self.delay.is_zero() {
                self.servers[node].restart();
                self.restarts.last_mut().expect("just pushed").up_us = now_us();
            } else {
                self.servers[node].kill();
                self.down[node] = Some(self.restarts.len() - 1);
                self.due.push((Instant::now() + self.delay, node, true));
            }
        }
        begun
    }

    fn next_due(&self) -> Option<Instant> {
        self.due.iter().map(|d| d.0).min()
    }
}

/// The worker processes, as `main.rs`'s controller keeps them.
struct Workers {
    dir: PathBuf,
    node_urls: String,
    sink_url: String,
    seed: u64,
    slots: Vec<Slot>,
    pauses: Vec<Pause>,
    endings: Vec<Ending>,
    instances: Vec<String>,
}

impl Workers {
    fn spawn(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.generation += 1;
        slot.instance = format!("w{i}.{}", slot.generation);
        self.instances.push(slot.instance.clone());
        let seed = self.seed * 1000 + i as u64 * 100 + u64::from(slot.generation);
        slot.worker = Some(Worker::spawn(
            ROLE,
            &[
                ("CHAOS_NODES", self.node_urls.clone()),
                ("CHAOS_SINK", self.sink_url.clone()),
                ("CHAOS_DIR", self.dir.display().to_string()),
                ("CHAOS_INSTANCE", slot.instance.clone()),
                ("CHAOS_SEED", seed.to_string()),
            ],
        ));
    }

    fn resume(&mut self, i: usize) {
        resume_slot(&mut self.slots[i], &mut self.pauses);
    }

    fn running(&self) -> Vec<usize> {
        running_slots(&self.slots)
    }

    /// Resumes and respawns what is due.
    fn tick(&mut self, now: Instant) {
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

    /// SIGKILLs a running worker (respawned 50–400 ms later).
    fn kill(&mut self, rng: &mut StdRng, now: Instant) {
        let running = self.running();
        let i = running[rng.random_range(0..running.len())];
        let mut w = self.slots[i].worker.take().expect("a running worker");
        signal(w.pid(), "KILL");
        let _ = w.child.wait();
        self.endings.push(Ending {
            instance: self.slots[i].instance.clone(),
            killed: true,
            clean_exit: false,
            in_flight: None,
        });
        self.slots[i].respawn_at = Some(now + Duration::from_millis(rng.random_range(50..400)));
    }

    /// SIGSTOPs a running worker for 1.25 to 3 leases.
    fn pause(&mut self, rng: &mut StdRng, now: Instant) {
        let running = self.running();
        let slot = &mut self.slots[running[rng.random_range(0..running.len())]];
        signal(
            slot.worker.as_ref().expect("a running worker").pid(),
            "STOP",
        );
        slot.paused_since = Some((now_us(), now));
        slot.resume_at = Some(now + LEASE.mul_f64(rng.random_range(1.25..3.0)));
    }

    /// Asks every worker to stop and records how each ended.
    fn stop_all(&mut self) {
        stop_slots(
            &self.dir,
            &mut self.slots,
            &mut self.pauses,
            &mut self.endings,
        );
    }
}

/// Runs the schedule for `rounds`, checks the history, prints the report and returns what it
/// found.
fn run(rounds: u64, seed: u64, delay: Duration) -> Outcome {
    let began = Instant::now();
    let tmp = tempfile::tempdir().expect("a temp dir for the history");
    let dir = tmp.path().to_path_buf();
    let mut nodes = Nodes::start(delay);
    let sink = RedisServer::start();
    let mut w = Workers {
        dir: dir.clone(),
        node_urls: nodes
            .servers
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(","),
        sink_url: sink.url(),
        seed,
        slots: crate::new_slots(WORKERS),
        pauses: Vec::new(),
        endings: Vec::new(),
        instances: Vec::new(),
    };
    for i in 0..WORKERS {
        w.spawn(i);
    }
    let faults = drive(rounds, seed, &mut nodes, &mut w);
    w.stop_all();
    // Wind down: no new restart, every node back, then one lease for the locks of killed
    // holders to expire.
    nodes.due.retain(|d| d.2);
    nodes.tick(Instant::now(), true);
    std::thread::sleep(LEASE + Duration::from_millis(50));
    let mut r = RedlockHistory {
        delayed: delay >= LEASE,
        ..RedlockHistory::default()
    };
    r.history.lease_ms = LEASE.as_millis() as u64;
    for (n, server) in nodes.servers.iter().enumerate() {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{NAMESPACE}:*_lock"))
            .query(&mut server.conn())
            .expect("KEYS");
        r.history
            .locks_after_lease
            .extend(keys.into_iter().map(|k| format!("{k} on node {n}")));
    }
    read_history(&dir, &sink, &mut w, &mut r);
    r.restarts = std::mem::take(&mut nodes.restarts);
    let verdict = check(&r);
    report(&r, &verdict, &faults, (seed, rounds, delay, began));
    if !verdict.violations.is_empty() {
        // Kept with the history, as evidence.
        let restarts: String = r.restarts.iter().map(|k| format!("{k:?}\n")).collect();
        let _ = std::fs::write(dir.join("restarts.log"), restarts);
        let all: String = verdict
            .violations
            .iter()
            .map(|v| format!("{v}\n"))
            .collect();
        let _ = std::fs::write(dir.join("violations.log"), all);
        println!("chaos redlock: history kept in {}", tmp.keep().display());
    }
    let sections = r.history.sections.iter().filter(|s| s.writes > 0).count();
    Outcome {
        verdict,
        faults,
        sections,
    }
}

/// The rounds: a pause of 20–100 ms (cut short by a node restart or comeback that falls due),
/// then at most one new fault. Returns the faults injected, by kind.
fn drive(rounds: u64, seed: u64, nodes: &mut Nodes, w: &mut Workers) -> BTreeMap<String, u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for _round in 0..rounds {
        let round_ends = Instant::now() + Duration::from_millis(rng.random_range(20..100));
        loop {
            let now = Instant::now();
            *faults.entry("node_restart".into()).or_default() += nodes.tick(now, false) as u64;
            if now >= round_ends {
                break;
            }
            let next = nodes.next_due().map_or(round_ends, |d| d.min(round_ends));
            std::thread::sleep(next.saturating_duration_since(now));
        }
        let now = Instant::now();
        w.tick(now);
        let running = w.running().len();
        let kind = match rng.random_range(0..100) {
            0..4 if running >= 3 => {
                w.kill(&mut rng, now);
                "kill".to_string()
            }
            4..9 if running >= 2 && WORKERS - running < 2 => {
                w.pause(&mut rng, now);
                "stop".to_string()
            }
            9..24 => {
                let size = match rng.random_range(0..10) {
                    0..2 => 1,
                    2..6 => 2,
                    _ => 3,
                };
                match nodes.plan_burst(&mut rng, size, now) {
                    0 => continue,
                    planned => format!("restart_burst_of_{planned}"),
                }
            }
            _ => continue,
        };
        *faults.entry(kind).or_default() += 1;
    }
    faults
}

/// Reads the sink's log and every worker's files into `r`.
fn read_history(
    dir: &std::path::Path,
    sink: &RedisServer,
    w: &mut Workers,
    r: &mut RedlockHistory,
) {
    let sink_log: Vec<String> = redis::cmd("LRANGE")
        .arg("sinklog")
        .arg(0)
        .arg(-1)
        .query(&mut sink.conn())
        .expect("the sink's log");
    let mut sink_results: BTreeMap<(String, u64), (u32, u32)> = BTreeMap::new();
    for line in &sink_log {
        let f: Vec<&str> = line.split(' ').collect();
        let write = SinkWrite {
            instance: f[0].to_string(),
            section: f[1].parse().expect("section id"),
            lock: f[2].to_string(),
            token: f[3].parse().expect("token"),
            accepted: f[4] == "1",
        };
        let entry = sink_results
            .entry((write.instance.clone(), write.section))
            .or_default();
        entry.0 += 1;
        entry.1 += u32::from(write.accepted);
        r.sink.push(write);
    }
    let mut h = History::default();
    let mut near_stats = [0u64; 6];
    for instance in &w.instances {
        read_worker_log(dir, instance, &sink_results, &mut h, &mut near_stats);
        let Ok(text) = std::fs::read_to_string(dir.join(format!("{instance}.redlock"))) else {
            continue;
        };
        // A line cut short by SIGKILL is skipped.
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in complete.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if let ["nodes", id, read_us, nodes, renewed] = f[..] {
                let granted = Granted {
                    read_us: read_us.parse().expect("a read time"),
                    nodes: nodes.split(',').filter_map(|n| n.parse().ok()).collect(),
                    renewed: renewed == "true",
                };
                let id = id.parse().expect("a section id");
                r.granted.insert((instance.clone(), id), granted);
            } else if let ["error", kind, ..] = f[..] {
                *r.errors.entry(kind.to_string()).or_default() += 1;
            }
        }
    }
    r.history.sections = h.sections;
    r.history.endings = std::mem::take(&mut w.endings);
    r.history.pauses = std::mem::take(&mut w.pauses);
}

/// The run's lines, as the README and the guide quote them.
fn report(
    r: &RedlockHistory,
    verdict: &Verdict,
    faults: &BTreeMap<String, u64>,
    (seed, rounds, delay, began): (u64, u64, Duration, Instant),
) {
    let h = &r.history;
    let with_writes = h.sections.iter().filter(|s| s.writes > 0).count();
    let refused = h.sections.iter().filter(|s| s.accepted < s.writes).count();
    let explained = verdict.overlaps.iter().filter(|o| o.node.is_some()).count();
    // How many nodes the earlier holder of each overlap may have held: 3 means one restart of
    // them was enough.
    let mut held_by_earlier: BTreeMap<usize, usize> = BTreeMap::new();
    for o in &verdict.overlaps {
        *held_by_earlier.entry(o.earlier_nodes.len()).or_default() += 1;
    }
    let renewed = verdict
        .overlaps
        .iter()
        .filter(|o| {
            r.granted
                .get(&(o.earlier.0.clone(), o.earlier.1))
                .is_some_and(|g| g.renewed)
        })
        .count();
    let f = verdict.fencing;
    println!(
        "chaos redlock: seed {seed}, {rounds} rounds in {:.0?}, {NODES} nodes, lease {LEASE:?}, \
         restart delay {delay:?}",
        began.elapsed()
    );
    println!(
        "chaos redlock: faults injected {}: {faults:?}; worker processes {} ({} killed)",
        faults
            .iter()
            .filter(|(k, _)| k.as_str() != "node_restart")
            .map(|(_, n)| n)
            .sum::<u64>(),
        r.history.endings.len(),
        h.endings.iter().filter(|e| e.killed).count()
    );
    println!(
        "chaos redlock: sections {} ({with_writes} wrote to the sink, {refused} with a write \
         refused); failed acquisitions {:?}",
        h.sections.len(),
        r.errors
    );
    println!(
        "chaos redlock: overlaps {} ({explained} explained by restarts: a node that granted the \
         earlier holder restarted during its section and granted the later one; {} unexplained; \
         {renewed} with an earlier holder that renewed its lease; by the number of nodes that may have \
         granted the earlier holder: {held_by_earlier:?})",
        verdict.overlaps.len(),
        verdict.overlaps.len() - explained
    );
    println!(
        "chaos redlock: fencing: {} sink writes, {} accepted, {} refused as stale ({} of them by \
         the earlier holder of an overlap, after the later holder's first write); stale tokens \
         accepted: {}",
        f.writes,
        f.accepted,
        f.refused,
        f.refused_in_overlaps,
        verdict
            .violations
            .iter()
            .filter(|v| v.detail.contains("the sink accepted"))
            .count()
    );
    for o in verdict.overlaps.iter().take(50) {
        println!("  {o}");
    }
    println!("chaos redlock: violations {}", verdict.violations.len());
    for v in verdict.violations.iter().take(50) {
        println!("  {v}");
    }
}

// =============================================================================================
// The worker.

/// What a worker's holder loops share.
struct Holders {
    /// Each lock name twice: renewing and not.
    locks: Vec<(&'static str, bool, Lock)>,
    log: Log,
    /// The nodes each section found holding its lock, and failed acquisitions.
    nodes_log: Log,
    nodes: Vec<redis::Client>,
    sink: redis::aio::MultiplexedConnection,
    instance: String,
    ids: AtomicU64,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// The worker process of this schedule: [`HOLDERS`] loops over the [`LOCKS`].
pub fn worker() -> Result<(), String> {
    let var = |name: &str| std::env::var(name).map_err(|e| format!("{name}: {e}"));
    let urls: Vec<String> = var("CHAOS_NODES")?.split(',').map(str::to_string).collect();
    let (sink_url, dir, instance) = (
        var("CHAOS_SINK")?,
        PathBuf::from(var("CHAOS_DIR")?),
        var("CHAOS_INSTANCE")?,
    );
    let seed: u64 = var("CHAOS_SEED")?.parse().map_err(|e| format!("{e}"))?;
    runtime().block_on(async move {
        let open = |suffix: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{instance}.{suffix}")))
                .map(|f| Log(Mutex::new(f)))
                .map_err(|e| e.to_string())
        };
        let mut locks = Vec::new();
        for (name, renew) in LOCKS.iter().flat_map(|n| [(*n, true), (*n, false)]) {
            let options = CallOptions::default()
                .lease(LEASE)
                .renew(renew)
                .wait_timeout(WAIT_TIMEOUT);
            let lock = Redlock::builder(name)
                .nodes(urls.iter().cloned())
                .namespace(NAMESPACE)
                .options(options)
                .node_timeout(NODE_TIMEOUT)
                .build()
                .await
                .map_err(|e| e.to_string())?;
            locks.push((name, renew, lock));
        }
        let nodes = urls
            .iter()
            .map(|u| redis::Client::open(u.as_str()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        // Room on a loaded machine, as in `main.rs`: the sink is the harness's own recorder.
        let sink_config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let sink = redis::Client::open(sink_url.as_str())
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection_with_config(&sink_config)
            .await
            .map_err(|e| format!("connecting to the sink: {e}"))?;
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let ctx = Arc::new(Holders {
            locks,
            log: open("log")?,
            nodes_log: open("redlock")?,
            nodes,
            sink,
            instance: instance.clone(),
            ids: AtomicU64::new(0),
            stop,
        });
        let stop_file = dir.join("stop");
        tokio::spawn(async move {
            while !stop_file.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stop_tx.send_replace(true);
        });
        let tasks: Vec<_> = (0..HOLDERS)
            .map(|n| tokio::spawn(holder_loop(Arc::clone(&ctx), seed * 10 + n, n % 2 == 0)))
            .collect();
        for task in tasks {
            task.await.map_err(|e| e.to_string())??;
        }
        Ok(())
    })
}

/// Critical sections under a Redlock: after the acquisition, which nodes hold it; then each
/// step checks the lease and writes to the sink, as `lock_loop` in `main.rs`.
async fn holder_loop(ctx: Arc<Holders>, seed: u64, renewing: bool) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let locks: Vec<_> = ctx
        .locks
        .iter()
        .filter(|(_, renew, _)| *renew == renewing)
        .collect();
    while !*ctx.stop.borrow() {
        let (name, renew, lock) = locks[rng.random_range(0..locks.len())];
        let id = ctx.ids.fetch_add(1, Ordering::SeqCst);
        let asked = now_us();
        match lock.acquire().await {
            Ok(guard) => {
                let token = guard.fencing_token();
                ctx.log
                    .event(format!("acq {id} {name} {token} {asked} {}", now_us()));
                let nodes = holding_nodes(&ctx.nodes, name).await;
                ctx.nodes_log
                    .event(format!("nodes {id} {} {nodes} {renew}", now_us()));
                // Up to six steps: a section spans several renewals, and often a burst.
                for _ in 0..rng.random_range(1..=6) {
                    // Read the clock first: the check that follows holds for that moment too.
                    let t0 = now_us();
                    if !guard.is_held() {
                        break;
                    }
                    ctx.log.event(format!("held {id} {t0}"));
                    if rng.random_range(0..100) < STALLS_PERCENT {
                        // A stall between the check and the write (Kleppmann's GC pause): the
                        // write arrives after the lease, and only its token can refuse it.
                        tokio::time::sleep(LEASE.mul_f64(rng.random_range(1.2..2.0))).await;
                    }
                    if sink_write(&ctx, id, name, token).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..150))).await;
                }
                let _ = guard.release().await;
            }
            Err(e) => {
                let kind = match e {
                    Error::NoQuorum { .. } => "NoQuorum",
                    ref other => crate::kind(other),
                };
                ctx.nodes_log
                    .event(format!("error {kind} {asked} {}", now_us()));
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..50))).await;
    }
    Ok(())
}

/// The nodes whose lock key holds the value most nodes hold (right after an acquisition: the
/// holder's own), joined by commas (`-` for none). Each node is asked on a connection of its
/// own, bounded by 100 ms: a node that is down or restarting is not counted.
async fn holding_nodes(nodes: &[redis::Client], name: &str) -> String {
    let key = format!("{NAMESPACE}:{{{name}}}_lock");
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(100)))
        .set_response_timeout(Some(Duration::from_millis(100)));
    let reads: Vec<_> = nodes
        .iter()
        .map(|client| {
            let (client, key, config) = (client.clone(), key.clone(), config.clone());
            tokio::spawn(async move {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .ok()?;
                redis::cmd("GET")
                    .arg(&key)
                    .query_async::<Option<String>>(&mut conn)
                    .await
                    .ok()
                    .flatten()
            })
        })
        .collect();
    let mut values = Vec::new();
    for read in reads {
        values.push(read.await.ok().flatten());
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in values.iter().flatten() {
        *counts.entry(v).or_default() += 1;
    }
    let Some((ours, _)) = counts.into_iter().max_by_key(|(_, n)| *n) else {
        return "-".into();
    };
    let held: Vec<String> = (0..values.len())
        .filter(|n| values[*n].as_deref() == Some(ours))
        .map(|n| n.to_string())
        .collect();
    held.join(",")
}

/// One write of a critical section to the fenced sink (the script `main.rs` defines).
async fn sink_write(ctx: &Holders, section: u64, lock: &str, token: u64) -> Result<(), String> {
    let mut conn = ctx.sink.clone();
    let script = redis::Script::new(SINK);
    let mut invocation = script.key(format!("max:{lock}"));
    invocation
        .key("sinklog")
        .arg(&ctx.instance)
        .arg(section)
        .arg(lock)
        .arg(token);
    let write = invocation.invoke_async::<i64>(&mut conn);
    match tokio::time::timeout(Duration::from_secs(5), write).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("sink write timed out".into()),
    }
}
