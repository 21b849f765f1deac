//! Plain `Bincode` against `Compressed` (LZ4 over bincode, feature `compression`) for a ~1 KiB
//! and a ~100 KiB report (a `Vec` of sales rows, bincode-encoded), each codec on a
//! `redis-server` of its own (started on a free port), so that the servers' counters are each
//! one codec's. Per value and per hit:
//! - bytes stored: `STRLEN` of the value key (envelope included) and `MEMORY USAGE` of it;
//! - Redis memory: `INFO memory` `used_memory` after writing `VALUES` values, less before, per value;
//! - bytes on the wire per hit: `INFO stats` `total_net_output_bytes` over the hits, per hit;
//! - client time per hit: `get_or_compute` on a warm key, 1 in flight (the two codecs' hits
//!   interleaved in batches, so that the shared machine's drift falls on both alike), p50 and mean;
//! - server time per hit: `INFO commandstats` `usec_per_call` of the read command;
//! - the codecs alone, no Redis: decode and encode time of the report, interleaved.
//!
//! A custom harness: `cargo bench --features compression --bench compression`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod server;
    pub use {bench::*, server::*};
}

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stampede_guard::{Bincode, Cache, Codec, Compressed};
use support::RedisServer;

const TTL: Duration = Duration::from_secs(3600);
/// Hits per codec and size are `BATCHES` batches of `hits / BATCHES`, the codecs taking turns.
const BATCHES: usize = 100;
/// Computations run by the hits: none, or a hit was not one.
static COMPUTED: AtomicU64 = AtomicU64::new(0);

/// One row of a monthly sales report: short repeated strings and numbers, as a database gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Row {
    month: String,
    region: String,
    product_id: u64,
    sku: String,
    orders: u64,
    revenue_cents: u64,
    refunds: u32,
    currency: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Report {
    title: String,
    generated_ms: u64,
    rows: Vec<Row>,
}

/// A report of `rows` rows, the same every run (a fixed xorshift sequence).
fn report(rows: usize) -> Report {
    const REGIONS: [&str; 5] = ["north-east", "north-west", "south", "central", "islands"];
    const CURRENCIES: [&str; 5] = ["EUR", "EUR", "EUR", "GBP", "USD"];
    const SIZES: [&str; 4] = ["S", "M", "L", "XL"];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let pick = |n: u64, of: &[&str]| of[usize::try_from(n).unwrap_or(0)].to_owned();
    Report {
        title: "Monthly sales by region and product".into(),
        generated_ms: 1_764_633_600_000,
        rows: (0..rows)
            .map(|i| {
                let product = 10_000 + next(500);
                Row {
                    month: format!("2019-{:02}", 1 + i % 12),
                    region: pick(next(5), &REGIONS),
                    product_id: product,
                    sku: format!("SKU-{product}-{}", pick(next(4), &SIZES)),
                    orders: next(2_000),
                    revenue_cents: next(5_000_000),
                    refunds: u32::try_from(next(40)).unwrap_or(0),
                    currency: pick(next(5), &CURRENCIES),
                }
            })
            .collect(),
    }
}

/// A field of `INFO <section>`, as a number.
fn info_field(conn: &mut redis::Connection, section: &str, name: &str) -> f64 {
    let info: String = redis::cmd("INFO").arg(section).query(conn).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {name}"))
}

/// The read commands' `calls` and `usec_per_call` from `INFO commandstats` (GET, MGET, EVALSHA).
fn read_command_stats(conn: &mut redis::Connection) -> Vec<(String, u64, f64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            };
            let calls = field("calls")?.parse().ok()?;
            let usec_per_call = field("usec_per_call")?.parse().ok()?;
            Some((name.to_owned(), calls, usec_per_call))
        })
        .filter(|(name, _, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

/// One codec's cache and server.
struct Side<C: Codec> {
    name: &'static str,
    server: RedisServer,
    cache: Cache<C>,
    /// Client time of each hit, in order.
    hits: Vec<Duration>,
    /// `total_net_output_bytes` before the first measured hit.
    bytes_out_before: f64,
}

impl<C: Codec> Side<C> {
    async fn new(name: &'static str, codec: C) -> Self {
        let server = RedisServer::start();
        let cache = Cache::builder()
            .redis_url(server.url())
            .namespace("compression")
            .codec(codec)
            .build()
            .await
            .expect("a cache");
        Side {
            name,
            server,
            cache,
            hits: Vec::new(),
            bytes_out_before: 0.0,
        }
    }

    /// Writes `values` copies of `report` under keys `r0..`, and prints what they cost Redis.
    async fn fill(&mut self, report: &Report, values: usize) -> String {
        let mut conn = self.server.conn();
        let before = info_field(&mut conn, "memory", "used_memory");
        for i in 0..values {
            let _ = self
                .cache
                .set(&format!("r{i}"), report, TTL)
                .await
                .expect("a set");
        }
        let after = info_field(&mut conn, "memory", "used_memory");
        let strlen: u64 = redis::cmd("STRLEN")
            .arg("compression:{r0}")
            .query(&mut conn)
            .expect("STRLEN");
        let usage: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg("compression:{r0}")
            .query(&mut conn)
            .expect("MEMORY USAGE");
        assert!(strlen > 0, "the value key is not where this bench looks");
        format!(
            "{:>10} | STRLEN {strlen:>7} | MEMORY USAGE {usage:>7} | used_memory per value {:>9.0}",
            self.name,
            (after - before) / values as f64,
        )
    }

    /// `n` hits on warm keys, one at a time, each timed.
    async fn hit_batch(&mut self, n: usize, values: usize) {
        for i in 0..n {
            let key = format!("r{}", i % values);
            let started = Instant::now();
            let report: Report = self
                .cache
                .get_or_compute(&key, TTL, || async {
                    COMPUTED.fetch_add(1, Ordering::Relaxed);
                    Err::<Report, _>(std::io::Error::other("a hit was expected"))
                })
                .await
                .expect("a hit");
            self.hits.push(started.elapsed());
            black_box(report);
        }
    }

    /// What the hits cost, client and server side.
    fn hit_figures(&mut self) -> String {
        let mut conn = self.server.conn();
        let bytes_out = info_field(&mut conn, "stats", "total_net_output_bytes");
        let hits = self.hits.len() as f64;
        let reads = read_command_stats(&mut conn);
        let reads = reads
            .iter()
            .map(|(name, calls, usec)| format!("{name} {calls} calls {usec:.2} µs/call"))
            .collect::<Vec<_>>()
            .join(", ");
        self.hits.sort_unstable();
        let p50 = self.hits[self.hits.len() / 2];
        let mean = self.hits.iter().sum::<Duration>() / u32::try_from(self.hits.len()).unwrap_or(1);
        format!(
            "{:>10} | sent per hit {:>7.0} bytes | client per hit p50 {:>6.1} µs, mean {:>6.1} µs | server: {reads}",
            self.name,
            (bytes_out - self.bytes_out_before) / hits,
            p50.as_secs_f64() * 1e6,
            mean.as_secs_f64() * 1e6,
        )
    }

    fn start_hits(&mut self) {
        let mut conn = self.server.conn();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut conn)
            .expect("CONFIG RESETSTAT");
        self.bytes_out_before = info_field(&mut conn, "stats", "total_net_output_bytes");
        self.hits.clear();
    }
}

async fn compare(label: &str, rows: usize, values: usize, hits: usize) {
    let report = report(rows);
    let plain_len = Bincode.encode(&report).expect("encodes").len();
    println!("compression: {label} report, {rows} rows, bincode payload {plain_len} bytes");
    let mut plain = Side::new("Bincode", Bincode).await;
    let mut lz4 = Side::new("Compressed", Compressed::new()).await;
    println!("  {}", plain.fill(&report, values).await);
    println!("  {}", lz4.fill(&report, values).await);

    // Warm-up: the clock calibration, the connections, the script cache.
    plain.hit_batch(50, values).await;
    lz4.hit_batch(50, values).await;
    plain.start_hits();
    lz4.start_hits();
    for _ in 0..BATCHES {
        plain.hit_batch(hits / BATCHES, values).await;
        lz4.hit_batch(hits / BATCHES, values).await;
    }
    assert_eq!(
        COMPUTED.load(Ordering::Relaxed),
        0,
        "every call was to be a hit"
    );
    println!("  {}", plain.hit_figures());
    println!("  {}", lz4.hit_figures());
    let iters = u32::try_from(1_000_000 / plain_len.max(1))
        .unwrap_or(1)
        .max(20);
    println!("  {}", codec_costs(&report, iters));
}

/// The codecs alone, no Redis: decode and encode time of `report`, the two codecs' batches of
/// `iters` calls taking turns; the medians of each and of the per-round differences.
fn codec_costs(report: &Report, iters: u32) -> String {
    const ROUNDS: usize = 15;
    let (plain, lz4) = (Bincode, Compressed::new());
    let (plain_bytes, lz4_bytes) = (plain.encode(report).unwrap(), lz4.encode(report).unwrap());
    let batch = |f: &dyn Fn()| {
        let started = Instant::now();
        for _ in 0..iters {
            f();
        }
        started.elapsed().as_secs_f64() * 1e6 / f64::from(iters)
    };
    let median = |mut runs: Vec<f64>| {
        runs.sort_unstable_by(f64::total_cmp);
        runs[runs.len() / 2]
    };
    let interleaved = |a: &dyn Fn(), b: &dyn Fn()| {
        let (mut ta, mut tb, mut diff) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let (x, y) = (batch(a), batch(b));
            ta.push(x);
            tb.push(y);
            diff.push(y - x);
        }
        (median(ta), median(tb), median(diff))
    };
    let decode = interleaved(
        &|| {
            drop(black_box(
                plain.decode::<Report>(black_box(&plain_bytes)).unwrap(),
            ))
        },
        &|| {
            drop(black_box(
                lz4.decode::<Report>(black_box(&lz4_bytes)).unwrap(),
            ))
        },
    );
    let encode = interleaved(
        &|| drop(black_box(plain.encode(black_box(report)).unwrap())),
        &|| drop(black_box(lz4.encode(black_box(report)).unwrap())),
    );
    format!(
        "codecs alone (median of {ROUNDS} interleaved rounds): decode Bincode {:.1} µs, Compressed {:.1} µs ({:+.1} µs); encode Bincode {:.1} µs, Compressed {:.1} µs ({:+.1} µs)",
        decode.0, decode.1, decode.2, encode.0, encode.1, encode.2
    )
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    if support::bench_filtered_out("compression") {
        return;
    }
    // One thread for the client, so that redis-server has the other core (as in cache_ops).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(compare("~1 KiB", 22, 1_000, 10_000));
    rt.block_on(compare("~100 KiB", 2_290, 200, 2_000));
}
