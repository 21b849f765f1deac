//! The worker process: T callers in one tokio runtime, released by the parent's `go`.
//!
//! A call that fails is counted and the caller goes on (an outage is something to measure, not
//! a reason to stop); the crate's own logs go to stderr through tracing-subscriber's `fmt`,
//! where the parent counts their WARN and ERROR lines.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use redis::cluster::ClusterClientBuilder;
use stampede_guard::{Cache, Calls, Computed, Source};

use crate::config::{Config, Mode, Target};
use crate::workload::{
    counter_key, db0_client, expected_value, month, unix_micros, BATCH_CALLS_KEY,
};
use crate::{BoxError, CALLER_LIMIT};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::sync::watch;

/// The failed calls whose reason this worker prints: enough to see what went wrong, while an
/// outage that fails thousands of calls does not bury the logs being counted.
const PRINTED_ERRORS: u64 = 10;
/// The failed calls of this worker so far, printed or not.
static FAILED_CALLS: AtomicU64 = AtomicU64::new(0);

/// Why a call's value is missing or wrong (errors are counted, not stringified further).
type CallError = String;

pub(crate) fn run(index: &str) -> Result<(), BoxError> {
    let config = Config::from_args(std::env::args().skip(1))?;
    // The crate logs through `tracing`: as a service would, at INFO and above, to stderr.
    // `try_init`: a subscriber already set (none is) is no reason to fail the run.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(work(config, index))
}

async fn work(config: Config, index: &str) -> Result<(), BoxError> {
    let cache = config.cache().await?;
    // Counted on `--counter-url`'s server when given, so that the counts survive an outage of
    // the cache's server.
    let counters = Counters::connect(&config.counters).await?;
    // Warm up before the barrier: the cache connects lazily and loads its scripts on first
    // use, and a long-running service has done both long before a stampede. This key is not
    // one of the K months and its computation is not counted.
    let warmup = format!("warmup-{index}");
    let _: String = cache
        .get_or_compute(&warmup, config.ttl, || async {
            Ok::<_, CallError>(String::new())
        })
        .await
        .map_err(|e| format!("warm-up failed: {e}"))?;
    if config.mode == Mode::Naive {
        let _ = cache.set(&warmup, &String::new(), config.ttl).await?;
    }

    // The release, on this process's clock: the steady clock's second 0, from which
    // `--fail-after-secs` counts, the run ends and each call's second is told.
    let (go_tx, go) = watch::channel(None::<Instant>);
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..config.tasks {
        let (cache, counters, config, mut go) =
            (cache.clone(), counters.clone(), config.clone(), go.clone());
        callers.spawn(async move {
            // Parked until the release; `wait_for` also sees a release that came first.
            let released = match go.wait_for(Option::is_some).await {
                Ok(released) => *released,
                Err(_) => return Caller::default(),
            };
            let limit = CALLER_LIMIT
                + config.compute * config.keys as u32
                + config.steady.unwrap_or_default();
            let Some(released) = released else {
                return Caller::default();
            };
            let mut caller = Caller {
                fail_at: config.fail_after.map(|after| released + after),
                ..Caller::new(released)
            };
            let work = async {
                match config.steady {
                    Some(seconds) => caller.steady(&cache, &counters, &config, seconds).await,
                    None => caller.request(&cache, &counters, &config).await,
                }
            };
            if tokio::time::timeout(limit, work).await.is_err() {
                caller.errors += 1; // never finished
            }
            caller
        });
    }
    drop(go);

    // The calls of the round alone, by how each was answered (the warm-up's left out).
    let before = cache.stats().calls;
    say("ready")?;
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await??;
    // `go <the release, in µs since the epoch>`: the clock parent and workers share, turned
    // into this process's `Instant` (a worker told late starts its clock where the parent's is).
    let released = match line.trim().split_once(' ') {
        Some(("go", at)) => at
            .parse::<u64>()
            .map_err(|_| format!("expected go <µs> from the parent, got {line:?}"))?,
        _ => return Err(format!("expected go <µs> from the parent, got {line:?}").into()),
    };
    let late = Duration::from_micros(unix_micros().saturating_sub(released));
    let now = Instant::now();
    go_tx.send_replace(Some(now.checked_sub(late).unwrap_or(now)));

    let (mut calls, mut reqs, mut errors, mut finished_at, mut fallbacks) =
        (Vec::new(), Vec::new(), 0u64, 0u64, 0u64);
    let (mut starts, mut error_seconds) = (Vec::new(), Vec::new());
    while let Some(joined) = callers.join_next().await {
        match joined {
            Ok(caller) => {
                calls.extend(caller.calls);
                starts.extend(caller.starts);
                error_seconds.extend(caller.error_seconds);
                reqs.extend(caller.req);
                errors += caller.errors;
                fallbacks += caller.fallbacks;
                finished_at = finished_at.max(caller.finished_at);
            }
            Err(e) => {
                eprintln!("stampede_bench worker {index}: a caller failed: {e}");
                errors += 1;
            }
        }
    }
    let failed = FAILED_CALLS.load(Ordering::Relaxed);
    if failed > PRINTED_ERRORS {
        eprintln!(
            "stampede_bench worker {index}: {failed} failed calls, the first {PRINTED_ERRORS} printed"
        );
    }
    say(&format!("calls {}", join(&calls)))?;
    // Same order as `calls`: the parent pairs them per worker.
    say(&format!("starts {}", join(&starts)))?;
    say(&format!("call_errors {}", join(&error_seconds)))?;
    say(&format!("reqs {}", join(&reqs)))?;
    say(&format!("fallbacks {fallbacks}"))?;
    if config.mode == Mode::Guarded {
        say(&format!("answers {}", answers(before, cache.stats().calls)))?;
    }
    say(&format!("done {errors} {finished_at}"))?;
    Ok(())
}

/// The calls answered since `before`, by answer: `near_hit=n hit=n ...`, in the order of
/// [`Calls`]'s fields (the parent sums them over the workers).
fn answers(before: Calls, now: Calls) -> String {
    let answers = [
        ("near_hit", now.near_hit - before.near_hit),
        ("hit", now.hit - before.hit),
        ("computed", now.computed - before.computed),
        ("joined", now.joined - before.joined),
        ("waited", now.waited - before.waited),
        ("stale", now.stale - before.stale),
        ("fail_safe", now.fail_safe - before.fail_safe),
        ("held", now.held - before.held),
        ("uncached", now.uncached - before.uncached),
        ("error", now.error - before.error),
    ];
    let pairs: Vec<String> = (answers.iter())
        .map(|(answer, n)| format!("{answer}={n}"))
        .collect();
    pairs.join(" ")
}

/// Where the computations count themselves: db 0 of the server, or the cluster (the counter
/// keys of different months hash to different slots).
#[derive(Clone)]
enum Counters {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Counters {
    async fn connect(target: &Target) -> Result<Self, BoxError> {
        Ok(match target {
            Target::Server(url) => {
                Counters::Server(db0_client(url)?.get_multiplexed_async_connection().await?)
            }
            Target::Cluster(seeds) => Counters::Cluster(
                ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .build()?
                    .get_async_connection()
                    .await?,
            ),
        })
    }

    /// The compute's one `INCR bench:computes:<month>`.
    async fn incr(&self, month: &str) -> redis::RedisResult<()> {
        self.incr_key(&counter_key(month)).await
    }

    async fn incr_key(&self, key: &str) -> redis::RedisResult<()> {
        let mut incr = redis::cmd("INCR");
        incr.arg(key);
        match self.clone() {
            Counters::Server(mut conn) => incr.exec_async(&mut conn).await,
            Counters::Cluster(mut conn) => incr.exec_async(&mut conn).await,
        }
    }
}

/// One caller's samples.
#[derive(Debug)]
struct Caller {
    /// Per call, its latency in µs.
    calls: Vec<u64>,
    /// Per call (the same order), the whole second after `released` in which it started.
    starts: Vec<u64>,
    /// Per wrong or missing value, the second in which its call started.
    error_seconds: Vec<u64>,
    /// The release, from which the seconds count.
    released: Instant,
    req: Option<u64>,
    errors: u64,
    finished_at: u64,
    /// Calls answered with a kept value.
    fallbacks: u64,
    /// `--fail-after-secs`: computations that start from then on fail.
    fail_at: Option<Instant>,
}

impl Default for Caller {
    /// A caller that was never released: no samples.
    fn default() -> Self {
        Caller::new(Instant::now())
    }
}

impl Caller {
    fn new(released: Instant) -> Self {
        Caller {
            calls: Vec::new(),
            starts: Vec::new(),
            error_seconds: Vec::new(),
            released,
            req: None,
            errors: 0,
            finished_at: 0,
            fallbacks: 0,
            fail_at: None,
        }
    }

    /// Records a call that started at `started` and took `took` µs.
    fn record(&mut self, started: Instant, took: u64) -> u64 {
        let second = started.duration_since(self.released).as_secs();
        self.calls.push(took);
        self.starts.push(second);
        second
    }

    /// Checks a value returned by a call that started in `second`; a wrong or missing one is
    /// counted (and its reason printed, for the first few), never fatal.
    fn check(
        &mut self,
        month: &str,
        value: Result<String, CallError>,
        payload: usize,
        second: u64,
    ) {
        let problem = match value {
            Ok(v) if v == expected_value(month, payload) => return,
            Ok(_) => format!("wrong value for {month}"),
            Err(e) => format!("{month}: {e}"),
        };
        self.errors += 1;
        self.error_seconds.push(second);
        if FAILED_CALLS.fetch_add(1, Ordering::Relaxed) < PRINTED_ERRORS {
            eprintln!("stampede_bench: {problem}");
        }
    }

    /// All K keys, one after another, in this caller's own random order.
    async fn request(&mut self, cache: &Cache, counters: &Counters, config: &Config) {
        let mut order: Vec<usize> = (0..config.keys).collect();
        order.shuffle(&mut rand::rng());
        let started = Instant::now();
        if config.batch {
            // The request is the one call: the same sample for both figures (BENCH.md).
            self.req = Some(self.batch_call(cache, counters, config, order).await);
            self.finished_at = unix_micros();
            return;
        }
        for i in order {
            self.call(cache, counters, config, &month(i)).await;
        }
        self.req = Some(started.elapsed().as_micros() as u64);
        self.finished_at = unix_micros();
    }

    /// Random keys, one call every `think`, for `seconds`.
    async fn steady(
        &mut self,
        cache: &Cache,
        counters: &Counters,
        config: &Config,
        seconds: Duration,
    ) {
        // The steady clock's end, the same for every caller and process: no call starts in
        // second N, so the timeline has N entries.
        let until = self.released + seconds;
        while Instant::now() < until {
            if config.batch {
                let mut order: Vec<usize> = (0..config.keys).collect();
                order.shuffle(&mut rand::rng());
                let _ = self.batch_call(cache, counters, config, order).await;
            } else {
                let i = rand::random_range(0..config.keys);
                self.call(cache, counters, config, &month(i)).await;
            }
            // `sleep(0)` would still wait for the timer's next tick (a millisecond), capping
            // every caller at ~1,000 calls a second: with no think time, only yield.
            if config.think.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(config.think).await;
            }
        }
        self.finished_at = unix_micros();
    }

    /// `--batch`: the keys `order` names in one call, timed (µs, returned) and each value
    /// checked.
    async fn batch_call(
        &mut self,
        cache: &Cache,
        counters: &Counters,
        config: &Config,
        order: Vec<usize>,
    ) -> u64 {
        let months: Vec<String> = order.into_iter().map(month).collect();
        let call = Instant::now();
        let (conn, work, payload) = (counters.clone(), config.compute, config.payload);
        let values = cache
            .get_or_compute_many(&months, config.ttl, move |keys: Vec<String>| {
                let conn = conn.clone();
                async move { compute_many(keys, &conn, work, payload).await }
            })
            .await;
        let took = call.elapsed().as_micros() as u64;
        let second = self.record(call, took);
        for (month, value) in months.iter().zip(values) {
            self.check(
                month,
                value.map_err(|e| e.to_string()),
                config.payload,
                second,
            );
        }
        took
    }

    /// One call, timed and checked.
    async fn call(&mut self, cache: &Cache, counters: &Counters, config: &Config, month: &str) {
        let call = Instant::now();
        let value = match config.mode {
            Mode::Guarded => {
                // The computation may run in a spawned task (a background refresh), so it
                // owns what it uses.
                let (key, conn) = (month.to_owned(), counters.clone());
                let (work, payload, fail_at) = (config.compute, config.payload, self.fail_at);
                let fetched = cache
                    .fetch(month, config.ttl, move |_| async move {
                        // The data source is down from `--fail-after-secs` on.
                        if fail_at.is_some_and(|at| Instant::now() >= at) {
                            tokio::time::sleep(work).await;
                            return Err("the data source is down".to_owned());
                        }
                        compute(&key, &conn, work, payload).await.map(Computed::new)
                    })
                    .await;
                if matches!(&fetched, Ok(f) if f.source == Source::FailSafe) {
                    self.fallbacks += 1;
                }
                fetched.map(|f| f.value).map_err(|e| e.to_string())
            }
            Mode::Naive => naive(cache, month, counters, config).await,
        };
        let second = self.record(call, call.elapsed().as_micros() as u64);
        self.check(month, value, config.payload, second);
    }
}

/// Plain cache-aside through the same cache, codec and connection: read; on a miss compute
/// and write. Every concurrent miss computes.
async fn naive(
    cache: &Cache,
    month: &str,
    counters: &Counters,
    config: &Config,
) -> Result<String, CallError> {
    if let Some(v) = cache
        .get::<String>(month)
        .await
        .map_err(|e| e.to_string())?
    {
        return Ok(v);
    }
    let v = compute(month, counters, config.compute, config.payload).await?;
    let _ = cache
        .set(month, &v, config.ttl)
        .await
        .map_err(|e| e.to_string())?;
    Ok(v)
}

/// The slow query: sleep C, count itself with exactly one INCR, return the value.
async fn compute(
    month: &str,
    counters: &Counters,
    work: Duration,
    payload: usize,
) -> Result<String, CallError> {
    tokio::time::sleep(work).await;
    counters
        .incr(month)
        .await
        .map_err(|e| format!("INCR of the compute counter failed: {e}"))?;
    Ok(expected_value(month, payload))
}

/// `--batch`: the slow query for many months at once: sleep C once, count the call with
/// one `INCR bench:batch_calls` and each month with its one INCR, return every value.
async fn compute_many(
    months: Vec<String>,
    counters: &Counters,
    work: Duration,
    payload: usize,
) -> Result<Vec<(String, String)>, CallError> {
    tokio::time::sleep(work).await;
    counters
        .incr_key(BATCH_CALLS_KEY)
        .await
        .map_err(|e| format!("INCR of the batch counter failed: {e}"))?;
    let mut values = Vec::with_capacity(months.len());
    for month in months {
        counters
            .incr(&month)
            .await
            .map_err(|e| format!("INCR of the compute counter failed: {e}"))?;
        let value = expected_value(&month, payload);
        values.push((month, value));
    }
    Ok(values)
}

fn say(line: &str) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

fn join(samples: &[u64]) -> String {
    samples
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}
