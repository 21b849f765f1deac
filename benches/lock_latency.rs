//! Lock acquire + release latency: a single-node `Lock` against a Redlock over five independent
//! nodes, all on loopback. Each sample is one uncontended `acquire()` followed by `release()`,
//! timed with `Instant`s. Prints p50/p99/max for both.
//!
//! Then failover-safe locks (`ConnectionOptions::wait_for_replicas(1, 1 s)`), on a master with
//! one replica, off against on: the same acquire + release, a cache's cold miss
//! (`get_or_compute` of a fresh key: read-or-lock, compute, store-and-unlock), and a cache's
//! hits while another task takes cold misses on the same cache (does a `WAIT` hold up the
//! hits? It goes over a connection of its own, so it should not).
//!
//! A custom harness (`harness = false`), since criterion reports means, not tails:
//! `cargo bench --bench lock_latency`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod poll;
    pub mod replicated;
    pub mod server;
    pub use {bench::*, server::*};
}

use std::time::{Duration, Instant};

use stampede_guard::{Cache, ConnectionOptions, Lock, Redlock};
use support::replicated::Replicated;
use support::RedisServer;

const SAMPLES: usize = 2_000;
/// The first samples of each run warm the connections and load the scripts.
const WARM_UP: usize = 100;
const TTL: Duration = Duration::from_secs(600);

/// Prints the p50, p99 and max of `samples`.
fn report(name: &str, what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "lock_latency {name}: {what} p50 {:?}, p99 {:?}, max {:?} ({} samples)",
        at(0.50),
        at(0.99),
        samples.last().copied().unwrap_or(Duration::ZERO),
        samples.len(),
    );
}

/// `SAMPLES` uncontended acquire + release rounds of `lock`, after the warm-up.
async fn acquire_release(lock: &Lock) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES + WARM_UP {
        let started = Instant::now();
        let guard = lock.acquire().await.expect("uncontended");
        guard.release().await.expect("still held");
        if i >= WARM_UP {
            samples.push(started.elapsed());
        }
    }
    samples
}

/// `SAMPLES` cold misses of `cache` (a fresh key each), after the warm-up.
async fn cold_misses(cache: &Cache, prefix: &str) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES + WARM_UP {
        let started = Instant::now();
        let key = format!("{prefix}-{i}");
        let value: u64 = cache
            .get_or_compute(&key, TTL, move || async move { Ok::<_, String>(i as u64) })
            .await
            .expect("computed");
        assert_eq!(value, i as u64);
        if i >= WARM_UP {
            samples.push(started.elapsed());
        }
    }
    samples
}

/// Hits of one warm key, each timed, while another task takes cold misses on the same cache
/// until the hits are done.
async fn hits_beside_misses(cache: &Cache) -> Vec<Duration> {
    let _: u64 = cache
        .get_or_compute("warm", TTL, || async { Ok::<_, String>(7) })
        .await
        .expect("warmed");
    let done = std::sync::atomic::AtomicBool::new(false);
    let misses = async {
        let mut i = 0u64;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let key = format!("beside-{i}");
            let _: u64 = cache
                .get_or_compute(&key, TTL, move || async move { Ok::<_, String>(i) })
                .await
                .expect("computed");
            i += 1;
        }
    };
    let hits = async {
        let mut samples = Vec::with_capacity(SAMPLES);
        for i in 0..SAMPLES + WARM_UP {
            let started = Instant::now();
            let value: u64 = cache
                .get_or_compute("warm", TTL, || async { Ok::<_, String>(0) })
                .await
                .expect("a hit");
            assert_eq!(value, 7);
            if i >= WARM_UP {
                samples.push(started.elapsed());
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        samples
    };
    tokio::join!(misses, hits).1
}

/// The failover-safe rows: on a master with one replica, `wait_for_replicas` off and on.
async fn replicated_rows(servers: &Replicated) {
    for (name, connection) in [
        ("replicated, WAIT off", ConnectionOptions::default()),
        (
            "replicated, WAIT on",
            ConnectionOptions::default().wait_for_replicas(1, Duration::from_secs(1)),
        ),
    ] {
        let namespace = name.replace([',', ' '], "-");
        let lock = Lock::builder("bench")
            .namespace(namespace.as_str())
            .redis_url(servers.master.url())
            .connection(connection.clone())
            .build()
            .await
            .expect("a lock");
        report(name, "acquire+release", acquire_release(&lock).await);
        let cache = Cache::builder()
            .redis_url(servers.master.url())
            .namespace(namespace.as_str())
            .connection(connection)
            .build()
            .await
            .expect("a cache");
        report(name, "cache cold miss", cold_misses(&cache, "cold").await);
        report(
            name,
            "cache hit beside cold misses",
            hits_beside_misses(&cache).await,
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    if support::bench_filtered_out("lock_latency") {
        return;
    }
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let single = Lock::builder("bench")
            .redis_url(nodes[0].url())
            .build()
            .await
            .expect("a lock");
        let quorum = Redlock::builder("bench")
            .nodes(nodes.iter().map(RedisServer::url))
            .namespace("redlock")
            .build()
            .await
            .expect("a redlock");
        for (name, lock) in [("single node", single), ("Redlock, 5 nodes", quorum)] {
            report(name, "acquire+release", acquire_release(&lock).await);
        }
        replicated_rows(&Replicated::start()).await;
    });
}
