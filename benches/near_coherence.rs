//! Near-tier coherence latency: a key changes while instance B holds a near copy of it; B reads
//! in a loop (from its near tier until the change's announcement or Redis's tracking report
//! drops the copy, then from Redis). Two figures per sample, from the change returning:
//! - *stops serving*: until B's first read that does not return the old value **starts** (the
//!   copy went before that read looked for it, and after the read before it did), zero when
//!   B's first read after the change already found it gone: the cross-instance window itself;
//!   the line counts the samples where it was not zero;
//! - *returns*: until that read returns, with what it cost (a Redis read; after an
//!   `invalidate`, the miss: lock, computation, write).
//!
//! The changes:
//! - `set`, `invalidate`: instance A's, announced by the crate (the cross-instance window of
//!   `docs/after-commit.md`);
//! - `outside-del`, `outside-set`, `outside-pexpire`, `outside-flushdb`: another program's
//!   `DEL`, `SET`, `PEXPIRE 1`, `FLUSHDB`, sent straight to the server that holds the key (seen
//!   through `CLIENT TRACKING`).
//!
//! Both instances live in this process, each with its own connections, as two processes would
//! have. Runs on one server, then on a Redis Cluster of 3 masters and 3 replicas; prints
//! p50/p90/p99/max per change (target: p99 ≤ 5 ms on loopback, every figure ≤ `max_staleness`).
//! The server is `STAMPEDE_REDIS_SERVER` (default `redis-server`; Valkey's `valkey-server`
//! works the same), named in each line.
//!
//! A custom harness (`harness = false`), since criterion reports means, not tails:
//! `cargo bench --bench near_coherence`. Filters pick measurements by `<target>/<change>`:
//! `cargo bench --bench near_coherence -- server/invalidate` measures only A's `invalidate` on
//! one server (`cluster/` the cluster's; a filter naming the bench runs everything).

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod cluster;
    pub mod percentile;
    pub mod poll;
    pub mod server;
    pub use {bench::*, cluster::*, percentile::*, server::*};
}

use std::time::{Duration, Instant};

use stampede_guard::{Cache, CacheBuilder, NearCacheOptions};
use support::{RedisCluster, RedisServer};

/// Samples of each of the crate's own changes, and of each outside change.
const SAMPLES: usize = 1_000;
const OUTSIDE_SAMPLES: usize = 500;
const TTL: Duration = Duration::from_secs(300);
const KEY: &str = "2019-05";
const VALUE_KEY: &str = "near-bench:{2019-05}";

/// What changes the key.
#[derive(Debug, Clone, Copy)]
enum Change {
    CrateSet,
    CrateInvalidate,
    Del,
    Set,
    Pexpire,
    Flushdb,
}

impl Change {
    const ALL: [Change; 6] = [
        Change::CrateSet,
        Change::CrateInvalidate,
        Change::Del,
        Change::Set,
        Change::Pexpire,
        Change::Flushdb,
    ];

    fn name(self) -> &'static str {
        match self {
            Change::CrateSet => "A's set",
            Change::CrateInvalidate => "A's invalidate",
            Change::Del => "outside DEL",
            Change::Set => "outside SET",
            Change::Pexpire => "outside PEXPIRE 1",
            Change::Flushdb => "outside FLUSHDB",
        }
    }

    /// Its name in a filter.
    fn id(self) -> &'static str {
        match self {
            Change::CrateSet => "set",
            Change::CrateInvalidate => "invalidate",
            Change::Del => "outside-del",
            Change::Set => "outside-set",
            Change::Pexpire => "outside-pexpire",
            Change::Flushdb => "outside-flushdb",
        }
    }
}

/// Whether the filters `cargo bench` was given select the measurement `id`
/// (`<target>/<change>`): none, one naming this bench, or one `id` contains.
fn selected(id: &str) -> bool {
    !support::bench_filtered_out("near_coherence")
        || (support::bench_filters().iter()).any(|f| id.contains(f.as_str()))
}

/// Where the caches and the outside writer connect.
enum Target<'a> {
    Server(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

impl Target<'_> {
    fn builder(&self) -> CacheBuilder {
        match self {
            Target::Server(server) => Cache::builder().redis_url(server.url()),
            Target::Cluster(cluster) => Cache::builder().redis_cluster(cluster.urls()),
        }
    }

    /// A connection to the server that holds the key (its master, on a cluster).
    fn holder(&self) -> redis::Connection {
        match self {
            Target::Server(server) => server.conn(),
            Target::Cluster(cluster) => cluster.nodes[cluster.master_of(VALUE_KEY)].conn(),
        }
    }

    /// The server's name and version, from `INFO server`.
    fn server_version(&self) -> String {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.holder())
            .expect("INFO server");
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .map(str::to_owned)
        };
        match field("valkey_version:") {
            Some(v) => format!("Valkey {v}"),
            None => format!("Redis {}", field("redis_version:").unwrap_or_default()),
        }
    }
}

async fn cache(target: &Target<'_>) -> Cache {
    target
        .builder()
        .namespace("near-bench")
        .near_cache(NearCacheOptions::new(1_000))
        .build()
        .await
        .expect("a cache")
}

async fn read(cache: &Cache) -> String {
    cache
        .get_or_compute(KEY, TTL, || async {
            Ok::<_, std::io::Error>("computed".to_owned())
        })
        .await
        .expect("a read")
}

/// Reads on `b` until its near tier answers with `value`.
async fn near_copy(b: &Cache, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let hits = b.stats().near_hits;
        if read(b).await == value && b.stats().near_hits > hits {
            return;
        }
        assert!(Instant::now() < deadline, "B never held a near copy");
        tokio::task::yield_now().await;
    }
}

/// Each sample's (stops serving, returns): see the file's comment.
async fn measure(target: &Target<'_>, change: Change) -> Vec<(Duration, Duration)> {
    let (a, b) = (cache(target).await, cache(target).await);
    let mut outside = target.holder();
    let samples = match change {
        Change::CrateSet | Change::CrateInvalidate => SAMPLES,
        _ => OUTSIDE_SAMPLES,
    };
    let mut taken = Vec::with_capacity(samples);
    for i in 0..samples {
        let old = format!("v{i}");
        let _ = a.set(KEY, &old, TTL).await.expect("set");
        near_copy(&b, &old).await;
        let mut sent = |cmd: &mut redis::Cmd| {
            cmd.query::<redis::Value>(&mut outside)
                .expect("the outside command");
        };
        match change {
            Change::CrateSet => {
                let _ = a.set(KEY, &format!("w{i}"), TTL).await.expect("set");
            }
            Change::CrateInvalidate => {
                let _ = a.invalidate(KEY).await.expect("invalidate");
            }
            Change::Del => sent(redis::cmd("DEL").arg(VALUE_KEY)),
            Change::Set => sent(redis::cmd("SET").arg(VALUE_KEY).arg("from another program")),
            Change::Pexpire => sent(redis::cmd("PEXPIRE").arg(VALUE_KEY).arg(1)),
            Change::Flushdb => sent(&mut redis::cmd("FLUSHDB")),
        }
        let changed = Instant::now();
        let mut first = true;
        loop {
            let started = Instant::now();
            if read(&b).await != old {
                // Zero when B's first read already found the copy gone.
                let stopped = if first {
                    Duration::ZERO
                } else {
                    started - changed
                };
                taken.push((stopped, changed.elapsed()));
                break;
            }
            first = false;
            tokio::task::yield_now().await;
        }
    }
    taken
}

/// Measures the `changes` on `target`.
async fn report(target: &Target<'_>, label: &str, changes: &[Change]) {
    let server = target.server_version();
    for &change in changes {
        let samples = measure(target, change).await;
        type Pick = fn(&(Duration, Duration)) -> Duration;
        let figures: [(&str, Pick); 2] = [
            ("B stops serving the old value", |s| s.0),
            ("B's first read without it returns", |s| s.1),
        ];
        for (what, pick) in figures {
            let mut taken: Vec<Duration> = samples.iter().map(pick).collect();
            taken.sort_unstable();
            let pct = |p: f64| support::percentile_ms(&taken, p);
            let open = taken.iter().filter(|t| !t.is_zero()).count();
            println!(
                "near_coherence ({server}, {label}): {} returns -> {what}, {} samples \
                 ({open} nonzero): p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
                change.name(),
                taken.len(),
                pct(50.0),
                pct(90.0),
                pct(99.0),
                pct(100.0)
            );
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that names no measurement of this bench skips
    // it, without starting a server.
    let on = |target: &str| -> Vec<Change> {
        (Change::ALL.into_iter())
            .filter(|change| selected(&format!("{target}/{}", change.id())))
            .collect()
    };
    let (on_server, on_cluster) = (on("server"), on("cluster"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if !on_server.is_empty() {
        let server = RedisServer::start();
        rt.block_on(report(&Target::Server(&server), "one server", &on_server));
    }
    if !on_cluster.is_empty() {
        let cluster = RedisCluster::start();
        let target = Target::Cluster(&cluster);
        rt.block_on(report(&target, "cluster of 3 masters", &on_cluster));
    }
}
