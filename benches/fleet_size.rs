//! What a fleet costs one Redis, and where one server stops being enough: 1, 10, 50 and 200
//! instances against one `redis-server`, then against the 3-master cluster the tests start
//! (3 masters, 3 replicas; sharded pub/sub for wake-ups), there without the announcing fleets
//! (time). Each instance is a `Cache` of its own,
//! holding what a process would hold: its data connection (which also carries its locks), its
//! wake-up subscriber, and with the near tier its feed (one connection per master). They share
//! this process's tokio runtime, as lightweight workers (one client thread by default, as in the
//! other Redis benches; see `client_runtime`).
//!
//! Three kinds of fleet: no near tier (`near=off`), a near tier that hears the crate's own
//! announcements only (`near=announce`, `track_outside_writes(false)`), and one with Redis's
//! client tracking (`near=tracking`, the default). `max_staleness` is the default 1 s, so each
//! near tier sends its heartbeat every 250 ms, as in production; the `idle` line is that cost.
//!
//! Measured per fleet, from the servers' own `INFO` (summed over a cluster's six nodes):
//! - `set`: `set`s replacing a value (each announced), one at a time, round robin over the
//!   instances (1,000; 10,000 / n for larger fleets, at least 100): server CPU (also
//!   `server_us_per_op_net`, without what the `idle` fleet spends over the same time), commands,
//!   bytes sent per write, and `near_msgs_per_op`, the
//!   value-change messages the fleet's near tiers received per write (`Stats::near_invalidations`;
//!   tracking's reports of locks and fencing counters are not counted there, only in the bytes);
//! - `fill`: as many `get_or_compute`s of cold keys (lock, compute, store), likewise;
//! - `hit_load` and `set_load`: as many callers as instances (at least 64; caller `j` uses
//!   instance `j % n`) reading the filled keys, or replacing values, in a closed loop for 1.5 s:
//!   operations per second and the CPU shares of the servers (`server_cpu_share`, in cores;
//!   `busiest_node_share` for the busiest one), of this client process (its threads) and of
//!   the whole machine (`machine_busy`, 1.0 = both cores). `bound=server` when the busiest
//!   server used at least 0.9 of its core (Redis runs commands on one thread), else
//!   `bound=machine` when every core was busy (the client, the servers and whatever else ran on
//!   the machine), else `bound=client`: the client ran out, not the server;
//! - `idle`: the fleet doing nothing for 1 s (heartbeats, pings): `ops=0`, and the `_per_op`
//!   fields are per second;
//! - `wakeup`: 1,000 waiters spread over the instances wait on one key that another instance
//!   (the holder, one more `Cache`) computes; each sample is the time from the holder's
//!   computation returning (just before its store-and-unlock) to a waiter's return; 5 rounds.
//!
//! Every line starts with `fleet_size` and holds `name=value` pairs. A custom harness:
//! `cargo bench --bench fleet_size` (about 5 minutes). `STAMPEDE_FLEET_SIZES=1,10` runs only
//! those sizes, `STAMPEDE_FLEET_TARGETS=one` (or `cluster`) only that target.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod cluster;
    pub mod load;
    pub mod near_ready;
    pub mod percentile;
    pub mod poll;
    pub mod server;
    pub mod server_info;
    pub use {bench::*, cluster::*, near_ready::*, percentile::*, server::*, server_info::*};
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use stampede_guard::{Cache, CacheBuilder, NearCacheOptions};
use support::{RedisCluster, RedisServer, ServerCounters};
use tokio::sync::oneshot;

const SIZES: [usize; 4] = [1, 10, 50, 200];
/// The client's worker threads (see [`client_runtime`]).
const CLIENT_THREADS: usize = 1;
/// Keys of the `set`, `fill` and hit measurements.
const OPS: usize = 1_000;

/// Operations of each one-at-a-time measurement (`set`, `fill`) for a fleet of `size`: fewer
/// for large fleets, where the client also receives every instance's messages (a write to
/// 200 announcing instances took 23 ms of wall time on one client thread), so that the bench stays
/// within minutes. The figures are per operation either way.
fn sequential_ops(size: usize) -> usize {
    (OPS * 10 / size).clamp(100, OPS)
}
/// How long each closed-loop load runs.
const LOAD: Duration = Duration::from_millis(1_500);
/// The fewest callers of a load: fewer would leave the server idle between round trips.
const MIN_CALLERS: usize = 64;
const WAITERS: usize = 1_000;
const WAKEUP_ROUNDS: usize = 5;
/// How long the holder keeps the lock once the waiters are started: time for all of them to
/// read, find the lock held and subscribe.
const HOLD: Duration = Duration::from_millis(250);
const TTL: Duration = Duration::from_secs(600);

/// Where the fleet's caches live.
enum Target {
    One(RedisServer),
    Cluster(RedisCluster),
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::One(_) => "one",
            Target::Cluster(_) => "cluster",
        }
    }

    fn builder(&self) -> CacheBuilder {
        match self {
            Target::One(server) => Cache::builder().redis_url(server.url()),
            Target::Cluster(cluster) => Cache::builder().redis_cluster(cluster.urls()),
        }
    }

    /// Each node's counters (one for a single server, six for the cluster).
    fn counters(&self) -> Vec<ServerCounters> {
        let nodes: Vec<&RedisServer> = match self {
            Target::One(server) => vec![server],
            Target::Cluster(cluster) => cluster.nodes.iter().collect(),
        };
        nodes
            .into_iter()
            .map(|n| support::server_counters(&mut n.conn()))
            .collect()
    }
}

/// The near tier each instance of a fleet runs.
#[derive(Clone, Copy, PartialEq)]
enum Near {
    Off,
    Announce,
    Tracking,
}

impl Near {
    const ALL: [Near; 3] = [Near::Off, Near::Announce, Near::Tracking];

    fn name(self) -> &'static str {
        match self {
            Near::Off => "off",
            Near::Announce => "announce",
            Near::Tracking => "tracking",
        }
    }
}

/// A fleet of `Cache` instances on one target, with the line prefix of its measurements.
struct Fleet {
    caches: Vec<Cache>,
    /// The wake-up bench's holder: one more instance, so that no waiter shares its process.
    holder: Cache,
    namespace: String,
    label: String,
}

async fn instance(target: &Target, namespace: &str, near: Near) -> Cache {
    let builder = target.builder().namespace(namespace);
    let builder = match near {
        Near::Off => builder,
        Near::Announce => {
            builder.near_cache(NearCacheOptions::new(10_000).track_outside_writes(false))
        }
        Near::Tracking => builder.near_cache(NearCacheOptions::new(10_000)),
    };
    builder.build().await.expect("a cache")
}

async fn fleet(target: &Target, size: usize, near: Near) -> Fleet {
    let started = Instant::now();
    // A namespace of its own: on the cluster, which serves every fleet in turn, nothing of an
    // earlier fleet (keys, tracking prefixes, channels) is counted for this one.
    let namespace = format!("fleet-{size}-{}", near.name());
    let mut caches = Vec::with_capacity(size);
    for _ in 0..size {
        caches.push(instance(target, &namespace, near).await);
    }
    let holder = instance(target, &namespace, near).await;
    // Connect every cache (data connection, scripts) before measuring.
    for cache in caches.iter().chain([&holder]) {
        let _: Option<String> = cache.get("warm-up").await.expect("Redis answers");
    }
    if near != Near::Off {
        let all: Vec<Cache> = caches.iter().chain([&holder]).cloned().collect();
        support::wait_for_near_feeds(&all, near == Near::Tracking).await;
    }
    let label = format!(
        "fleet_size target={} instances={size} near={}",
        target.name(),
        near.name()
    );
    let clients: f64 = target.counters().iter().map(|c| c.clients).sum();
    println!(
        "{label} measure=setup secs={:.2} server_clients={clients}",
        started.elapsed().as_secs_f64()
    );
    Fleet {
        caches,
        holder,
        namespace,
        label,
    }
}

/// This process's CPU time so far: the sum over its threads of `/proc/self/task/*/schedstat`'s
/// first field (nanoseconds on a CPU). Zero where there is no `/proc` (the share then reads 0).
fn client_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// The machine's busy and total jiffies over all cores, from `/proc/stat` (idle and iowait
/// count as not busy).
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// One reading of everything a measurement compares.
struct Reading {
    at: Instant,
    nodes: Vec<ServerCounters>,
    client: Duration,
    machine: (u64, u64),
    near_msgs: u64,
}

fn reading(target: &Target, fleet: &Fleet) -> Reading {
    Reading {
        at: Instant::now(),
        nodes: target.counters(),
        client: client_cpu(),
        machine: machine_jiffies(),
        near_msgs: fleet
            .caches
            .iter()
            .map(|c| c.stats().near_invalidations)
            .sum(),
    }
}

/// Prints what `ops` operations between `before` and `after` cost, per operation and as
/// shares of the wall time.
fn report(
    fleet: &Fleet,
    measure: &str,
    ops: u64,
    idle_cpu: f64,
    before: &Reading,
    after: &Reading,
) -> f64 {
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let deltas: Vec<ServerCounters> = after
        .nodes
        .iter()
        .zip(&before.nodes)
        .map(|(a, b)| *a - *b)
        .collect();
    let total = deltas
        .iter()
        .fold(ServerCounters::default(), |sum, d| sum + *d);
    let busiest = deltas.iter().map(|d| d.cpu_seconds).fold(0.0, f64::max) / wall;
    let per = |x: f64| x / ops.max(1) as f64;
    let client = after.client.saturating_sub(before.client).as_secs_f64() / wall;
    let (busy, all) = (
        after.machine.0.saturating_sub(before.machine.0),
        after.machine.1.saturating_sub(before.machine.1),
    );
    // Redis runs commands on one thread: 0.9 of a core is a saturated server. Else, with every
    // core of the machine busy (this process, the servers, whatever else runs), the machine ran
    // out; only then the clients themselves.
    let machine = busy as f64 / all.max(1) as f64;
    let bound = if busiest >= 0.9 {
        "server"
    } else if machine >= 0.95 {
        "machine"
    } else {
        "client"
    };
    // What the fleet's heartbeats cost the servers over the same time, taken out: with 200
    // near tiers it is 3 % of a core, and a slow step would otherwise charge it to its operations.
    let net = (total.cpu_seconds - idle_cpu * wall).max(0.0);
    println!(
        "{} measure={measure} ops={ops} secs={wall:.2} ops_per_s={:.0} server_us_per_op={:.1} \
         server_us_per_op_net={:.1} commands_per_op={:.3} bytes_out_per_op={:.0} near_msgs_per_op={:.2} \
         server_cpu_share={:.2} busiest_node_share={busiest:.2} client_cpu_share={client:.2} \
         machine_busy={machine:.2} bound={bound}",
        fleet.label,
        ops as f64 / wall,
        per(total.cpu_seconds) * 1e6,
        per(net) * 1e6,
        per(total.commands),
        per(total.bytes_out),
        per(after.near_msgs.saturating_sub(before.near_msgs) as f64),
        total.cpu_seconds / wall,
    );
    total.cpu_seconds / wall
}

/// Replaces values (each `set` announced) one at a time, round robin over the instances.
async fn sets(fleet: &Fleet, ops: usize) -> u64 {
    let value = support::load::value();
    for i in 0..ops {
        let cache = &fleet.caches[i % fleet.caches.len()];
        let _ = cache.set(&format!("s{i}"), &value, TTL).await.expect("set");
    }
    ops as u64
}

/// Computes cold keys `f{from}`… one at a time, round robin over the instances.
async fn fills(fleet: &Fleet, from: usize, to: usize) -> u64 {
    for i in from..to {
        let cache = &fleet.caches[i % fleet.caches.len()];
        let _: String = cache
            .get_or_compute(&format!("f{i}"), TTL, || async {
                Ok::<_, std::io::Error>(support::load::value())
            })
            .await
            .expect("a fill");
    }
    (to - from) as u64
}

/// A closed loop for [`LOAD`]: `max(64, n)` callers, caller `j` on instance `j % n`, each
/// running `op(cache, j, i)` for its `i`-th call. Returns the calls made.
async fn load<F, Fut>(fleet: &Fleet, op: F) -> u64
where
    F: Fn(Cache, usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + LOAD;
    let callers = fleet.caches.len().max(MIN_CALLERS);
    let mut tasks = tokio::task::JoinSet::new();
    for j in 0..callers {
        let (cache, op, done) = (
            fleet.caches[j % fleet.caches.len()].clone(),
            op.clone(),
            Arc::clone(&done),
        );
        tasks.spawn(async move {
            let mut i = 0;
            while tokio::time::Instant::now() < deadline {
                op(cache.clone(), j, i).await;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a caller");
    }
    done.load(Ordering::Relaxed)
}

async fn hit_load(fleet: &Fleet) -> u64 {
    load(fleet, |cache, j, i| async move {
        let key = format!("f{}", (j * 7 + i * 13) % OPS);
        let _: String = cache
            .get_or_compute(&key, TTL, || async {
                Ok::<_, std::io::Error>(support::load::value())
            })
            .await
            .expect("a hit");
    })
    .await
}

async fn set_load(fleet: &Fleet) -> u64 {
    let value = Arc::new(support::load::value());
    load(fleet, move |cache, j, i| {
        let value = Arc::clone(&value);
        async move {
            let key = format!("s{}", (j + i * 31) % OPS);
            let _ = cache.set(&key, &*value, TTL).await.expect("set");
        }
    })
    .await
}

/// Runs `op`, then prints what it cost; returns the servers' CPU seconds per second of it.
/// Waits a moment first, so that messages of the step before are not counted.
async fn measure<Fut: std::future::Future<Output = u64>>(
    target: &Target,
    fleet: &Fleet,
    name: &str,
    idle_cpu: f64,
    op: Fut,
) -> f64 {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = reading(target, fleet);
    let ops = op.await;
    let after = reading(target, fleet);
    report(fleet, name, ops, idle_cpu, &before, &after)
}

/// One round: the holder takes `key`'s lock and holds it while the waiters start, then stores
/// its value; returns, per waiter, the time from the value's computation to the waiter's return.
async fn wakeup_round(fleet: &Fleet, key: String) -> Vec<Duration> {
    let (acquired_tx, acquired) = oneshot::channel();
    let (release, release_rx) = oneshot::channel::<()>();
    let stored_at = Arc::new(OnceLock::new());
    let holding = {
        let (holder, key, stored_at) = (fleet.holder.clone(), key.clone(), stored_at.clone());
        let value = format!("value of {key}");
        tokio::spawn(async move {
            holder
                .get_or_compute(&key, TTL, || async move {
                    let _ = acquired_tx.send(());
                    let _ = release_rx.await;
                    let _ = stored_at.set(Instant::now());
                    Ok::<_, std::io::Error>(value)
                })
                .await
        })
    };
    acquired.await.expect("the holder takes the lock");
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..WAITERS {
        let (cache, key) = (fleet.caches[i % fleet.caches.len()].clone(), key.clone());
        waiters.spawn(async move {
            let value = cache
                .get_or_compute(&key, TTL, || async {
                    Err::<String, _>("a waiter computed: the lock did not hold")
                })
                .await;
            (Instant::now(), value)
        });
    }
    tokio::time::sleep(HOLD).await;
    let _ = release.send(());
    holding.await.expect("the holder task").expect("its value");
    let stored_at = *stored_at.get().expect("the holder computed");
    let mut samples = Vec::with_capacity(WAITERS);
    while let Some(joined) = waiters.join_next().await {
        let (returned_at, value) = joined.expect("a waiter task");
        assert_eq!(value.expect("a waiter's value"), format!("value of {key}"));
        samples.push(returned_at.saturating_duration_since(stored_at));
    }
    samples
}

async fn wakeup(target: &Target, fleet: &Fleet) {
    // The node whose sharded channel carries the first round's wake-ups (on a cluster each
    // round's key has a slot, and a node, of its own).
    let key_node = match target {
        Target::One(_) => 0,
        Target::Cluster(cluster) => cluster.master_of(&format!("{}:{{wake-0}}", fleet.namespace)),
    };
    let mut samples = Vec::with_capacity(WAITERS * WAKEUP_ROUNDS);
    for round in 0..WAKEUP_ROUNDS {
        samples.extend(wakeup_round(fleet, format!("wake-{round}")).await);
    }
    samples.sort_unstable();
    let pct = |p: f64| support::percentile_ms(&samples, p);
    println!(
        "{} measure=wakeup waiters={WAITERS} rounds={WAKEUP_ROUNDS} samples={} p50_ms={:.3} \
         p90_ms={:.3} p99_ms={:.3} max_ms={:.3} first_key_node={key_node}",
        fleet.label,
        samples.len(),
        pct(50.0),
        pct(90.0),
        pct(99.0),
        pct(100.0)
    );
}

/// Every measurement of one fleet, in order (the hits read what `fill` computed).
async fn run(target: &Target, size: usize, near: Near) {
    let fleet = fleet(target, size, near).await;
    let ops = sequential_ops(size);
    let idle = measure(target, &fleet, "idle", 0.0, async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        0
    })
    .await;
    // The values the `set`s replace, written first (not measured).
    sets(&fleet, ops).await;
    measure(target, &fleet, "set", idle, sets(&fleet, ops)).await;
    measure(target, &fleet, "fill", idle, fills(&fleet, 0, ops)).await;
    // The rest of the keys the hits read, filled unmeasured.
    fills(&fleet, ops, OPS).await;
    measure(target, &fleet, "hit_load", idle, hit_load(&fleet)).await;
    measure(target, &fleet, "set_load", idle, set_load(&fleet)).await;
    wakeup(target, &fleet).await;
}

/// The client's runtime: [`CLIENT_THREADS`] (a current-thread runtime, as the other Redis
/// benches have), or as many worker threads as `STAMPEDE_FLEET_THREADS` says, for a machine
/// with cores to spare. On this 2-core machine two client threads did not lower what the server
/// spends: under load the same per `set`, one at a time up to half again as much (on loopback,
/// waking the client's idle threads is charged to the server's core), and the client's threads
/// and the server then share two cores (`docs/history/past-one-redis.md`). Each line's `bound`
/// says whether the server, the machine or the client ran out.
fn client_runtime() -> tokio::runtime::Runtime {
    let threads = std::env::var("STAMPEDE_FLEET_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CLIENT_THREADS)
        .max(1);
    if threads == 1 {
        return support::load::runtime();
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A comma-separated list from the environment, or `all`.
fn chosen<T: Copy>(var: &str, all: &[T], parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    match std::env::var(var) {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').filter_map(|s| parse(s.trim())).collect()
        }
        _ => all.to_vec(),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    if support::bench_filtered_out("fleet_size") {
        return;
    }
    let sizes = chosen("STAMPEDE_FLEET_SIZES", &SIZES, |s| s.parse().ok());
    let targets = chosen("STAMPEDE_FLEET_TARGETS", &["one", "cluster"], |s| {
        ["one", "cluster"].into_iter().find(|t| *t == s)
    });
    let rt = client_runtime();
    let started = Instant::now();
    if targets.contains(&"one") {
        for &size in &sizes {
            for near in Near::ALL {
                // A server per fleet: nothing left over from the fleet before.
                let target = Target::One(RedisServer::start());
                rt.block_on(run(&target, size, near));
            }
        }
    }
    if targets.contains(&"cluster") {
        let target = Target::Cluster(RedisCluster::start());
        // Without the announcing fleets: the bench would pass its few minutes.
        for &size in &sizes {
            for near in [Near::Off, Near::Tracking] {
                rt.block_on(run(&target, size, near));
            }
        }
    }
    println!(
        "fleet_size measure=total secs={:.0}",
        started.elapsed().as_secs_f64()
    );
}
