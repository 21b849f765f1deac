//! Lock acquire + release latency: a single-node `Lock` against a Redlock over five independent
//! nodes, all on loopback. Each sample is one uncontended `acquire()` followed by `release()`,
//! timed with `Instant`s. Prints p50/p99/max for both.
//!
//! A custom harness (`harness = false`), since criterion reports means, not tails:
//! `cargo bench --bench lock_latency`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod server;
    pub use {bench::*, server::*};
}

use std::time::{Duration, Instant};

use stampede_guard::{Lock, Redlock};
use support::RedisServer;

const SAMPLES: usize = 2_000;

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
            let mut samples = Vec::with_capacity(SAMPLES);
            for i in 0..SAMPLES + 100 {
                let started = Instant::now();
                let guard = lock.acquire().await.expect("uncontended");
                guard.release().await.expect("still held");
                // The first hundred warm the connections and load the scripts.
                if i >= 100 {
                    samples.push(started.elapsed());
                }
            }
            samples.sort();
            let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
            println!(
                "lock_latency {name}: acquire+release p50 {:?}, p99 {:?}, max {:?} ({SAMPLES} samples)",
                at(0.50),
                at(0.99),
                samples.last().copied().unwrap_or(Duration::ZERO),
            );
        }
    });
}
