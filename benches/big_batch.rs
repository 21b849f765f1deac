//! A big cold batch and everyone else (issue 27): a `get_or_compute_many` of 10,000 keys (100-byte
//! values) against one redis-server with `latency-monitor-threshold 5`, while another client
//! sends a plain `GET` of an unrelated key every millisecond. Prints, per round, the batch's own
//! time (cold, then warm), the server's worst `LATENCY LATEST` event, and the other client's
//! worst `GET`.
//!
//! A custom harness (`harness = false`): `cargo bench --bench big_batch`. The figures and what
//! they mean: docs/batch.md ("A big batch and everyone else").

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod server;
    pub use {bench::*, server::*};
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stampede_guard::Cache;
use support::RedisServer;

/// Keys per batch.
const KEYS: usize = 10_000;
/// Bytes per value.
const VALUE_BYTES: usize = 100;
/// Rounds, each in a namespace of its own (so each cold batch is cold).
const ROUNDS: usize = 5;

/// What one round measured.
struct Round {
    cold: Duration,
    warm: Duration,
    /// The worst event the server's latency monitor recorded during the cold batch: its name and
    /// its max in ms (none: nothing reached the 5 ms threshold).
    worst_event: Option<(String, u64)>,
    /// The other client's worst `GET` during the cold batch, and how many it sent.
    worst_get: Duration,
    gets: usize,
}

fn main() {
    if support::bench_filtered_out("big_batch") {
        return;
    }
    let server = RedisServer::start_with(
        &["--latency-monitor-threshold".to_owned(), "5".to_owned()],
        "",
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let measured = runtime.block_on(one_round(&server, round));
        println!(
            "big_batch round {round}: cold {:.1} ms, warm {:.1} ms, worst latency event {}, \
             other client's worst GET {:.2} ms ({} GETs)",
            ms(measured.cold),
            ms(measured.warm),
            measured
                .worst_event
                .as_ref()
                .map_or("none (all < 5 ms)".to_owned(), |(name, max)| format!(
                    "{name} {max} ms"
                )),
            ms(measured.worst_get),
            measured.gets,
        );
        rounds.push(measured);
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    println!(
        "big_batch summary ({KEYS} keys x {VALUE_BYTES} B, {ROUNDS} rounds): cold median {:.1} ms \
         (max {:.1}), warm median {:.1} ms, worst latency event {} ms, other client's worst GET \
         {:.2} ms",
        ms(median(rounds.iter().map(|r| r.cold).collect())),
        ms(rounds.iter().map(|r| r.cold).max().unwrap_or_default()),
        ms(median(rounds.iter().map(|r| r.warm).collect())),
        rounds
            .iter()
            .filter_map(|r| r.worst_event.as_ref().map(|e| e.1))
            .max()
            .unwrap_or(0),
        ms(rounds.iter().map(|r| r.worst_get).max().unwrap_or_default()),
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One cold batch with the other client probing, then the same batch warm.
async fn one_round(server: &RedisServer, round: usize) -> Round {
    let cache = Cache::builder()
        .redis_url(server.url())
        .namespace(format!("big{round}"))
        .build()
        .await
        .expect("a cache");
    let keys: Vec<String> = (0..KEYS).map(|i| format!("day-{i:05}")).collect();
    // Connections up and scripts loaded before the clock starts, as in a running service.
    let _: Vec<_> = cache
        .get_or_compute_many(["warm-up"], Duration::from_secs(600), compute)
        .await;
    let mut admin = server.conn();
    let _: () = redis::cmd("SET")
        .arg("unrelated")
        .arg("x")
        .query(&mut admin)
        .expect("SET");
    let _: i64 = redis::cmd("LATENCY")
        .arg("RESET")
        .query(&mut admin)
        .expect("LATENCY RESET");

    let probing = Arc::new(AtomicBool::new(true));
    let prober = {
        let probing = Arc::clone(&probing);
        let mut conn = server.conn();
        std::thread::spawn(move || {
            let (mut worst, mut gets) = (Duration::ZERO, 0);
            while probing.load(Ordering::Relaxed) {
                let started = Instant::now();
                let _: Option<String> = redis::cmd("GET")
                    .arg("unrelated")
                    .query(&mut conn)
                    .expect("GET");
                worst = worst.max(started.elapsed());
                gets += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            (worst, gets)
        })
    };
    // Let the prober's first GETs go before the batch starts.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    let cold = cache
        .get_or_compute_many(&keys, Duration::from_secs(600), compute)
        .await;
    let cold_took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(20)).await;
    probing.store(false, Ordering::Relaxed);
    let (worst_get, gets) = prober.join().expect("the prober");
    assert!(cold.iter().all(Result::is_ok), "every key computed");

    let latest: Vec<(String, u64, u64, u64)> = redis::cmd("LATENCY")
        .arg("LATEST")
        .query(&mut admin)
        .expect("LATENCY LATEST");
    let worst_event = latest
        .into_iter()
        .map(|(name, _at, _latest, max)| (name, max))
        .max_by_key(|(_, max)| *max);

    let started = Instant::now();
    let warm = cache
        .get_or_compute_many(&keys, Duration::from_secs(600), compute)
        .await;
    let warm_took = started.elapsed();
    assert!(warm.iter().all(Result::is_ok), "every key read");
    Round {
        cold: cold_took,
        warm: warm_took,
        worst_event,
        worst_get,
        gets,
    }
}

/// The batch's source: a 100-byte value for every key asked, at once.
async fn compute(keys: Vec<String>) -> Result<Vec<(String, String)>, std::io::Error> {
    Ok(keys
        .into_iter()
        .map(|key| {
            let value = format!("{key}:{}", "x".repeat(VALUE_BYTES));
            (key, value[..VALUE_BYTES].to_owned())
        })
        .collect())
}
