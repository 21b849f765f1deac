//! Near-tier coherence latency: instance A changes a key (`set`, or `invalidate` every other
//! sample) while instance B holds a near copy of it; each sample is the time from A's call
//! returning to B's first read that no longer returns the old value (B reads in a loop: from its
//! near tier until the announcement drops the copy, then from Redis). Both instances live in this
//! process, each with its own connections, as two processes would have. Prints p50/p90/p99/max
//! (target: p99 ≤ 5 ms on loopback).
//!
//! A custom harness (`harness = false`), since criterion reports means, not tails:
//! `cargo bench --bench near_coherence`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod percentile;
    pub mod server;
    pub use {bench::*, percentile::*, server::*};
}

use std::time::{Duration, Instant};

use stampede_guard::{Cache, NearCacheOptions};
use support::RedisServer;

const SAMPLES: usize = 2_000;
const TTL: Duration = Duration::from_secs(300);
const KEY: &str = "2019-05";

async fn cache(url: &str) -> Cache {
    Cache::builder()
        .redis_url(url)
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

async fn measure(url: &str) -> Vec<Duration> {
    let (a, b) = (cache(url).await, cache(url).await);
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let old = format!("v{i}");
        let _ = a.set(KEY, &old, TTL).await.expect("set");
        near_copy(&b, &old).await;
        if i % 2 == 0 {
            let _ = a.set(KEY, &format!("w{i}"), TTL).await.expect("set");
        } else {
            let _ = a.invalidate(KEY).await.expect("invalidate");
        }
        let changed = Instant::now();
        while read(&b).await == old {
            tokio::task::yield_now().await;
        }
        samples.push(changed.elapsed());
    }
    samples
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    if support::bench_filtered_out("near_coherence") {
        return;
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut samples = rt.block_on(measure(&server.url()));
    samples.sort_unstable();
    let pct = |p: f64| support::percentile_ms(&samples, p);
    println!(
        "near_coherence: set/invalidate on A returns -> B stops serving the old value, {} samples: \
         p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        pct(50.0),
        pct(90.0),
        pct(99.0),
        pct(100.0)
    );
}
