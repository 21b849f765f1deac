//! Tags and clear (issue 23, figures in `docs/tags.md`), each part against a redis-server this
//! bench starts on a free loopback port (`STAMPEDE_REDIS_SERVER` picks the program):
//! - `tags_warm_read` (criterion): a warm `get_or_compute` on Redis of a value with no tags, of
//!   one with 3 tags the handle names ([`CallOptions::tags`]: their epochs ride in the value's
//!   `MGET`), and of one with 3 tags only its computation gave ([`Computed::tags`]: one more
//!   `MGET`). Interleaved ratios against the tagless read (target: 3 tags within 1.2×).
//! - `tags_near_hit` (criterion): the same three reads answered by a near tier (target: within
//!   noise of the tagless near hit).
//! - `tags_invalidate` (printed): 100,000 values tagged `year:2019` (and 1,000 tagged
//!   `year:2020` that must survive), then `invalidate_tag("year:2019")`: its latency (the first
//!   call, then p50/p99 of 1,000 more) and the commands the server ran for it (`INFO
//!   commandstats`, scripts' inner commands included); against `invalidate_many` of the same
//!   100,000 keys (refilled first; 20,000 keys a call, the batch limit). Targets: ≤ 4 commands,
//!   p99 < 5 ms.
//! - `tags_clear` (printed): `clear()` of a namespace of 1,000,000 values: its latency and
//!   commands; then 4 instances with near tiers, each holding copies of 16 keys, and the time
//!   from another instance's `clear()` returning until every tier stops serving them (target:
//!   ≤ `max_staleness`).
//!
//! Every value is written by the crate (`get_or_compute_many`, batches of 1,000), never by raw
//! commands. Each removal is checked, not assumed: a sample of the keys is read back with
//! `fetch_many` before (all hits) and after (all computed again).
//!
//! `cargo bench --bench tags`; one part: `cargo bench --bench tags -- tags_clear`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod commandstats;
    pub mod load;
    pub mod percentile;
    pub mod server;
    pub use {bench::*, commandstats::*, load::*, percentile::*, server::*};
}

use std::collections::BTreeMap;
use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use stampede_guard::{Cache, CallOptions, Computed, NearCacheOptions, Source, MAX_BATCH_KEYS};
use support::{runtime, value, RedisServer};

const TTL: Duration = Duration::from_secs(3600);
/// The tags of the tagged reads.
const TAGS: [&str; 3] = ["tenant:7", "year:2019", "report:sales"];
/// The value of the warm reads: the load generator's 1,024 bytes, as in `cache_ops`.
/// The bulk parts: values tagged `TAG`, and how they are written.
const TAG: &str = "year:2019";
const TAGGED_VALUES: usize = 100_000;
const CONTROL_VALUES: usize = 1_000;
const CLEARED_VALUES: usize = 1_000_000;
const FILL_BATCH: usize = 1_000;
/// Batches written at once: enough to keep the server busy on a 2-core machine.
const FILL_IN_FLIGHT: usize = 8;
/// One key in this many is read back before and after each removal.
const SAMPLE_EVERY: usize = 100;
const REPEATS: usize = 1_000;

/// The near-tier part.
const TIERS: usize = 4;
const TIER_KEYS: usize = 16;
const CLEAR_ROUNDS: usize = 300;
/// `NearCacheOptions`'s default.
const MAX_STALENESS: Duration = Duration::from_secs(1);

async fn redis_cache(server: &RedisServer, namespace: &str, near: bool) -> Cache {
    let builder = Cache::builder()
        .redis_url(server.url())
        .namespace(namespace);
    let builder = if near {
        builder.near_cache(NearCacheOptions::new(1_000).max_staleness(MAX_STALENESS))
    } else {
        builder
    };
    builder.build().await.expect("a cache")
}

fn tagged(cache: &Cache, tags: &[&str]) -> Cache {
    cache.with_options(CallOptions::default().tags(tags.iter().copied()))
}

// ---------------------------------------------------------------------------------------------
// The warm reads (criterion, with interleaved ratios)
// ---------------------------------------------------------------------------------------------

/// A read of a warm key: a hit, or the bench is wrong.
async fn warm_hit(cache: &Cache, key: &str) {
    let v: String = cache
        .get_or_compute(key, TTL, || async {
            Err::<String, _>("the key is warm: a hit must not compute")
        })
        .await
        .expect("a hit");
    black_box(v);
}

/// The handles of the three warm reads: untagged, and naming [`TAGS`].
struct Reads {
    plain: Cache,
    by_handle: Cache,
}

impl Reads {
    /// Writes the three values: `plain` untagged, `handle-tags` through a handle that names
    /// [`TAGS`], `computed-tags` tagged by its computation only. The tags were invalidated
    /// once before, so their epoch keys exist, as they do in a cache that uses them.
    async fn write(cache: &Cache) -> Self {
        let by_handle = tagged(cache, &TAGS);
        let _ = cache.invalidate_tags(TAGS).await.expect("invalidate_tags");
        let _ = cache.set("plain", &value(), TTL).await.expect("set");
        let _ = by_handle
            .set("handle-tags", &value(), TTL)
            .await
            .expect("set");
        let fetched = cache
            .fetch("computed-tags", TTL, |_| async {
                Ok::<_, std::io::Error>(Computed::new(value()).tags(TAGS))
            })
            .await
            .expect("fetch");
        assert_eq!(fetched.source, Source::Computed);
        Reads {
            plain: cache.clone(),
            by_handle,
        }
    }

    /// Each read with its name: the untagged one first, the baseline of the ratios.
    fn each(&self) -> [(&'static str, &Cache, &'static str); 3] {
        [
            ("tagless", &self.plain, "plain"),
            ("3_tags_by_handle", &self.by_handle, "handle-tags"),
            ("3_tags_by_computation", &self.plain, "computed-tags"),
        ]
    }
}

/// How long `calls` warm reads of `key` take, one after another.
fn timed(rt: &tokio::runtime::Runtime, calls: u32, cache: &Cache, key: &str) -> Duration {
    rt.block_on(async {
        let started = Instant::now();
        for _ in 0..calls {
            warm_hit(cache, key).await;
        }
        started.elapsed()
    })
}

/// Criterion measures two benchmarks seconds apart, and load on a shared 2-core machine moves
/// each by up to ±40 %. This alternates short batches of both and prints the median of the
/// pairs' ratios `measured time / baseline time` (1.00: as fast; 2.00: twice the time).
fn print_ratio(
    label: &str,
    mut measured: impl FnMut() -> Duration,
    mut baseline: impl FnMut() -> Duration,
) {
    const PAIRS: usize = 21;
    let mut ratios: Vec<f64> = (0..PAIRS)
        .map(|_| {
            let m = measured();
            m.as_secs_f64() / baseline().as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "ratio {label}: takes {:.2}x the tagless read's time (median of {PAIRS} interleaved \
         batch pairs; range {:.2}-{:.2})",
        ratios[PAIRS / 2],
        ratios[0],
        ratios[PAIRS - 1]
    );
}

/// The criterion group `group` over the three reads of `reads`, then their ratios.
fn compare_reads(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    group: &str,
    reads: &Reads,
    calls: u32,
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    for (name, cache, key) in reads.each() {
        g.bench_function(name, |b| b.to_async(rt).iter(|| warm_hit(cache, key)));
    }
    g.finish();
    let [(_, plain, plain_key), tagged @ ..] = reads.each();
    for (name, cache, key) in tagged {
        print_ratio(
            &format!("{group}/{name}"),
            || timed(rt, calls, cache, key),
            || timed(rt, calls, plain, plain_key),
        );
    }
}

fn warm_read(c: &mut Criterion) {
    // Its interleaved ratios run outside criterion's own filtering.
    if support::bench_filtered_out("tags_warm_read") {
        return;
    }
    let server = RedisServer::start();
    let rt = runtime();
    let reads = rt.block_on(async {
        let cache = redis_cache(&server, "tags-read", false).await;
        Reads::write(&cache).await
    });
    compare_reads(c, &rt, "tags_warm_read", &reads, 2_000);
    drop(server);
}

/// Reads `key` until the near tier of `cache` answers it.
async fn until_near_hit(cache: &Cache, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let hits = cache.stats().near_hits;
        warm_hit(cache, key).await;
        if cache.stats().near_hits > hits {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the near tier never served {key}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn near_hit(c: &mut Criterion) {
    // Its interleaved ratios run outside criterion's own filtering.
    if support::bench_filtered_out("tags_near_hit") {
        return;
    }
    let server = RedisServer::start();
    let rt = runtime();
    let reads = rt.block_on(async {
        let cache = redis_cache(&server, "tags-near", true).await;
        let reads = Reads::write(&cache).await;
        for (_, cache, key) in reads.each() {
            until_near_hit(cache, key).await;
        }
        reads
    });
    let redis_reads_before = reads.plain.stats().near_misses;
    compare_reads(c, &rt, "tags_near_hit", &reads, 100_000);
    println!(
        "tags_near_hit: {} of the measured calls went to Redis",
        reads.plain.stats().near_misses - redis_reads_before
    );
    drop(server);
}

// ---------------------------------------------------------------------------------------------
// Filling, checking, timing (the printed parts)
// ---------------------------------------------------------------------------------------------

/// Each call of a computation answers a value no call answered before, so that a read can tell
/// a value computed after a removal from the one it removed.
fn fresh_value() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("computed #{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Writes a value for each of `keys` through `handle` (with its tags): `get_or_compute_many`
/// of [`FILL_BATCH`] keys, [`FILL_IN_FLIGHT`] batches at once. Returns how long it took.
async fn fill(handle: &Cache, keys: &[String]) -> Duration {
    let started = Instant::now();
    let mut batches = tokio::task::JoinSet::new();
    for chunk in keys.chunks(FILL_BATCH) {
        if batches.len() == FILL_IN_FLIGHT {
            batches
                .join_next()
                .await
                .expect("a batch")
                .expect("a batch task");
        }
        let (handle, chunk) = (handle.clone(), chunk.to_vec());
        batches.spawn(async move {
            let values = handle
                .get_or_compute_many(&chunk, TTL, |missing: Vec<String>| async move {
                    let values = missing.into_iter().map(|key| (key, fresh_value()));
                    Ok::<_, std::io::Error>(values.collect::<Vec<_>>())
                })
                .await;
            for v in values {
                v.expect("a value written");
            }
        });
    }
    while let Some(done) = batches.join_next().await {
        done.expect("a batch task");
    }
    started.elapsed()
}

/// How many of `keys` a batch read through `handle` computed (the others were hits). The
/// computed ones are cached again, so a later check finds them as hits.
async fn computed_of(handle: &Cache, keys: &[String]) -> usize {
    let mut computed = 0;
    for chunk in keys.chunks(FILL_BATCH) {
        let read = handle
            .fetch_many(chunk, TTL, |missing| async move {
                let values = missing
                    .into_iter()
                    .map(|(key, _lease)| (key, Computed::new(fresh_value())));
                Ok::<_, std::io::Error>(values.collect::<Vec<_>>())
            })
            .await;
        computed += read
            .into_iter()
            .filter(|r| r.as_ref().expect("a batch read").source == Source::Computed)
            .count();
    }
    computed
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:07}")).collect()
}

fn sample(keys: &[String]) -> Vec<String> {
    keys.iter().step_by(SAMPLE_EVERY).cloned().collect()
}

/// Times one call of `op`.
async fn timed_once<F: Future<Output = ()>>(op: F) -> Duration {
    let started = Instant::now();
    op.await;
    started.elapsed()
}

/// `n` samples of `op`, one after another, sorted; with the commands the server ran for all
/// of them.
async fn repeated<F: Future<Output = ()>>(
    server: &RedisServer,
    n: usize,
    mut op: impl FnMut() -> F,
) -> (Vec<Duration>, BTreeMap<String, u64>) {
    support::reset_command_stats(server);
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        samples.push(timed_once(op()).await);
    }
    let commands = support::commands_since_reset(server);
    samples.sort_unstable();
    (samples, commands)
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn percentiles(samples: &[Duration]) -> String {
    let pct = |p: f64| support::percentile_ms(samples, p);
    format!(
        "{} samples: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        pct(50.0),
        pct(90.0),
        pct(99.0),
        pct(100.0)
    )
}

/// `commands` divided by `calls`, with the total and each command's share.
fn per_call(commands: &BTreeMap<String, u64>, calls: usize) -> String {
    let total: u64 = commands.values().sum();
    let each: Vec<String> = commands
        .iter()
        .map(|(name, n)| format!("{name} {}", *n as f64 / calls as f64))
        .collect();
    format!(
        "{} commands per call ({})",
        total as f64 / calls as f64,
        each.join(", ")
    )
}

/// The server's `used_memory_human` and key count.
fn memory(server: &RedisServer) -> String {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut server.conn())
        .expect("INFO");
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory_human:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut server.conn())
        .expect("DBSIZE");
    format!("{keys} keys, {used} used")
}

// ---------------------------------------------------------------------------------------------
// invalidate_tag over 100,000 values, against invalidate_many
// ---------------------------------------------------------------------------------------------

async fn invalidate(server: &RedisServer) {
    let cache = redis_cache(server, "tags-bench", false).await;
    let year = tagged(&cache, &[TAG]);
    let other = tagged(&cache, &["year:2020"]);
    let keys = keys("r", TAGGED_VALUES);
    let control = keys_of_other_year();
    let took = fill(&year, &keys).await;
    fill(&other, &control).await;
    println!(
        "tags_invalidate: filled {TAGGED_VALUES} values tagged {TAG} in {:.1} s ({}), and \
         {CONTROL_VALUES} tagged year:2020",
        took.as_secs_f64(),
        memory(server)
    );
    let sample = sample(&keys);
    assert_eq!(
        computed_of(&year, &sample).await,
        0,
        "every sampled value is warm"
    );

    support::reset_command_stats(server);
    let first = timed_once(async {
        let _ = cache.invalidate_tag(TAG).await.expect("invalidate_tag");
    })
    .await;
    let commands = support::commands_since_reset(server);
    println!(
        "tags_invalidate: invalidate_tag over {TAGGED_VALUES} values: {}, {}",
        ms(first),
        per_call(&commands, 1)
    );
    assert_eq!(
        computed_of(&year, &sample).await,
        sample.len(),
        "every sampled value is gone"
    );
    assert_eq!(
        computed_of(&other, &control).await,
        0,
        "the other tag's values stay"
    );

    let (samples, commands) = repeated(server, REPEATS, || async {
        let _ = cache.invalidate_tag(TAG).await.expect("invalidate_tag");
    })
    .await;
    println!(
        "tags_invalidate: invalidate_tag again, {}; {}",
        percentiles(&samples),
        per_call(&commands, REPEATS)
    );

    invalidate_many(server, &year, &keys).await;
}

fn keys_of_other_year() -> Vec<String> {
    keys("c", CONTROL_VALUES)
}

/// `invalidate_many` of the same keys, refilled first: [`MAX_BATCH_KEYS`] keys a call, one call
/// after another (what an application that holds the keys would do). Three rounds.
async fn invalidate_many(server: &RedisServer, year: &Cache, keys: &[String]) {
    let sample = sample(keys);
    for round in 1..=3 {
        let took = fill(year, keys).await;
        assert_eq!(
            computed_of(year, &sample).await,
            0,
            "every sampled value is warm"
        );
        support::reset_command_stats(server);
        let mut calls = Vec::new();
        let whole = timed_once(async {
            for chunk in keys.chunks(MAX_BATCH_KEYS) {
                let call = timed_once(async {
                    let _ = year.invalidate_many(chunk).await.expect("invalidate_many");
                });
                calls.push(call.await);
            }
        })
        .await;
        let commands = support::commands_since_reset(server);
        let calls: Vec<String> = calls.into_iter().map(ms).collect();
        println!(
            "tags_invalidate: invalidate_many of the same {} keys (round {round}, refilled in \
             {:.1} s): {} in {} calls of {MAX_BATCH_KEYS} keys ({}), {}",
            keys.len(),
            took.as_secs_f64(),
            ms(whole),
            calls.len(),
            calls.join(", "),
            per_call(&commands, 1)
        );
        assert_eq!(
            computed_of(year, &sample).await,
            sample.len(),
            "every sampled value is gone"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// clear() over 1,000,000 values, and 4 near tiers
// ---------------------------------------------------------------------------------------------

async fn clear(server: &RedisServer) {
    let cache = redis_cache(server, "clear-bench", false).await;
    let keys = keys("m", CLEARED_VALUES);
    let took = fill(&cache, &keys).await;
    println!(
        "tags_clear: filled {CLEARED_VALUES} values in {:.1} s ({})",
        took.as_secs_f64(),
        memory(server)
    );
    let sample = sample(&keys);
    assert_eq!(
        computed_of(&cache, &sample).await,
        0,
        "every sampled value is warm"
    );

    support::reset_command_stats(server);
    let first = timed_once(async {
        let _ = cache.clear().await.expect("clear");
    })
    .await;
    let commands = support::commands_since_reset(server);
    println!(
        "tags_clear: clear() over {CLEARED_VALUES} values: {}, {}",
        ms(first),
        per_call(&commands, 1)
    );
    assert_eq!(
        computed_of(&cache, &sample).await,
        sample.len(),
        "every sampled value is gone"
    );

    let (samples, commands) = repeated(server, REPEATS, || async {
        let _ = cache.clear().await.expect("clear");
    })
    .await;
    println!(
        "tags_clear: clear() again, {}; {}",
        percentiles(&samples),
        per_call(&commands, REPEATS)
    );

    near_tiers(server, &cache, &keys[..TIER_KEYS]).await;
    println!("tags_clear: at the end: {}", memory(server));
}

/// A read through a tier: its copy, or Redis, or a computation.
async fn read(tier: &Cache, key: &str) -> String {
    tier.get_or_compute(key, TTL, || async {
        Ok::<_, std::io::Error>(fresh_value())
    })
    .await
    .expect("a read")
}

/// Reads until every tier answers every key from its near copy in one pass (a copy filled
/// before another tier's write of the key was reported may go in between); returns the values.
async fn hold_copies(tiers: &[Cache], keys: &[String]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut held = true;
        let mut values = Vec::new();
        for tier in tiers {
            let hits = tier.stats().near_hits;
            values.clear();
            for key in keys {
                values.push(read(tier, key).await);
            }
            held &= tier.stats().near_hits == hits + keys.len() as u64;
        }
        if held {
            return values;
        }
        assert!(Instant::now() < deadline, "the tiers never held every key");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// When a tier stopped serving, after the clear returned: the first read of the first key that
/// did not answer the old value began at `began` and returned at `returned` (a read that goes
/// to Redis after the clear computes the value again, inside that read).
#[derive(Debug, Clone, Copy, Default)]
struct Stopped {
    began: Duration,
    returned: Duration,
}

/// After `cleared`: reads the first key through `tier` until it no longer answers `old`, then
/// checks that it answers none of the other keys' old values either (a clear is one epoch).
async fn stops_serving(tier: &Cache, keys: &[String], old: &[String], cleared: Instant) -> Stopped {
    loop {
        let began = cleared.elapsed();
        if read(tier, &keys[0]).await != old[0] {
            let returned = cleared.elapsed();
            for (key, old) in keys.iter().zip(old) {
                assert_ne!(
                    &read(tier, key).await,
                    old,
                    "a tier served {key} after the clear"
                );
            }
            return Stopped { began, returned };
        }
        tokio::task::yield_now().await;
    }
}

async fn near_tiers(server: &RedisServer, clearer: &Cache, keys: &[String]) {
    let mut tiers = Vec::with_capacity(TIERS);
    for _ in 0..TIERS {
        tiers.push(redis_cache(server, "clear-bench", true).await);
    }
    let (mut began, mut returned) = (Vec::new(), Vec::new());
    let mut clears = Vec::with_capacity(CLEAR_ROUNDS);
    for _ in 0..CLEAR_ROUNDS {
        let old = hold_copies(&tiers, keys).await;
        let clear = Instant::now();
        let _ = clearer.clear().await.expect("clear");
        let cleared = Instant::now();
        clears.push(cleared - clear);
        let mut polls = tokio::task::JoinSet::new();
        for tier in &tiers {
            let (tier, keys, old) = (tier.clone(), keys.to_vec(), old.clone());
            polls.spawn(async move { stops_serving(&tier, &keys, &old, cleared).await });
        }
        // The last of the tiers to stop.
        let mut last = Stopped::default();
        while let Some(stopped) = polls.join_next().await {
            let stopped = stopped.expect("a tier's poll");
            last.began = last.began.max(stopped.began);
            last.returned = last.returned.max(stopped.returned);
        }
        began.push(last.began);
        returned.push(last.returned);
    }
    for samples in [&mut began, &mut returned, &mut clears] {
        samples.sort_unstable();
    }
    println!(
        "tags_clear: {TIERS} near tiers, each holding {TIER_KEYS} keys (max_staleness {} ms); \
         another instance's clear() returns -> the last tier's first read not served the old \
         value begins: {}",
        MAX_STALENESS.as_millis(),
        percentiles(&began)
    );
    println!(
        "tags_clear: ... and returns (with the value computed again): {}",
        percentiles(&returned)
    );
    println!(
        "tags_clear: those clear() calls (with {TIERS} near tiers listening), {}",
        percentiles(&clears)
    );
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    warm_read(&mut criterion);
    near_hit(&mut criterion);
    // `cargo bench` passes `--bench`; a filter that does not name a part skips it.
    if !support::bench_filtered_out("tags_invalidate") {
        let server = RedisServer::start();
        runtime().block_on(invalidate(&server));
    }
    if !support::bench_filtered_out("tags_clear") {
        let server = RedisServer::start();
        runtime().block_on(clear(&server));
    }
    criterion.final_summary();
}
