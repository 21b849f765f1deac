//! Criterion benchmarks of single operations, each against a redis-server this bench starts on a
//! free loopback port:
//! - `hit_path`: `get_or_compute` on a warm key vs raw redis-rs `GET` + bincode decode on the
//!   same kind of connection (a `ConnectionManager` with the library's timeouts), at 1 and 64
//!   calls in flight. Throughput ratio = raw time / guarded time (target ≥ 0.9).
//! - `memory_hit`: the embedded store's hit vs `moka::future::Cache::get` and
//!   `moka::sync::Cache::get` of the same value (target ≤ 1.2× moka).
//! - `near_hit`: `get_or_compute` answered by the near tier (`NearCacheOptions`, Redis behind it) vs
//!   `moka::sync::Cache::get` and `moka::future::Cache::get` of the same value (target ≤ 1.5×
//!   moka, either).
//! - `won_miss`: a cold key each iteration: GET, read-or-lock, compute (0 ms), store-and-unlock.
//! - `batch_hit`: `get_or_compute_many` of 12 warm months (one `MGET`) vs one single-key hit
//!   (target: the batch within 1.3× its time) and vs 12 sequential single-key hits (the calls
//!   the batch replaces).
//!
//! The value is the load generator's: a 1024-byte `String`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod commandstats;
    pub mod load;
    pub mod raw;
    pub mod server;
    pub use {bench::*, commandstats::*, load::*, raw::*, server::*};
}

use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use redis::aio::ConnectionManager;
use stampede_guard::{Cache, ConnectionOptions, NearCacheOptions};
use support::{runtime, value, RedisServer};

const KEY: &str = "2019-05";
const RAW_KEY: &str = "raw:2019-05";
const TTL: Duration = Duration::from_secs(3600);

/// Runs `iters` calls of `op` as `in_flight` tasks, each calling it in a loop; returns the time
/// scaled to exactly `iters` calls.
async fn concurrently<F, Fut>(in_flight: u64, iters: u64, op: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = iters.div_ceil(in_flight).max(1);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let op = op.clone();
        tasks.spawn(async move {
            for _ in 0..per_task {
                op().await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a benchmark task panicked");
    }
    started
        .elapsed()
        .mul_f64(iters as f64 / (per_task * in_flight) as f64)
}

async fn warm_hit(cache: &Cache) {
    let v: String = cache
        .get_or_compute(KEY, TTL, || async {
            Err::<String, _>("the key is warm: a hit must not compute")
        })
        .await
        .expect("a hit");
    black_box(v);
}

async fn guarded_hit(cache: Cache) {
    warm_hit(&cache).await
}

/// What an application without the library does: GET, then decode with the same codec.
async fn raw_hit(raw: ConnectionManager) {
    black_box(support::raw_hit(&raw, RAW_KEY).await);
}

/// The commands the server ran since the reset (see `support::commandstats`), but the clock's
/// calibration (`TIME`, in the background).
fn commands_run(server: &RedisServer) -> u64 {
    let mut calls = support::commands_since_reset(server);
    calls.remove("time");
    calls.values().sum()
}

/// Criterion measures the two sides seconds apart, and background load on a shared 2-core
/// machine moves each by up to ±40 %. This alternates short timed batches of both sides and
/// prints the median of the per-pair ratios `baseline time / stampede-guard time`
/// (1.0 = as fast; 0.5 = half the throughput).
fn print_ratio(
    label: &str,
    mut guarded: impl FnMut() -> Duration,
    mut baseline: impl FnMut() -> Duration,
) {
    const PAIRS: usize = 21;
    let mut ratios: Vec<f64> = (0..PAIRS)
        .map(|_| {
            let g = guarded();
            baseline().as_secs_f64() / g.as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[PAIRS / 2];
    println!(
        "ratio {label}: baseline time / stampede-guard time = {median:.2} \
         (median of {PAIRS} interleaved batch pairs; stampede-guard takes {:.2}x the baseline's time)",
        1.0 / median
    );
}

/// The calls each side of an in-process interleaved pair makes per batch.
const OPS: u32 = 100_000;

/// How long `calls` awaited calls of `op` take, one after another, on `rt`.
fn timed<Fut: Future<Output = ()>>(
    rt: &tokio::runtime::Runtime,
    calls: u32,
    mut op: impl FnMut() -> Fut,
) -> Duration {
    rt.block_on(async {
        let started = Instant::now();
        for _ in 0..calls {
            op().await;
        }
        started.elapsed()
    })
}

/// How long [`OPS`] calls of `op` take, one after another.
fn time_sync(mut op: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..OPS {
        op();
    }
    started.elapsed()
}

fn hit_path(c: &mut Criterion) {
    // Its interleaved ratio below runs outside criterion's own filtering.
    if support::bench_filtered_out("hit_path") {
        return;
    }
    let server = RedisServer::start();
    let rt = runtime();
    let (cache, uncoalesced, raw) = rt.block_on(async {
        let cache = Cache::builder()
            .redis_url(server.url())
            .namespace("bench")
            .build()
            .await
            .expect("a cache");
        let uncoalesced = Cache::builder()
            .redis_url(server.url())
            .namespace("bench")
            .connection(ConnectionOptions::default().coalesce_reads(false))
            .build()
            .await
            .expect("a cache");
        let _ = cache.set(KEY, &value(), TTL).await.expect("warm the key");
        // The same settings as the library's data connection, so only the library's own work
        // differs between the two sides.
        let raw = support::raw_connection(&server, RAW_KEY).await;
        (cache, uncoalesced, raw)
    });

    let mut group = c.benchmark_group("hit_path");
    group.throughput(Throughput::Elements(1));
    for in_flight in [1u64, 64] {
        group.bench_function(BenchmarkId::new("get_or_compute", in_flight), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let cache = cache.clone();
                concurrently(in_flight, iters, move || guarded_hit(cache.clone()))
            })
        });
        group.bench_function(BenchmarkId::new("raw_get_decode", in_flight), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let raw = raw.clone();
                concurrently(in_flight, iters, move || raw_hit(raw.clone()))
            })
        });
    }
    group.finish();
    for (reads, cache) in [("coalesced", &cache), ("not coalesced", &uncoalesced)] {
        for (in_flight, ops) in [(1u64, 2_000u64), (64, 20_000)] {
            let (cache, raw) = (cache.clone(), raw.clone());
            print_ratio(
                &format!("hit_path/{in_flight}, reads {reads} (raw redis-rs GET + decode)"),
                || {
                    rt.block_on(concurrently(in_flight, ops, {
                        let cache = cache.clone();
                        move || guarded_hit(cache.clone())
                    }))
                },
                || {
                    rt.block_on(concurrently(in_flight, ops, {
                        let raw = raw.clone();
                        move || raw_hit(raw.clone())
                    }))
                },
            );
            // What the server ran per hit (the raw side's GETs left out).
            const HITS: u64 = 20_000;
            support::reset_command_stats(&server);
            rt.block_on(concurrently(in_flight, HITS, {
                let cache = cache.clone();
                move || guarded_hit(cache.clone())
            }));
            let commands = commands_run(&server);
            println!(
                "commands hit_path/{in_flight}, reads {reads}: {:.3} Redis commands per hit \
                 ({commands} for {HITS} hits)",
                commands as f64 / HITS as f64
            );
        }
    }

    let mut group = c.benchmark_group("won_miss");
    group.throughput(Throughput::Elements(1));
    let next = Arc::new(AtomicU64::new(0));
    group.bench_function("get_or_compute_cold_key", |b| {
        b.to_async(&rt).iter(|| {
            // A key nobody asked for before: the call takes the lock, computes and stores.
            let key = format!("cold-{}", next.fetch_add(1, Ordering::Relaxed));
            let cache = cache.clone();
            async move {
                let v: String = cache
                    .get_or_compute(&key, Duration::from_secs(60), || async {
                        Ok::<_, std::io::Error>(value())
                    })
                    .await
                    .expect("a won miss");
                black_box(v);
            }
        })
    });
    group.finish();
    drop(server);
}

fn memory_hit(c: &mut Criterion) {
    // Its interleaved ratio below runs outside criterion's own filtering.
    if support::bench_filtered_out("memory_hit") {
        return;
    }
    let rt = runtime();
    let cache = Cache::in_memory();
    let moka: moka::future::Cache<String, String> = moka::future::Cache::new(1_000);
    rt.block_on(async {
        let _ = cache.set(KEY, &value(), TTL).await.expect("warm the key");
        moka.insert(KEY.to_owned(), value()).await;
    });

    let mut group = c.benchmark_group("memory_hit");
    group.throughput(Throughput::Elements(1));
    group.bench_function("get_or_compute", |b| {
        b.to_async(&rt).iter(|| warm_hit(&cache))
    });
    group.bench_function("moka_get", |b| {
        b.to_async(&rt).iter(|| async {
            black_box(moka.get(KEY).await.expect("the key is warm"));
        })
    });
    group.finish();
    print_ratio(
        "memory_hit (moka get)",
        || timed(&rt, OPS, || warm_hit(&cache)),
        || {
            timed(&rt, OPS, || async {
                black_box(moka.get(KEY).await.expect("the key is warm"));
            })
        },
    );
    let moka_sync: moka::sync::Cache<String, String> = moka::sync::Cache::new(1_000);
    moka_sync.insert(KEY.to_owned(), value());
    print_ratio(
        "memory_hit (moka::sync get)",
        || timed(&rt, OPS, || warm_hit(&cache)),
        || {
            time_sync(|| {
                black_box(moka_sync.get(KEY).expect("the key is warm"));
            })
        },
    );
}

fn near_hit(c: &mut Criterion) {
    // Its interleaved ratio below runs outside criterion's own filtering.
    if support::bench_filtered_out("near_hit") {
        return;
    }
    let server = RedisServer::start();
    let rt = runtime();
    let moka: moka::sync::Cache<String, String> = moka::sync::Cache::new(1_000);
    moka.insert(KEY.to_owned(), value());
    let cache = rt.block_on(async {
        let cache = Cache::builder()
            .redis_url(server.url())
            .namespace("bench")
            .near_cache(NearCacheOptions::new(1_000))
            .build()
            .await
            .expect("a cache");
        let _ = cache.set(KEY, &value(), TTL).await.expect("warm the key");
        // Until the feed is proven live and the copy is in: then every call is a near hit.
        let deadline = Instant::now() + Duration::from_secs(30);
        while cache.stats().near_hits < 100 {
            assert!(Instant::now() < deadline, "the near tier never served");
            warm_hit(&cache).await;
        }
        cache
    });
    let redis_reads = || cache.stats().near_misses;
    let misses_before = redis_reads();

    let mut group = c.benchmark_group("near_hit");
    group.throughput(Throughput::Elements(1));
    group.bench_function("get_or_compute", |b| {
        b.to_async(&rt).iter(|| warm_hit(&cache))
    });
    group.bench_function("moka_sync_get", |b| {
        b.iter(|| black_box(moka.get(KEY).expect("the key is warm")))
    });
    group.finish();
    print_ratio(
        "near_hit (moka::sync get)",
        || timed(&rt, OPS, || warm_hit(&cache)),
        || {
            time_sync(|| {
                black_box(moka.get(KEY).expect("the key is warm"));
            })
        },
    );
    // The target allows either moka as the baseline; the near tier answers async callers,
    // so `moka::future` is the like-for-like one, and both are printed.
    let moka_future: moka::future::Cache<String, String> = moka::future::Cache::new(1_000);
    rt.block_on(moka_future.insert(KEY.to_owned(), value()));
    print_ratio(
        "near_hit (moka::future get)",
        || timed(&rt, OPS, || warm_hit(&cache)),
        || {
            timed(&rt, OPS, || async {
                black_box(moka_future.get(KEY).await.expect("the key is warm"));
            })
        },
    );
    println!(
        "near_hit: {} of the measured calls went to Redis",
        redis_reads() - misses_before
    );
    drop(server);
}

/// The year's twelve months, as the batch asks for them.
fn months() -> Vec<String> {
    (1..=12).map(|m| format!("2019-{m:02}")).collect()
}

async fn batch_hit_12(cache: &Cache, months: &[String]) {
    let values = cache
        .get_or_compute_many(months, TTL, |_keys| async {
            Err::<Vec<(String, String)>, _>("the keys are warm: a hit must not compute")
        })
        .await;
    for v in values {
        black_box(v.expect("a hit"));
    }
}

async fn sequential_hits_12(cache: &Cache, months: &[String]) {
    for month in months {
        let v: String = cache
            .get_or_compute(month, TTL, || async {
                Err::<String, _>("the key is warm: a hit must not compute")
            })
            .await
            .expect("a hit");
        black_box(v);
    }
}

/// The calls each side of a batch pair makes per batch (each is a round trip or twelve).
const BATCH_OPS: u32 = 500;

fn batch_hit(c: &mut Criterion) {
    // Its interleaved ratios below run outside criterion's own filtering.
    if support::bench_filtered_out("batch_hit") {
        return;
    }
    let server = RedisServer::start();
    let rt = runtime();
    let months = months();
    let cache = rt.block_on(async {
        let cache = Cache::builder()
            .redis_url(server.url())
            .namespace("bench")
            .build()
            .await
            .expect("a cache");
        for month in months.iter().chain([&KEY.to_owned()]) {
            let _ = cache.set(month, &value(), TTL).await.expect("warm the key");
        }
        cache
    });
    let mut group = c.benchmark_group("batch_hit");
    group.bench_function("get_or_compute_many_12", |b| {
        b.to_async(&rt).iter(|| batch_hit_12(&cache, &months))
    });
    group.bench_function("get_or_compute_1", |b| {
        b.to_async(&rt).iter(|| warm_hit(&cache))
    });
    group.bench_function("get_or_compute_12_sequential", |b| {
        b.to_async(&rt).iter(|| sequential_hits_12(&cache, &months))
    });
    group.finish();
    print_ratio(
        "batch_hit/12 (one single-key hit)",
        || timed(&rt, BATCH_OPS, || batch_hit_12(&cache, &months)),
        || timed(&rt, BATCH_OPS, || warm_hit(&cache)),
    );
    print_ratio(
        "batch_hit/12 (12 sequential single-key hits)",
        || timed(&rt, BATCH_OPS, || batch_hit_12(&cache, &months)),
        || timed(&rt, BATCH_OPS, || sequential_hits_12(&cache, &months)),
    );
    drop(server);
}

criterion_group!(benches, hit_path, memory_hit, near_hit, batch_hit);
criterion_main!(benches);
