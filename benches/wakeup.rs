//! Wake-up latency: one holder computes a key; 100 waiters spread over 4 other `Cache` instances
//! (4 connections, 4 wake-up subscriptions, as 4 processes would have) wait for it. Each sample is
//! the time from the holder's store to one waiter's return, taken with `Instant`s in this one
//! process. Prints p50/p90/p99/max over all rounds (target: p99 ≤ 2 ms on loopback).
//!
//! The holder's timestamp is taken when its computation returns, that is just before the library
//! encodes the value and sends store-and-unlock: the figure includes that script's round trip,
//! the wake-up's publish and delivery, the waiter's read and decode, and the hand-off to the
//! other callers in its process.
//!
//! A custom harness (`harness = false`), since criterion reports means, not tails:
//! `cargo bench --bench wakeup`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod percentile;
    pub mod server;
    pub use {bench::*, percentile::*, server::*};
}

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use stampede_guard::Cache;
use support::RedisServer;
use tokio::sync::oneshot;

const WAITERS: usize = 100;
const INSTANCES: usize = 4;
const ROUNDS: usize = 50;
/// How long the holder keeps the lock once the waiters are started: long enough for all of them
/// to subscribe and park.
const HOLD: Duration = Duration::from_millis(100);
const TTL: Duration = Duration::from_secs(300);

async fn cache(url: &str) -> Cache {
    Cache::builder()
        .redis_url(url)
        .namespace("wakeup-bench")
        .build()
        .await
        .expect("a cache")
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    if support::bench_filtered_out("wakeup") {
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
        "wakeup: {WAITERS} waiters over {INSTANCES} caches, {ROUNDS} rounds, {} samples: \
         p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        pct(50.0),
        pct(90.0),
        pct(99.0),
        pct(100.0)
    );
}

async fn measure(url: &str) -> Vec<Duration> {
    let holder = cache(url).await;
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        instances.push(cache(url).await);
    }
    // Connect every cache and load the scripts before measuring.
    for c in std::iter::once(&holder).chain(&instances) {
        let _: Option<String> = c.get("warm-up").await.expect("Redis answers");
    }

    let mut samples = Vec::with_capacity(WAITERS * ROUNDS);
    for round in 0..ROUNDS {
        let key = format!("report-{round}");
        let (acquired_tx, acquired) = oneshot::channel();
        let (release, release_rx) = oneshot::channel::<()>();
        let stored_at = Arc::new(OnceLock::new());
        let holding = {
            let (holder, key, stored_at) = (holder.clone(), key.clone(), Arc::clone(&stored_at));
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
            let (cache, key) = (instances[i % INSTANCES].clone(), key.clone());
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
        holding
            .await
            .expect("the holder task")
            .expect("the holder's value");
        let stored_at = *stored_at.get().expect("the holder computed");
        while let Some(joined) = waiters.join_next().await {
            let (returned_at, value) = joined.expect("a waiter task");
            assert_eq!(
                value.expect("a waiter's value"),
                format!("value of {key}"),
                "a waiter read the wrong value"
            );
            samples.push(returned_at.saturating_duration_since(stored_at));
        }
    }
    samples
}
