//! Fault injection with a history checker.
//!
//! A controller starts worker processes (this binary, re-executed) that loop over
//! `get_or_compute_with_lease`, `fetch_many` (batches of two or three keys, each computed under
//! its own lease and logged as a call of its own), `invalidate`, `set`, `invalidate_tag`,
//! `invalidate_tags` and `clear` (values tagged from three tags by their handle and their
//! computation), a `Lock` and a `Leader` on a few hot keys,
//! all through loopback TCP proxies (two: slots 0-1 and 2-3, so a proxy fault can partition one
//! side from the other) to one real redis-server. Driven by a seeded RNG, one *round*
//! at a time (a pause of 20–100 ms, then at most one new fault), it SIGKILLs workers (and starts
//! new ones), SIGSTOPs them for longer than the lease, restarts redis-server, freezes it
//! (SIGSTOP, an outage in which nothing answers, then SIGCONT), partitions the side of the
//! worker that serves while down (a black-hole of its proxy past its bound), cuts, delays or
//! black-holes the proxied connections, and puts the server under memory pressure (a low
//! `maxmemory` with an evicting policy, switched on and off with `CONFIG SET`, and filler data
//! so that it really evicts), and writes to the value keys as another program would (a raw `SET`
//! of foreign bytes, `DEL`, `UNLINK`, `PEXPIRE`, now and then a `FLUSHDB`), straight to the
//! server. The workers of even slots run a near tier (`max_staleness` 200 ms,
//! written first in their history), the others none; slot 2's also serves what it holds while
//! Redis is unreachable (`serve_while_down`, a bound of 300–1000 ms drawn per process), and
//! its calls record which values were served held. Every call, computation and critical
//! section goes into a history that the faults cannot corrupt (`history.rs`), which is then
//! checked (`checker.rs`, the rules; `replay.rs` reads the server's side back).
//!
//! `cargo test --test chaos` runs a short seeded version (400 rounds), and a short run of the
//! cluster schedule (200 rounds, `cluster.rs`);
//! `STAMPEDE_CHAOS_ROUNDS=10000 cargo test --release --test chaos` the long one;
//! `STAMPEDE_CHAOS_SEED=n` picks another fault schedule; `STAMPEDE_CHAOS_CLUSTER=1` makes
//! `chaos_run` run the cluster schedule instead, `STAMPEDE_CHAOS_REDLOCK=1` the Redlock schedule
//! (`redlock.rs`: five nodes restarted without persistence).

#[path = "../support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod clock;
    pub mod cluster;
    pub mod monitor_line;
    pub mod poll;
    pub mod process;
    pub mod proxy;
    pub mod runtime;
    pub mod server;
    pub mod signal;
    pub mod worker;
    pub use {
        clock::*, monitor_line::*, poll::*, process::*, runtime::*, server::*, signal::*, worker::*,
    };
}

mod checker;
mod cluster;
mod fences;
mod history;
mod redlock;
mod redlock_checker;
mod replay;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checker::check;
use history::{
    raised_by, tags_label, Call, Compute, Ending, Epoch, History, Outcome, Pause, Section,
    ServerEvent,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use stampede_guard::leader::{JobContext, Leader, Role};
use stampede_guard::{
    Cache, CallOptions, Computed, ConnectionOptions, Error, Lease, NearCacheOptions, Source,
};
use support::proxy::{Mode, Proxy};
use support::runtime;
use support::{now_us, signal, RedisServer, Worker};

const NAMESPACE: &str = "chaos";
const LEASE: Duration = Duration::from_millis(400);
const WAIT_TIMEOUT: Duration = Duration::from_secs(3);
const CACHE_KEYS: usize = 3;
/// The tags values may carry, over all the keys: a value gets up to two from its handle
/// (`CallOptions::tags`) and up to one from its computation (`Computed::tags`), so a handle
/// often reads a value with a tag it did not name (the second read of the epochs).
const TAGS: &[&str] = &["t0", "t1", "t2"];
const LOCKS: &[&str] = &["L0", "L1"];
const WORKERS: usize = 4;
/// The near tier's bound in the workers that run one (the even slots; the odd ones run none).
const NEAR_STALENESS: Duration = Duration::from_millis(200);
/// The slot whose near tier serves what it holds while Redis is unreachable
/// (`serve_while_down`), with a bound drawn per process from this range (ms): slot 0 keeps
/// rule (f)'s bound for every value, slot 2 gets rule (g)'s relaxed one for its held values.
const HELD_SLOT: usize = 2;
const HELD_BOUND_MS: std::ops::RangeInclusive<u64> = 300..=1000;
/// The response time-out of the worker that serves while down: a frozen server must fail its
/// calls (and open its breaker) within the outage, or nothing held would ever be served; the
/// default 5 s outlasts every freeze.
const HELD_RESPONSE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a freeze of redis-server (SIGSTOP, then SIGCONT) lasts, in ms: from shorter than
/// the shortest serve-while-down bound to longer than the longest plus `max_staleness`.
const FREEZE_MS: std::ops::Range<u64> = 200..1800;
/// The proxy side of [`HELD_SLOT`], and how long (ms) the partition fault black-holes it
/// (ended by a cut): past the longest serve-while-down bound plus `max_staleness`.
const HELD_SIDE: Side = Side::Second;
const HELD_PARTITION_MS: std::ops::Range<u64> = 500..2500;
/// The longest a call may take, pauses excluded: the wait bound, the longest computation, and a
/// few backend operations each bounded by the connection (2 s) and response (5 s) time-outs.
const CALL_BOUND: Duration = Duration::from_secs(3 + 1 + 4 * 7);

fn main() {
    let tests: Vec<(&str, fn())> = [
        checker::TESTS,
        replay::TESTS,
        redlock_checker::TESTS,
        redlock::TESTS,
    ]
    .concat()
    .into_iter()
    .chain([
        ("chaos_run_has_no_violation", chaos_run as fn()),
        (
            "chaos_cluster_run_has_no_violation",
            cluster::short_cluster_run as fn(),
        ),
    ])
    .collect();
    support::run_child_or_tests("chaos", &tests, worker);
}

// =============================================================================================
// The controller.

/// The fenced sink the lock holders write to: it takes a token only if it is at least the
/// highest it has taken for that lock, and logs every attempt. It lives on a second
/// redis-server that no fault touches.
const SINK: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local accepted = 0
if tonumber(ARGV[4]) >= max then
  redis.call('SET', KEYS[1], ARGV[4])
  accepted = 1
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. accepted)
return accepted
";

/// `MONITOR` on the cache server's own port (`RedisServer::monitor`), its lines kept in a file:
/// script commands and the outside writer's commands in full, other client commands as a
/// separator `C` (they mark where one script ends).
struct MonitorLog {
    socket: Option<support::MonitorSocket>,
    reader: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl MonitorLog {
    fn start(server: &RedisServer, path: PathBuf) -> Self {
        let (socket, monitored) = server.monitor();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let file = File::create(&path).expect("the monitor log");
        let reader = std::thread::spawn(move || {
            let mut out = BufWriter::new(file);
            // A client line since the last script: a script's commands follow its own
            // request's line directly.
            let mut client = false;
            for line in monitored {
                if line == "OK" {
                    let _ = ready_tx.send(());
                    continue;
                }
                if line.contains(" lua] ") || replay::is_outside_write(&line) {
                    if std::mem::take(&mut client) {
                        let _ = writeln!(out, "C");
                    }
                    let _ = writeln!(out, "{line}");
                } else {
                    client = true;
                }
            }
            if client {
                let _ = writeln!(out, "C");
            }
            let _ = out.flush();
        });
        ready
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR became active");
        MonitorLog {
            socket: Some(socket),
            reader: Some(reader),
            path,
        }
    }

    fn stop(mut self) -> PathBuf {
        // Shutting the socket ends the reader's lines.
        drop(self.socket.take());
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.path.clone()
    }
}

/// The policies the pressure fault picks from: each can evict our keys (all have TTLs).
const EVICTING_POLICIES: &[&str] = &[
    "allkeys-lru",
    "allkeys-random",
    "volatile-ttl",
    "volatile-lru",
];
/// Room above the memory in use when the fault starts; the filler overflows it every round.
const PRESSURE_HEADROOM: u64 = 128 * 1024;
/// Filler written per round while the fault lasts: 100 keys of 1 KiB, each living 3 s (so the
/// `volatile-*` policies may evict them too, and they clean up after themselves).
const FILLER_KEYS: u64 = 100;

/// The eviction-pressure fault, driven on the cache server's own port (not through the proxy).
#[derive(Default)]
struct Pressure {
    until: Option<Instant>,
    written: u64,
}

impl Pressure {
    fn start(&mut self, server: &RedisServer, policy: &str, until: Instant) {
        let mut conn = server.conn();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut conn)
            .expect("INFO memory");
        let used: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("used_memory in INFO");
        let _: () = redis::cmd(&support::admin("CONFIG"))
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .arg("maxmemory")
            .arg(used + PRESSURE_HEADROOM)
            .query(&mut conn)
            .expect("CONFIG SET maxmemory");
        self.until = Some(until);
        self.fill(&mut conn);
    }

    /// Ends the fault when due, and keeps filling while it lasts.
    fn tick(&mut self, server: &RedisServer, now: Instant) {
        match self.until {
            Some(until) if until <= now => self.stop(server),
            Some(_) => self.fill(&mut server.conn()),
            None => {}
        }
    }

    fn fill(&mut self, conn: &mut redis::Connection) {
        let junk = vec![b'f'; 1024];
        let mut pipe = redis::pipe();
        for _ in 0..FILLER_KEYS {
            pipe.cmd("SET")
                .arg(format!("filler:{}", self.written))
                .arg(&junk)
                .arg("PX")
                .arg(3000)
                .ignore();
            self.written += 1;
        }
        // Refused writes (OOM while eviction catches up) are part of the fault.
        let _: redis::RedisResult<()> = pipe.query(conn);
    }

    fn stop(&mut self, server: &RedisServer) {
        if self.until.take().is_some() {
            let _: () = redis::cmd(&support::admin("CONFIG"))
                .arg("SET")
                .arg("maxmemory")
                .arg(0)
                .arg("maxmemory-policy")
                .arg("noeviction")
                .query(&mut server.conn())
                .expect("CONFIG SET maxmemory 0");
        }
    }
}

/// An outage of the cache's server, the hardest kind: redis-server frozen by SIGSTOP (its
/// connections stay open, nothing answers, no RST) until SIGCONT. Every worker sees it, through
/// either proxy; the one that serves while down keeps calling and is answered from its copies.
#[derive(Default)]
struct Freeze {
    until: Option<Instant>,
}

impl Freeze {
    fn start(&mut self, server: &RedisServer, until: Instant) {
        if let Some(pid) = server.pid() {
            signal(pid, "STOP");
            self.until = Some(until);
        }
    }

    fn frozen(&self) -> bool {
        self.until.is_some()
    }

    fn thaw_if_due(&mut self, server: &RedisServer, now: Instant) {
        if self.until.is_some_and(|until| until <= now) {
            self.thaw(server);
        }
    }

    fn thaw(&mut self, server: &RedisServer) {
        if self.until.take().is_some() {
            if let Some(pid) = server.pid() {
                signal(pid, "CONT");
            }
        }
    }
}

/// The evictions of lock keys, from keyspace notifications read on the server's own port; the
/// subscription is made again after each restart. The reads block without a timeout: a timeout
/// in the middle of a message would desynchronise the reply parser and lose notifications in a
/// burst. To stop, the flag is set and a message published on the channel wakes the reader.
struct EvictionWatch {
    seen: Arc<Mutex<Vec<(u64, String)>>>,
    /// Evictions of value keys (rule (f) excuses a copy of a value Redis evicted).
    values: Arc<Mutex<Vec<(u64, String)>>>,
    /// Evictions of epoch keys (rule (h) excuses a value an evicted epoch brought back).
    epochs: Arc<Mutex<Vec<(u64, Epoch)>>>,
    subscriptions: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const EVICTED: &str = "__keyevent@0__:evicted";

/// Evictions seen: when the notification came (µs) and the entry's name.
type Evictions = Vec<(u64, String)>;

impl EvictionWatch {
    fn start(server: &RedisServer) -> Self {
        let seen: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
        let values: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
        let value_sink = Arc::clone(&values);
        let epochs: Arc<Mutex<Vec<(u64, Epoch)>>> = Arc::default();
        let epoch_sink = Arc::clone(&epochs);
        let subscriptions = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sink, stopping, url) = (Arc::clone(&seen), Arc::clone(&stop), server.url());
        let subscribed = Arc::clone(&subscriptions);
        let thread = std::thread::spawn(move || {
            let stopped = || stopping.load(std::sync::atomic::Ordering::SeqCst);
            while !stopped() {
                let conn = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)));
                let Ok(mut conn) = conn else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let mut pubsub = conn.as_pubsub();
                if pubsub.subscribe(EVICTED).is_err() {
                    continue;
                }
                subscribed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Ends when the server goes away (a restart): then subscribe to the new one.
                while let Ok(msg) = pubsub.get_message() {
                    if stopped() {
                        return;
                    }
                    let key: String = msg.get_payload().unwrap_or_default();
                    if let Some(lock) = replay::lock_name(NAMESPACE, &key) {
                        sink.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((now_us(), lock));
                    } else if let Some(entry) = replay::value_name(NAMESPACE, &key) {
                        value_sink
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((now_us(), entry));
                    } else if let Some(epoch) = replay::epoch_name(NAMESPACE, &key) {
                        epoch_sink
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((now_us(), epoch));
                    }
                }
            }
        });
        let watch = EvictionWatch {
            seen,
            values,
            epochs,
            subscriptions,
            stop,
            thread: Some(thread),
        };
        assert!(
            support::eventually(Duration::from_secs(10), || watch.watching(server)),
            "the eviction watch subscribed"
        );
        watch
    }

    /// Whether the watch is subscribed on the server's current life.
    fn watching(&self, server: &RedisServer) -> bool {
        let subscribers: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(EVICTED)
            .query(&mut server.conn())
            .unwrap_or_default();
        subscribers.iter().any(|(_, n)| *n > 0)
    }

    /// The lock evictions seen, the value evictions seen, the epoch evictions seen, and how
    /// many times the watch subscribed (once per server life).
    fn stop(mut self, server: &RedisServer) -> (Evictions, Evictions, Vec<(u64, Epoch)>, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _: redis::RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(EVICTED)
            .arg("stop")
            .query(&mut server.conn());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()));
        let values = std::mem::take(&mut *self.values.lock().unwrap_or_else(|p| p.into_inner()));
        let epochs = std::mem::take(&mut *self.epochs.lock().unwrap_or_else(|p| p.into_inner()));
        (
            seen,
            values,
            epochs,
            self.subscriptions.load(std::sync::atomic::Ordering::SeqCst),
        )
    }
}

/// Two loopback proxies to the one cache server: slots 0 and 1 connect through the first, 2 and
/// 3 through the second, so each side has a worker with a near tier (even slots) and one
/// without. A cut, delay or black-hole hits one side or both, so a near tier's stream can go
/// quiet while a near-tier instance on the other side goes on writing (and announcing): the
/// partition its staleness bound is about (a fault on both sides stops every writer too).
struct Proxies([Proxy; 2]);

#[derive(Debug, Clone, Copy)]
enum Side {
    First,
    Second,
    Both,
}

impl Proxies {
    fn of(&self, side: Side) -> &[Proxy] {
        match side {
            Side::First => &self.0[..1],
            Side::Second => &self.0[1..],
            Side::Both => &self.0[..],
        }
    }

    fn set_mode(&self, side: Side, mode: Mode) {
        for proxy in self.of(side) {
            proxy.set_mode(mode);
        }
    }

    fn cut(&self, side: Side) {
        for proxy in self.of(side) {
            proxy.cut();
        }
    }

    /// A third of the faults on each side alone, a third on both.
    fn draw(rng: &mut StdRng) -> Side {
        match rng.random_range(0..3) {
            0 => Side::First,
            1 => Side::Second,
            _ => Side::Both,
        }
    }
}

struct Slot {
    worker: Option<Worker>,
    instance: String,
    generation: u32,
    paused_since: Option<(u64, Instant)>,
    resume_at: Option<Instant>,
    respawn_at: Option<Instant>,
}

struct Controller {
    dir: PathBuf,
    /// The proxies: slot `i` connects through `proxy_urls[i / 2]`.
    proxy_urls: [String; 2],
    sink_url: String,
    seed: u64,
    slots: Vec<Slot>,
    faults: BTreeMap<&'static str, u64>,
    pauses: Vec<Pause>,
    endings: Vec<Ending>,
    restarts_us: Vec<u64>,
    instances: Vec<String>,
}

impl Controller {
    fn spawn(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.generation += 1;
        slot.instance = format!("w{i}.{}", slot.generation);
        self.instances.push(slot.instance.clone());
        let seed = self.seed * 1000 + i as u64 * 100 + slot.generation as u64;
        let held_ms = if i == HELD_SLOT {
            StdRng::seed_from_u64(seed)
                .random_range(HELD_BOUND_MS)
                .to_string()
        } else {
            String::new()
        };
        slot.worker = Some(Worker::spawn(
            "chaos-worker",
            &[
                ("CHAOS_URL", self.proxy_urls[i / 2].clone()),
                ("CHAOS_SINK", self.sink_url.clone()),
                ("CHAOS_DIR", self.dir.display().to_string()),
                ("CHAOS_INSTANCE", slot.instance.clone()),
                ("CHAOS_SEED", seed.to_string()),
                (
                    "CHAOS_NEAR_MS",
                    if i.is_multiple_of(2) {
                        NEAR_STALENESS.as_millis().to_string()
                    } else {
                        String::new()
                    },
                ),
                ("CHAOS_HELD_MS", held_ms),
            ],
        ));
    }

    fn resume(&mut self, i: usize) {
        resume_slot(&mut self.slots[i], &mut self.pauses);
    }

    fn running(&self) -> Vec<usize> {
        running_slots(&self.slots)
    }

    /// Asks every worker to stop, and records how each ended.
    fn stop_workers(&mut self) {
        stop_slots(
            &self.dir,
            &mut self.slots,
            &mut self.pauses,
            &mut self.endings,
        );
    }
}

/// `count` empty worker slots (each schedule's controller starts its workers in them).
fn new_slots(count: usize) -> Vec<Slot> {
    (0..count)
        .map(|_| Slot {
            worker: None,
            instance: String::new(),
            generation: 0,
            paused_since: None,
            resume_at: None,
            respawn_at: None,
        })
        .collect()
}

/// Resumes `slot`'s worker if it was stopped (SIGCONT), recording the pause.
fn resume_slot(slot: &mut Slot, pauses: &mut Vec<Pause>) {
    if let (Some((from_us, _)), Some(w)) = (slot.paused_since.take(), slot.worker.as_ref()) {
        signal(w.pid(), "CONT");
        pauses.push(Pause {
            instance: slot.instance.clone(),
            from_us,
            to_us: now_us(),
        });
    }
    slot.resume_at = None;
}

/// The slots whose worker runs (started, not stopped).
fn running_slots(slots: &[Slot]) -> Vec<usize> {
    (0..slots.len())
        .filter(|i| slots[*i].worker.is_some() && slots[*i].paused_since.is_none())
        .collect()
}

/// Resumes every worker, asks them all to stop (the stop file in `dir`), and records how each
/// ended (killed after 60 s if it did not exit).
fn stop_slots(dir: &Path, slots: &mut [Slot], pauses: &mut Vec<Pause>, endings: &mut Vec<Ending>) {
    for slot in slots.iter_mut() {
        resume_slot(slot, pauses);
    }
    File::create(dir.join("stop")).expect("the stop file");
    for slot in slots.iter_mut() {
        let Some(mut w) = slot.worker.take() else {
            continue;
        };
        let exited = support::eventually(Duration::from_secs(60), || !w.is_alive());
        let clean_exit = exited && w.wait_success();
        if !exited {
            signal(w.pid(), "KILL");
            let _ = w.child.wait();
        }
        endings.push(Ending {
            instance: slot.instance.clone(),
            killed: false,
            clean_exit,
            in_flight: None,
        });
    }
}

fn chaos_run() {
    // `STAMPEDE_CHAOS_REDLOCK=1`: the Redlock schedule instead (tests/chaos/redlock.rs).
    if redlock::selected() {
        return redlock::chaos_run();
    }
    let rounds: u64 = std::env::var("STAMPEDE_CHAOS_ROUNDS")
        .ok()
        .map(|v| v.parse().expect("STAMPEDE_CHAOS_ROUNDS is a number"))
        .unwrap_or(400);
    let seed: u64 = std::env::var("STAMPEDE_CHAOS_SEED")
        .ok()
        .map(|v| v.parse().expect("STAMPEDE_CHAOS_SEED is a number"))
        .unwrap_or(7);
    // The cluster schedule (tests/chaos/cluster.rs).
    if std::env::var("STAMPEDE_CHAOS_CLUSTER").is_ok_and(|v| v == "1") {
        return cluster::cluster_run(rounds, seed);
    }
    assert!(
        !waits_for_replicas(),
        "STAMPEDE_CHAOS_WAIT_REPLICAS=1 needs STAMPEDE_CHAOS_CLUSTER=1 (one server has no replica)"
    );
    let began = Instant::now();
    let tmp = tempfile::tempdir().expect("a temp dir for the history");
    let dir = tmp.path().to_path_buf();
    // Evictions are published (and kept across restarts) so the checker can excuse what an
    // evicted lock key does.
    let mut server =
        RedisServer::start_with(&["--notify-keyspace-events", "Ee"].map(String::from), "");
    let sink = RedisServer::start();
    let evictions = EvictionWatch::start(&server);
    let mut life = 0u32;
    let mut monitor = MonitorLog::start(&server, dir.join("monitor-0.log"));
    let mut monitor_files = Vec::new();
    let proxies = Proxies([Proxy::start(server.port()), Proxy::start(server.port())]);
    // Proxy faults that hit one side only (the rest hit both).
    let mut one_side = 0u64;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = Controller {
        dir: dir.clone(),
        proxy_urls: [proxies.0[0].url(), proxies.0[1].url()],
        sink_url: sink.url(),
        seed,
        slots: new_slots(WORKERS),
        faults: BTreeMap::new(),
        pauses: Vec::new(),
        endings: Vec::new(),
        restarts_us: Vec::new(),
        instances: Vec::new(),
    };
    for i in 0..WORKERS {
        c.spawn(i);
    }
    let mut proxy_fault_until: Option<(Instant, bool, Side)> = None;
    let mut pressure = Pressure::default();
    // While redis-server is frozen the controller does not talk to it (its connections would
    // wait for the thaw, which only the controller can send): no memory pressure, no restart.
    let mut freeze = Freeze::default();

    let mut fault_log =
        BufWriter::new(File::create(dir.join("faults.log")).expect("the faults log"));
    for _round in 0..rounds {
        std::thread::sleep(Duration::from_millis(rng.random_range(20..100)));
        let now = Instant::now();
        // Ends of faults that were due.
        for i in 0..WORKERS {
            if c.slots[i].resume_at.is_some_and(|t| t <= now) {
                c.resume(i);
                let _ = writeln!(fault_log, "{} resume {}", now_us(), c.slots[i].instance);
            }
            if c.slots[i].respawn_at.is_some_and(|t| t <= now) {
                c.slots[i].respawn_at = None;
                c.spawn(i);
            }
        }
        if let Some((until, cut, side)) = proxy_fault_until {
            if until <= now {
                let end = if cut { "cut" } else { "late delivery" };
                let _ = writeln!(fault_log, "{} proxy_fault_ends {side:?} {end}", now_us());
                if cut {
                    proxies.cut(side);
                }
                proxies.set_mode(side, Mode::Pass);
                proxy_fault_until = None;
            }
        }
        freeze.thaw_if_due(&server, now);
        if !freeze.frozen() {
            pressure.tick(&server, now);
        }
        // At most one new fault, written to faults.log (when, what, on which worker or side):
        // evidence kept with the history when a rule is broken.
        let running = c.running();
        let paused = WORKERS - running.len();
        let counted = c.faults.clone();
        let mut target = String::new();
        match rng.random_range(0..100) {
            0..4 if running.len() >= 3 => {
                let i = running[rng.random_range(0..running.len())];
                let mut w = c.slots[i].worker.take().expect("a running worker");
                signal(w.pid(), "KILL");
                let _ = w.child.wait();
                let instance = c.slots[i].instance.clone();
                target = instance.clone();
                c.endings.push(Ending {
                    instance,
                    killed: true,
                    clean_exit: false,
                    in_flight: None,
                });
                c.slots[i].respawn_at =
                    Some(now + Duration::from_millis(rng.random_range(50..400)));
                *c.faults.entry("kill").or_default() += 1;
            }
            4..9 if running.len() >= 2 && paused < 2 => {
                let i = running[rng.random_range(0..running.len())];
                let slot = &mut c.slots[i];
                let w = slot.worker.as_ref().expect("a running worker");
                signal(w.pid(), "STOP");
                slot.paused_since = Some((now_us(), now));
                let factor = rng.random_range(1.25..3.0);
                slot.resume_at = Some(now + LEASE.mul_f64(factor));
                target = format!("{} for {:?}", slot.instance, LEASE.mul_f64(factor));
                *c.faults.entry("stop").or_default() += 1;
            }
            9 if !freeze.frozen() => {
                // New clients wait in the proxy until the monitor watches the new server, so no
                // command of the new server's life goes unseen.
                proxies.set_mode(Side::Both, Mode::Hold);
                proxies.cut(Side::Both);
                proxy_fault_until = None;
                c.restarts_us.push(now_us());
                server.restart();
                // A new server starts without the pressure's settings.
                pressure.until = None;
                monitor_files.push(monitor.stop());
                life += 1;
                monitor = MonitorLog::start(&server, dir.join(format!("monitor-{life}.log")));
                proxies.set_mode(Side::Both, Mode::Pass);
                *c.faults.entry("redis_restart").or_default() += 1;
            }
            10..14 => {
                let side = Proxies::draw(&mut rng);
                one_side += u64::from(!matches!(side, Side::Both));
                target = format!("{side:?}");
                proxies.cut(side);
                *c.faults.entry("cut").or_default() += 1;
            }
            14..17 if proxy_fault_until.is_none() => {
                let delay = Duration::from_millis(rng.random_range(20..150));
                let side = Proxies::draw(&mut rng);
                one_side += u64::from(!matches!(side, Side::Both));
                target = format!("{side:?}");
                proxies.set_mode(side, Mode::Delay(delay));
                let span = Duration::from_millis(rng.random_range(300..1500));
                proxy_fault_until = Some((now + span, false, side));
                *c.faults.entry("delay").or_default() += 1;
            }
            17..20 if proxy_fault_until.is_none() => {
                let side = Proxies::draw(&mut rng);
                one_side += u64::from(!matches!(side, Side::Both));
                target = format!("{side:?}");
                proxies.set_mode(side, Mode::Blackhole);
                let span = Duration::from_millis(rng.random_range(300..2500));
                // Half end in a cut (held bytes dropped), half deliver them late.
                let cut = rng.random_bool(0.5);
                proxy_fault_until = Some((now + span, cut, side));
                *c.faults
                    .entry(if cut {
                        "blackhole_then_cut"
                    } else {
                        "blackhole_then_late_delivery"
                    })
                    .or_default() += 1;
            }
            20..24
                if !freeze.frozen() && pressure.until.is_none() && evictions.watching(&server) =>
            {
                let policy = EVICTING_POLICIES[rng.random_range(0..EVICTING_POLICIES.len())];
                let span = Duration::from_millis(rng.random_range(300..2000));
                pressure.start(&server, policy, now + span);
                *c.faults.entry("eviction_pressure").or_default() += 1;
            }
            27..30 if proxy_fault_until.is_none() => {
                // A partition of the side whose near tier serves while down, for longer than
                // its bound (and its breaker's cool-down): the other side goes on changing the
                // keys it holds, which is what rule (g) is about (a frozen server changes
                // nothing, so its held copies cannot miss a change).
                one_side += 1;
                proxies.set_mode(HELD_SIDE, Mode::Blackhole);
                let span = Duration::from_millis(rng.random_range(HELD_PARTITION_MS));
                proxy_fault_until = Some((now + span, true, HELD_SIDE));
                *c.faults.entry("partition_of_held").or_default() += 1;
            }
            30..34 if !freeze.frozen() => {
                // Another program writes a value key, straight to the server: rule (f) then
                // covers every writer (the near tiers hear of it through CLIENT TRACKING). A
                // flush also loses every lock, as a restart does.
                let key = format!("{NAMESPACE}:{{k{}}}", rng.random_range(0..CACHE_KEYS));
                let (name, cmd) = match rng.random_range(0..20) {
                    0..5 => (
                        "outside_set",
                        redis::cmd("SET")
                            .arg(&key)
                            .arg("from another program")
                            .clone(),
                    ),
                    5..10 => ("outside_del", redis::cmd("DEL").arg(&key).clone()),
                    10..14 => ("outside_unlink", redis::cmd("UNLINK").arg(&key).clone()),
                    14..19 => (
                        "outside_pexpire",
                        redis::cmd("PEXPIRE").arg(&key).arg(1).clone(),
                    ),
                    _ => ("outside_flushdb", redis::cmd("FLUSHDB")),
                };
                let sent_us = now_us();
                // Refused under memory pressure (OOM) or lost with a restarted server: the
                // monitor records what the server ran, and only that counts.
                let ran = redis::Client::open(server.url())
                    .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
                    .and_then(|mut conn| cmd.query::<redis::Value>(&mut conn));
                if ran.is_ok() {
                    if name == "outside_flushdb" {
                        c.restarts_us.push(sent_us);
                    }
                    *c.faults.entry(name).or_default() += 1;
                }
            }
            24..27 if !freeze.frozen() => {
                let span = Duration::from_millis(rng.random_range(FREEZE_MS));
                freeze.start(&server, now + span);
                *c.faults.entry("redis_freeze").or_default() += 1;
            }
            _ => {}
        }
        if let Some((kind, _)) = c.faults.iter().find(|(k, n)| counted.get(*k) != Some(*n)) {
            let _ = writeln!(fault_log, "{} {kind} {target}", now_us());
        }
    }
    let _ = fault_log.flush();

    // Wind down: faults end, dead slots stay dead, everyone else is asked to stop.
    freeze.thaw(&server);
    pressure.stop(&server);
    proxies.set_mode(Side::Both, Mode::Pass);
    c.stop_workers();
    // Nothing stranded in the server: lock keys now, and one lease later.
    let mut conn = server.conn();
    let lock_keys = |conn: &mut redis::Connection| -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("{NAMESPACE}:*_lock"))
            .query(conn)
            .expect("KEYS")
    };
    let mut locks_after_run = Vec::new();
    for key in lock_keys(&mut conn) {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).expect("PTTL");
        if pttl != -2 {
            locks_after_run.push((key, pttl));
        }
    }
    std::thread::sleep(LEASE + Duration::from_millis(50));
    let locks_after_lease = lock_keys(&mut conn);
    monitor_files.push(monitor.stop());
    let (lock_evictions, value_evictions, epoch_evictions, watch_subscriptions) =
        evictions.stop(&server);
    // Kept with the history, as evidence if the run fails.
    std::fs::write(
        dir.join("lock-evictions.log"),
        lock_evictions
            .iter()
            .map(|(seen, lock)| format!("{seen} {lock}\n"))
            .collect::<String>(),
    )
    .expect("the evictions log");
    let sink_log: Vec<String> = redis::cmd("LRANGE")
        .arg("sinklog")
        .arg(0)
        .arg(-1)
        .query(&mut sink.conn())
        .expect("the sink's log");
    drop(proxies);

    // The history.
    let mut h = History {
        restarts_us: c.restarts_us.clone(),
        lock_evictions: lock_evictions.clone(),
        pauses: c.pauses.clone(),
        endings: c.endings.clone(),
        locks_after_run,
        locks_after_lease,
        lease_ms: LEASE.as_millis() as u64,
        call_bound_us: CALL_BOUND.as_micros() as u64,
        value_evictions,
        epoch_evictions,
        ..History::default()
    };
    for (n, path) in monitor_files.iter().enumerate() {
        let lines: Vec<String> = std::io::BufReader::new(File::open(path).expect("monitor log"))
            .lines()
            .map_while(Result::ok)
            .collect();
        let (events, changes) = replay::replay(NAMESPACE, n as u32, &lines);
        h.server.extend(events);
        h.changes.extend(changes);
    }
    let mut near_stats = [0u64; 6];
    let mut sink_results: BTreeMap<(String, u64), (u32, u32)> = BTreeMap::new();
    for line in &sink_log {
        let f: Vec<&str> = line.split(' ').collect();
        let entry = sink_results
            .entry((f[0].to_string(), f[1].parse().expect("section id")))
            .or_default();
        entry.0 += 1;
        entry.1 += u32::from(f[4] == "1");
    }
    for instance in &c.instances {
        read_worker_log(&dir, instance, &sink_results, &mut h, &mut near_stats);
    }

    // Judge and report.
    let violations = check(&h);
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
    let accepted_writes = h
        .server
        .iter()
        .filter(|e| matches!(e, ServerEvent::Write(w) if w.computed))
        .count();
    let acquisitions = h
        .server
        .iter()
        .filter(|e| matches!(e, ServerEvent::Acquire { .. }))
        .count();
    let accepted_sections = h
        .sections
        .iter()
        .filter(|s| s.writes > 0 && s.accepted == s.writes)
        .count();
    let refused_sections = h.sections.iter().filter(|s| s.accepted < s.writes).count();
    let fault_total: u64 = c.faults.values().sum();
    // The workers' tag invalidations and clears, by op: (returned `Ok`, failed).
    let mut invalidations: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for call in calls_done.iter().filter(|c| raised_by(c).is_some()) {
        let counts = invalidations.entry(call.op.as_str()).or_default();
        match call.outcome {
            Outcome::Done => counts.0 += 1,
            _ => counts.1 += 1,
        }
    }
    let done = |op: &str| invalidations.get(op).copied().unwrap_or_default();
    println!(
        "chaos: seed {seed}, {rounds} rounds in {:.0?}",
        began.elapsed()
    );
    println!(
        "chaos: faults injected {fault_total}: {:?} ({one_side} of the cuts, delays and \
         black-holes on one side only: slots 0-1 or 2-3); and by the workers {} tag \
         invalidations and {} clears completed",
        c.faults,
        done("invalidate_tag").0 + done("invalidate_tags").0,
        done("clear").0,
    );
    println!(
        "chaos: calls completed {} ({outcomes:?}); worker processes {} ({} killed)",
        calls_done.len(),
        c.instances.len(),
        c.endings.iter().filter(|e| e.killed).count()
    );
    println!(
        "chaos: server: {acquisitions} lock acquisitions, {accepted_writes} computed values accepted, {} restarts; \
         lock/leader sections: {} ({accepted_sections} accepted by the fenced sink, {refused_sections} refused)",
        h.restarts_us.len(),
        h.sections.len()
    );
    println!(
        "chaos: memory pressure: {} lock keys evicted ({} filler keys written; eviction watch \
         subscribed {watch_subscriptions} times)",
        lock_evictions.len(),
        pressure.written
    );
    let near_calls = h
        .calls
        .iter()
        .filter(|c| h.near_instances.contains_key(&c.instance))
        .filter(|c| matches!(c.outcome, Outcome::Value(_)))
        .count();
    let judged = h
        .calls
        .iter()
        .filter(|c| h.near_instances.contains_key(&c.instance) && c.hit)
        .count();
    println!(
        "chaos: near tier ({} of {} worker processes, max_staleness {NEAR_STALENESS:?}): {near_calls} \
         values returned to them, {judged} served as hits and judged by rule (f) (the held ones by \
         (g)); near hits {}, misses {}, announcements \
         and tracking reports received {}, switched off {}, tracking refused in {} (workers that \
         ended cleanly); {} changes of values by all instances and the outside writer; {} value \
         keys evicted",
        h.near_instances.len(),
        c.instances.len(),
        near_stats[0],
        near_stats[1],
        near_stats[2],
        near_stats[3],
        near_stats[5],
        h.changes.len(),
        h.value_evictions.len(),
    );
    let held_calls = h.calls.iter().filter(|c| c.held).count();
    let mut held_bounds: Vec<u64> = h.held_bounds.values().map(|us| us / 1000).collect();
    held_bounds.sort_unstable();
    println!(
        "chaos: serve while down ({} worker processes, bounds {held_bounds:?} ms, response \
         time-out {HELD_RESPONSE_TIMEOUT:?}): {held_calls} values served held, all judged by \
         rule (g) (held_served {} in the workers that ended cleanly)",
        h.held_bounds.len(),
        near_stats[4],
    );
    let raises = h
        .server
        .iter()
        .filter(|e| matches!(e, ServerEvent::Raise(_)))
        .count();
    let tagged = h
        .calls
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Value(v) => history::parse_value(v),
            _ => None,
        })
        .filter(|v| !v.tags.is_empty())
        .count();
    let (judged, excused) = checker::tag_judgements(&h);
    println!(
        "chaos: tags {TAGS:?}: {tagged} tagged values returned; completed (failed): \
         invalidate_tag {:?}, invalidate_tags {:?}, clear {:?}; {raises} epochs raised on the \
         server; {judged} values returned after an invalidation of one of their tags or a \
         clear had returned, judged by rule (h), {excused} of them excused by a lost epoch; {} \
         epoch keys evicted",
        done("invalidate_tag"),
        done("invalidate_tags"),
        done("clear"),
        h.epoch_evictions.len(),
    );
    println!("chaos: violations {}", violations.len());
    for v in violations.iter().take(50) {
        println!("  {v}");
    }
    if !violations.is_empty() {
        // Keep the evidence, every finding with it (the output shows the first 50).
        let all: String = violations.iter().map(|v| format!("{v}\n")).collect();
        let _ = std::fs::write(dir.join("violations.log"), all);
        let kept = tmp.keep();
        println!("chaos: history kept in {}", kept.display());
    }
    assert!(violations.is_empty(), "{} violations", violations.len());
    // The run must have done something worth checking.
    assert!(calls_done.len() as u64 >= rounds, "too few calls completed");
    assert!(accepted_writes > 0 && accepted_sections > 0);
    assert!(
        !h.near_instances.is_empty() && near_calls > 0,
        "no near-tier worker returned a value"
    );
    // Rule (f) counts every writer. The near tiers track their keys; on a managed-like server
    // (`STAMPEDE_REDIS_MANAGED`, `CLIENT` renamed away) tracking is refused, and the bound is
    // kept by reading each copy again once it is max_staleness old, which rule (f) then
    // checks against the same writers. Elsewhere a refusal would be a fault of the run.
    if !support::managed() {
        assert_eq!(near_stats[5], 0, "a near tier's tracking was refused");
    }
    if rounds >= 200 {
        for kind in [
            "kill",
            "stop",
            "redis_restart",
            "cut",
            "delay",
            "eviction_pressure",
            "redis_freeze",
            "partition_of_held",
        ] {
            assert!(
                c.faults.get(kind).is_some_and(|n| *n > 0),
                "no {kind} injected"
            );
        }
        assert!(
            c.faults.keys().any(|k| k.starts_with("blackhole")),
            "no blackhole injected"
        );
        assert!(
            c.faults.keys().any(|k| k.starts_with("outside_")),
            "no outside write injected"
        );
        for op in ["invalidate_tag", "invalidate_tags", "clear"] {
            assert!(done(op).0 > 0, "no {op} completed");
        }
        assert!(judged > 0, "no value judged by rule (h)");
    }
}

/// Reads one worker's history file into `h`. A line cut short by SIGKILL is skipped.
fn read_worker_log(
    dir: &Path,
    instance: &str,
    sink: &BTreeMap<(String, u64), (u32, u32)>,
    h: &mut History,
    near_stats: &mut [u64; 6],
) {
    let Ok(text) = std::fs::read_to_string(dir.join(format!("{instance}.log"))) else {
        return;
    };
    let mut calls: BTreeMap<u64, Call> = BTreeMap::new();
    let mut sections: BTreeMap<u64, Section> = BTreeMap::new();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    for line in complete.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> u64 { f[i].parse().expect("a number in the history") };
        match f[0] {
            "begin" => {
                calls.insert(
                    num(1),
                    Call {
                        instance: instance.to_string(),
                        id: num(1),
                        op: f[2].to_string(),
                        key: f[3].to_string(),
                        start_us: num(4),
                        end_us: None,
                        outcome: Outcome::Pending,
                        held: false,
                        hit: false,
                        source: String::new(),
                    },
                );
            }
            "end" => {
                let call = calls.get_mut(&num(1)).expect("an end after its begin");
                call.end_us = Some(num(5));
                call.outcome = match f[6] {
                    "ok" => Outcome::Value(f[7].to_string()),
                    "done" => Outcome::Done,
                    _ => Outcome::Error(f[7].to_string()),
                };
                // A value's source follows it: `held` is judged by rule (g).
                call.held = f[6] == "ok" && f.get(8) == Some(&"held");
                call.hit = f[6] == "ok" && f.get(8) == Some(&"hit");
                if f[6] == "ok" {
                    call.source = f.get(8).unwrap_or(&"").to_string();
                }
            }
            "compute" => h.computes.push(Compute {
                instance: instance.to_string(),
                key: f[1].to_string(),
                token: num(2),
                start_us: num(3),
                end_us: num(4),
                value: f[5].to_string(),
            }),
            "acq" => {
                let (writes, accepted) = sink
                    .get(&(instance.to_string(), num(1)))
                    .copied()
                    .unwrap_or((0, 0));
                sections.insert(
                    num(1),
                    Section {
                        instance: instance.to_string(),
                        id: num(1),
                        lock: f[2].to_string(),
                        token: num(3),
                        asked_us: num(4),
                        start_us: num(5),
                        end_us: num(5),
                        writes,
                        accepted,
                    },
                );
            }
            "held" => {
                if let Some(s) = sections.get_mut(&num(1)) {
                    s.end_us = s.end_us.max(num(2));
                }
            }
            "near" => {
                h.near_instances.insert(instance.to_string(), num(1));
                // The serve-while-down bound, for the workers that hold copies.
                if f.len() > 2 {
                    h.held_bounds.insert(instance.to_string(), num(2));
                }
            }
            "stats" => {
                for (i, total) in near_stats.iter_mut().enumerate() {
                    *total += num(i + 1);
                }
            }
            "final" => {
                if let Some(e) = h
                    .endings
                    .iter_mut()
                    .find(|e| e.instance == instance && !e.killed)
                {
                    e.in_flight = Some(num(1) as usize);
                }
            }
            other => panic!("unknown history line {other:?} in {instance}"),
        }
    }
    h.calls.extend(calls.into_values());
    h.sections.extend(sections.into_values());
}

/// The worker's cache on `url`: one server (through a proxy), or a cluster (its seed nodes,
/// comma-separated).
fn backend(url: &str) -> Result<stampede_guard::CacheBuilder, String> {
    let builder = if url.contains(',') {
        Cache::builder().redis_cluster(url.split(','))
    } else {
        Cache::builder().redis_url(url)
    };
    // STAMPEDE_CHAOS_WAIT_REPLICAS=1: lock and fencing writes wait for a replica (`WAIT 1`),
    // on the cluster only (one server has no replica: every acquisition would fail). The wait's
    // bound stays under the breaker's stall (1 s), as the option's docs ask.
    if waits_for_replicas() {
        if !url.contains(',') {
            return Err(
                "STAMPEDE_CHAOS_WAIT_REPLICAS=1 needs STAMPEDE_CHAOS_CLUSTER=1".to_string(),
            );
        }
        return Ok(builder.connection(
            ConnectionOptions::default().wait_for_replicas(1, Duration::from_millis(250)),
        ));
    }
    Ok(builder)
}

/// `STAMPEDE_CHAOS_WAIT_REPLICAS=1`: the workers' locks wait for a replica (cluster schedule).
pub fn waits_for_replicas() -> bool {
    std::env::var("STAMPEDE_CHAOS_WAIT_REPLICAS").is_ok_and(|v| v == "1")
}

// =============================================================================================
// The workers.

/// One worker's history file: one `write` per event, so a SIGKILL cannot tear an earlier one.
struct Log(Mutex<File>);

impl Log {
    fn event(&self, line: String) {
        let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(format!("{line}\n").as_bytes())
            .expect("the history file takes the event");
    }
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Compute(_) => "Compute",
        Error::Backend { .. } => "Backend",
        Error::WaitTimeout { .. } => "WaitTimeout",
        Error::InvalidKey { .. } => "InvalidKey",
        Error::Encode(_) => "Encode",
        Error::ValueTooLarge { .. } => "ValueTooLarge",
        Error::Config(_) => "Config",
        Error::RecentFailure { .. } => "RecentFailure",
        Error::NotHeld { .. } => "NotHeld",
        Error::MissingFromBatch { .. } => "MissingFromBatch",
        _ => "Other",
    }
}

/// Where a value came from, as the history records it after the value (`held` is judged by
/// rule (g); the others are kept as evidence).
fn source(source: &Source) -> &'static str {
    match source {
        Source::Held => "held",
        Source::Hit => "hit",
        Source::Stale => "stale",
        Source::Computed => "computed",
        Source::Waited => "waited",
        Source::Uncached => "uncached",
        Source::FailSafe => "fail_safe",
        _ => "other",
    }
}

struct Ctx {
    cache: Cache,
    log: Log,
    sink: redis::aio::MultiplexedConnection,
    instance: String,
    ids: std::sync::atomic::AtomicU64,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Ctx {
    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// One write of a critical section to the fenced sink.
    async fn sink_write(&self, section: u64, lock: &str, token: u64) -> Result<(), String> {
        let mut conn = self.sink.clone();
        let script = redis::Script::new(SINK);
        let mut invocation = script.key(format!("max:{lock}"));
        invocation
            .key("sinklog")
            .arg(&self.instance)
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
}

fn worker(role: &str) -> Result<(), String> {
    if role == redlock::ROLE {
        return redlock::worker();
    }
    if role != "chaos-worker" {
        return Err(format!("unknown role {role}"));
    }
    let var = |name: &str| std::env::var(name).map_err(|e| format!("{name}: {e}"));
    let (url, sink_url, dir, instance) = (
        var("CHAOS_URL")?,
        var("CHAOS_SINK")?,
        PathBuf::from(var("CHAOS_DIR")?),
        var("CHAOS_INSTANCE")?,
    );
    let seed: u64 = var("CHAOS_SEED")?.parse().map_err(|e| format!("{e}"))?;
    let runtime = runtime();
    runtime.block_on(async move {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{instance}.log")))
            .map_err(|e| e.to_string())?;
        let options = CallOptions::default()
            .lease(LEASE)
            .wait_timeout(WAIT_TIMEOUT);
        // The cluster schedule passes the seed nodes, comma-separated, and runs no near tier
        // (tests/chaos/cluster.rs).
        let cluster = url.contains(',');
        let near_ms: Option<u64> = match var("CHAOS_NEAR_MS")?.as_str() {
            _ if cluster => None,
            "" => None,
            ms => Some(ms.parse().map_err(|e| format!("CHAOS_NEAR_MS: {e}"))?),
        };
        // Only with a near tier: the copies it holds are what is served while down.
        let held_ms: Option<u64> = match (near_ms, var("CHAOS_HELD_MS")?.as_str()) {
            (None, _) | (_, "") => None,
            (Some(_), ms) => Some(ms.parse().map_err(|e| format!("CHAOS_HELD_MS: {e}"))?),
        };
        let mut builder = backend(&url)?.namespace(NAMESPACE).options(options);
        if let Some(ms) = near_ms {
            let mut near = NearCacheOptions::new(1_000).max_staleness(Duration::from_millis(ms));
            if let Some(held) = held_ms {
                near = near.serve_while_down(Duration::from_millis(held));
                builder = builder.connection(
                    ConnectionOptions::default().response_timeout(HELD_RESPONSE_TIMEOUT),
                );
            }
            builder = builder.near_cache(near);
        }
        let cache = builder.build().await.map_err(|e| e.to_string())?;
        // The sink is the harness's own recorder on a server no fault touches: give its
        // connection room on a loaded machine (redis-rs's default is 1 s; a worker started while
        // the machine was busy once failed there, before its first call, and counted as a
        // worker that did not shut down cleanly).
        let sink_config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let sink = redis::Client::open(sink_url.as_str())
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection_with_config(&sink_config)
            .await
            .map_err(|e| format!("connecting to the sink: {e}"))?;
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let log = Log(Mutex::new(file));
        if let Some(ms) = near_ms {
            // First in the history: the checker holds this worker's values to rule (f), and
            // its held values (with the bound that follows) to rule (g).
            match held_ms {
                Some(held) => log.event(format!("near {} {}", ms * 1000, held * 1000)),
                None => log.event(format!("near {}", ms * 1000)),
            }
        }
        let ctx = Arc::new(Ctx {
            cache,
            log,
            sink,
            instance,
            ids: Default::default(),
            stop,
        });
        let stop_file = dir.join("stop");
        tokio::spawn(async move {
            while !stop_file.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stop_tx.send_replace(true);
        });
        let mut tasks = Vec::new();
        for n in 0..2 {
            tasks.push(tokio::spawn(cache_loop(Arc::clone(&ctx), seed * 10 + n)));
        }
        tasks.push(tokio::spawn(lock_loop(Arc::clone(&ctx), seed * 10 + 5)));
        tasks.push(tokio::spawn(leader_loop(Arc::clone(&ctx), seed * 10 + 6)));
        for task in tasks {
            task.await.map_err(|e| e.to_string())??;
        }
        let stats = ctx.cache.stats();
        ctx.log.event(format!(
            "stats {} {} {} {} {} {}",
            stats.near_hits,
            stats.near_misses,
            stats.near_invalidations,
            stats.near_switched_off,
            stats.held_served,
            u64::from(stats.near_tracking == stampede_guard::TrackingState::Refused),
        ));
        ctx.log.event(format!("final {}", ctx.cache.in_flight()));
        Ok(())
    })
}

/// Calls one cache loop keeps in flight at most: a call stuck on Redis (a black-hole) does not
/// stop the next, as in a server answering many requests, so a near tier keeps being asked for
/// its copies while its stream is partitioned.
const CALLS_IN_FLIGHT: u32 = 4;

/// `fetch` (mostly), `invalidate` and `set` on the hot keys, each call in a
/// task of its own (at most [`CALLS_IN_FLIGHT`] at once).
async fn cache_loop(ctx: Arc<Ctx>, seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let permits = Arc::new(tokio::sync::Semaphore::new(CALLS_IN_FLIGHT as usize));
    while !ctx.stopping() {
        let key = format!("k{}", rng.random_range(0..CACHE_KEYS));
        let dice = rng.random_range(0..100);
        let op = match dice {
            0..8 => "invalidate",
            8..12 => "set",
            12..30 => "batch",
            30..33 => "invalidate_tag",
            33..34 => "invalidate_tags",
            34..35 => "clear",
            _ => "get_or_compute",
        };
        let tags = Tags::draw(&mut rng);
        // Two distinct tags: an `invalidate_tag` takes the first.
        let invalidated = draw_tags(&mut rng, 2);
        let compute_ms = match rng.random_range(0..100) {
            0..70 => rng.random_range(0..60),
            70..95 => rng.random_range(60..200),
            // Longer than the lease: the heartbeat must keep it.
            _ => rng.random_range(500..1000),
        };
        let fail = rng.random_range(0..100) < 5;
        let ttl = Duration::from_millis(rng.random_range(200..2000));
        // A batch asks for two or three keys, drawn with repetition (a key asked twice is
        // computed once); now and then its computation leaves one out.
        let batch: Vec<String> = (0..rng.random_range(2..=3))
            .map(|_| format!("k{}", rng.random_range(0..CACHE_KEYS)))
            .collect();
        let leave_out = (rng.random_range(0..100) < 5).then(|| batch[0].clone());
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let _permit = permit;
            match op {
                "batch" => batch_call(&ctx, batch, compute_ms, fail, leave_out, ttl, tags).await,
                "invalidate_tag" => invalidation_call(&ctx, op, &invalidated[..1]).await,
                "invalidate_tags" | "clear" => invalidation_call(&ctx, op, &invalidated).await,
                _ => one_call(&ctx, op, key, compute_ms, fail, ttl, tags).await,
            }
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
    }
    // Every call ends before the worker reports its in-process entries.
    let _all = permits
        .acquire_many(CALLS_IN_FLIGHT)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Draws `n` distinct tags of [`TAGS`].
fn draw_tags(rng: &mut StdRng, n: usize) -> Vec<String> {
    let mut tags: Vec<String> = TAGS.iter().map(|t| t.to_string()).collect();
    for i in 0..n.min(tags.len()) {
        let j = rng.random_range(i..tags.len());
        tags.swap(i, j);
    }
    tags.truncate(n);
    tags
}

/// The tags of one call's values: its handle's (`CallOptions::tags`, read with the value in
/// one round trip) and its computation's (`Computed::tags`).
struct Tags {
    handle: Vec<String>,
    computed: Vec<String>,
}

impl Tags {
    /// Two calls in five with no handle tags, two with one, one with two; a computation adds
    /// one tag three times in ten.
    fn draw(rng: &mut StdRng) -> Self {
        let n = match rng.random_range(0..5) {
            0..2 => 0,
            2..4 => 1,
            _ => 2,
        };
        let handle = draw_tags(rng, n);
        let one = rng.random_range(0..10) < 3;
        let computed = draw_tags(rng, usize::from(one));
        Tags { handle, computed }
    }

    /// The handle that gives values the handle's tags.
    fn handle(&self, cache: &Cache) -> Cache {
        if self.handle.is_empty() {
            return cache.clone();
        }
        cache.with_options(cache.options().clone().tags(self.handle.clone()))
    }

    /// The tags of a value computed by this call, as it writes them into the value.
    fn of_computed(&self) -> String {
        tags_label(&[&self.handle[..], &self.computed[..]].concat())
    }
}

/// One tag invalidation (`invalidate_tag` for one tag, `invalidate_tags` for more) or `clear`,
/// logged as it begins and ends, its tags in the key's place (`*` for a clear).
async fn invalidation_call(ctx: &Arc<Ctx>, op: &str, tags: &[String]) {
    let id = ctx.next_id();
    let start = now_us();
    let label = if op == "clear" {
        "*".to_string()
    } else {
        tags.join("+")
    };
    ctx.log.event(format!("begin {id} {op} {label} {start}"));
    let done = match op {
        "clear" => ctx.cache.clear().await,
        "invalidate_tag" => ctx.cache.invalidate_tag(&tags[0]).await,
        _ => ctx.cache.invalidate_tags(tags).await,
    };
    let outcome = match done {
        // Always applied: the chaos caches have no auto-recovery queue.
        Ok(_) => "done".to_string(),
        Err(e) => format!("err {}", kind(&e)),
    };
    ctx.log.event(format!(
        "end {id} {op} {label} {start} {} {outcome}",
        now_us()
    ));
}

/// One call, logged as it begins and ends.
async fn one_call(
    ctx: &Arc<Ctx>,
    op: &str,
    key: String,
    compute_ms: u64,
    fail: bool,
    ttl: Duration,
    tags: Tags,
) {
    let id = ctx.next_id();
    let start = now_us();
    ctx.log.event(format!("begin {id} {op} {key} {start}"));
    let cache = tags.handle(&ctx.cache);
    let outcome = match op {
        "invalidate" => match cache.invalidate(&key).await {
            Ok(_) => "done".to_string(),
            Err(e) => format!("err {}", kind(&e)),
        },
        "set" => {
            let label = tags_label(&tags.handle);
            let value = format!("S|{key}|{}|{id}|{label}", ctx.instance);
            match cache.set(&key, &value, Duration::from_millis(1500)).await {
                Ok(_) => "done".to_string(),
                Err(e) => format!("err {}", kind(&e)),
            }
        }
        _ => {
            let inner = Arc::clone(ctx);
            let k = key.clone();
            let label = tags.of_computed();
            let computed_tags = tags.computed;
            // `fetch`, not `get_or_compute_with_lease`: the same path, and it says where the
            // value came from (a held copy is judged by rule (g)).
            let got = cache
                .fetch(&key, ttl, move |lease| async move {
                    let began = now_us();
                    let token = lease.fencing_token().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(compute_ms)).await;
                    if fail {
                        return Err("planned failure".to_string());
                    }
                    let value = format!("V|{k}|{token}|{}|{id}|{label}", inner.instance);
                    inner
                        .log
                        .event(format!("compute {k} {token} {began} {} {value}", now_us()));
                    Ok(Computed::new(value).tags(computed_tags))
                })
                .await;
            match got {
                Ok(fetched) => format!("ok {} {}", fetched.value, source(&fetched.source)),
                Err(e) => format!("err {}", kind(&e)),
            }
        }
    };
    ctx.log.event(format!(
        "end {id} {op} {key} {start} {} {outcome}",
        now_us()
    ));
}

/// One `fetch_many` call, logged as one call per key asked (each with its own id, all with the
/// batch's start and end), so that every rule of the checker applies per key. The computation
/// logs one computation per key it returns, with that key's own fencing token.
async fn batch_call(
    ctx: &Arc<Ctx>,
    keys: Vec<String>,
    compute_ms: u64,
    fail: bool,
    leave_out: Option<String>,
    ttl: Duration,
    tags: Tags,
) {
    let ids: Vec<u64> = keys.iter().map(|_| ctx.next_id()).collect();
    let start = now_us();
    for (id, key) in ids.iter().zip(&keys) {
        ctx.log.event(format!("begin {id} batch {key} {start}"));
    }
    let inner = Arc::clone(ctx);
    let cache = tags.handle(&ctx.cache);
    let label = tags.of_computed();
    let computed_tags = tags.computed;
    let got = cache
        .fetch_many(&keys, ttl, move |locked: Vec<(String, Lease)>| {
            let (ctx, leave_out) = (Arc::clone(&inner), leave_out.clone());
            let (label, computed_tags) = (label.clone(), computed_tags.clone());
            async move {
                let began = now_us();
                tokio::time::sleep(Duration::from_millis(compute_ms)).await;
                if fail {
                    return Err("planned failure".to_string());
                }
                let mut values = Vec::new();
                for (key, lease) in locked {
                    if leave_out.as_ref() == Some(&key) {
                        continue;
                    }
                    let token = lease.fencing_token().unwrap_or(0);
                    let value =
                        format!("V|{key}|{token}|{}|{}|{label}", ctx.instance, ctx.next_id());
                    ctx.log.event(format!(
                        "compute {key} {token} {began} {} {value}",
                        now_us()
                    ));
                    values.push((key, Computed::new(value).tags(computed_tags.clone())));
                }
                Ok(values)
            }
        })
        .await;
    let end = now_us();
    for ((id, key), result) in ids.iter().zip(&keys).zip(got) {
        let outcome = match result {
            // A batch serves held copies too, key by key.
            Ok(fetched) => format!("ok {} {}", fetched.value, source(&fetched.source)),
            Err(e) => format!("err {}", kind(&e)),
        };
        ctx.log
            .event(format!("end {id} batch {key} {start} {end} {outcome}"));
    }
}

/// Critical sections under a `Lock`: each step checks the lease, then writes to the sink.
async fn lock_loop(ctx: Arc<Ctx>, seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    while !ctx.stopping() {
        let name = LOCKS[rng.random_range(0..LOCKS.len())];
        let lock = ctx.cache.lock(name).map_err(|e| e.to_string())?;
        let id = ctx.next_id();
        let asked = now_us();
        if let Ok(guard) = lock.acquire().await {
            let token = guard.fencing_token();
            ctx.log
                .event(format!("acq {id} {name} {token} {asked} {}", now_us()));
            for _ in 0..rng.random_range(1..=3) {
                // Read the clock first: the check that follows holds for that moment too.
                let t0 = now_us();
                if !guard.is_held() {
                    break;
                }
                ctx.log.event(format!("held {id} {t0}"));
                if ctx.sink_write(id, name, token).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..120))).await;
            }
            let _ = guard.release().await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..50))).await;
    }
    Ok(())
}

/// A `Leader` whose job writes to the sink; one section per term (fencing token).
async fn leader_loop(ctx: Arc<Ctx>, seed: u64) -> Result<(), String> {
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    let leader = Leader::new(
        ctx.cache.lock("leader").map_err(|e| e.to_string())?,
        Duration::from_millis(30),
    );
    let mut stop = ctx.stop.clone();
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let term: Arc<Mutex<(u64, u64)>> = Arc::default(); // (token, section id)
                                                       // When this instance last went to standby: a moment no later than the request of the lock
                                                       // that its next term holds, which the checker needs as the section's "asked" time (an
                                                       // eviction of the lock key after it may end the term). Seen late, it is only earlier.
    let standby_since = Arc::new(std::sync::atomic::AtomicU64::new(now_us()));
    let mut status = leader.status();
    let standby = Arc::clone(&standby_since);
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            if *status.borrow_and_update() == Role::Standby {
                standby.store(now_us(), std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let job = move |job: JobContext| {
        let (ctx, term, rng) = (Arc::clone(&ctx), Arc::clone(&term), Arc::clone(&rng));
        let asked = standby_since.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            let t0 = now_us();
            if job.is_cancelled() {
                return Ok::<(), String>(());
            }
            let token = job.fencing_token();
            let id = {
                let mut term = term.lock().unwrap_or_else(|p| p.into_inner());
                if term.0 != token {
                    *term = (token, ctx.next_id());
                    ctx.log
                        .event(format!("acq {} leader {token} {asked} {t0}", term.1));
                }
                term.1
            };
            ctx.log.event(format!("held {id} {t0}"));
            ctx.sink_write(id, "leader", token).await?;
            let pause = rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .random_range(10..80);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            Ok(())
        }
    };
    leader.run(job, shutdown).await.map_err(|e| e.to_string())
}
