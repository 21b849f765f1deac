//! The stampede load generator of `../shared/BENCH.md`: P worker processes × T tasks ask for K
//! month keys at once against one Redis, and each round prints one JSON line on stdout.
//!
//! ```text
//! cargo run --release --example stampede_bench -- \
//!   --url redis://127.0.0.1:PORT/0 --processes P --tasks T --keys K \
//!   --compute-ms C --payload S --rounds R [--ttl SECONDS] [--mode guarded|naive]
//! ```
//!
//! Beyond the contract, `--url` may list several node URLs separated by commas
//! (`redis://127.0.0.1:7000,redis://127.0.0.1:7001,...`): the run is then against the Redis Cluster
//! that these seed nodes belong to. The cache uses `redis_cluster(seeds)`, the compute counters go
//! through a cluster connection, each round flushes every master and resets the statistics of every
//! node, and `redis_cmds` sums `INFO commandstats` over the masters only (see [`Admin`]).
//!
//! The binary re-executes itself as its workers (the `STAMPEDE_BENCH_WORKER` variable names the
//! role). Parent and workers talk over pipes, never through Redis, so the start barrier adds no
//! commands to the round's count:
//! - worker → parent (its stdout): `ready` once connected and warmed up, then its samples
//!   (`calls`, `reqs`) and `done <errors> <finished at, µs since the epoch>`;
//! - parent → worker (its stdin): `go`, written to all workers right after `CONFIG RESETSTAT`.
//!
//! Progress goes to stderr; the parent's stdout holds only the JSON lines.
//!
//! Freshness (beyond the contract): `--expiry-mode hard|stale|xfetch` chooses how values expire
//! (hard: at the TTL; stale: served one more TTL while one caller refreshes; xfetch: early
//! refresh with beta 1.0), and `--steady-secs N` replaces the rounds with one steady-state run:
//! every caller asks for a random key, waits `--think-ms`, and again, for N seconds, while the
//! keys expire every `--ttl` seconds. Before the clock starts, each key is computed once (a
//! warm-up, not counted), so the figures describe the steady state, not the cold start. Its JSON
//! line gives the computations per key per TTL window and the per-call latency:
//!
//! ```text
//! cargo run --release --example stampede_bench -- --url redis://127.0.0.1:PORT/0 \
//!   --steady-secs 20 --ttl 2 --expiry-mode stale
//! ```
//!
//! `--near-cache N` gives every worker's cache a near tier of at most N entries
//! ([`NearCacheOptions`](stampede_guard::NearCacheOptions)); the JSON lines then carry `"near_cache": N`.
//!
//! The fail-safe (`docs/fail-safe.md`): `--fail-safe-secs S` keeps values S seconds past their
//! stale window as a fallback, `--soft-timeout-ms MS` and `--hard-timeout-ms MS` set the call's
//! soft timeout and hard timeout (`max_hold`), and `--fail-after-secs N` (steady state) makes
//! every computation fail from second N of the run on (the data source is down). The JSON lines
//! then carry the flags given and `"fallback_served": n`, the calls answered with a kept value.
//!
//! `--batch` (no value): each caller asks for its K keys in one
//! [`get_or_compute_many`](stampede_guard::Cache::get_or_compute_many) call, in cold rounds and
//! in steady state. Each call of the batch computation sleeps C once, does one
//! `INCR bench:computes:<month>` per month it computes and one `INCR bench:batch_calls`
//! (excluded from `redis_cmds` like the computes' INCRs); the JSON lines then carry
//! `"batch": true, "batch_calls": n`, and a call's latency is its request's.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::seq::SliceRandom;
use redis::cluster::ClusterClientBuilder;
use redis::ConnectionAddr;
use stampede_guard::{Cache, CallOptions, Computed, NearCacheOptions, Source};

/// Names the worker role in a re-executed child; its value is the worker's index.
const WORKER_ENV: &str = "STAMPEDE_BENCH_WORKER";
/// The cache's namespace: the generator's keys stay apart from anything else on the server.
const NAMESPACE: &str = "stampede-bench";
/// How long the parent's own connections (and each of their commands) may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long workers may take to connect and warm up before the round is abandoned.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// A caller still running this long after the release (plus K × C) counts as never finished.
/// Generous: the library's own `wait_timeout` (30 s) turns a stuck wait into an error first.
const CALLER_LIMIT: Duration = Duration::from_secs(120);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() {
    let result = match std::env::var(WORKER_ENV) {
        Ok(index) => worker::run(&index),
        Err(_) => parent(),
    };
    if let Err(e) = result {
        eprintln!("stampede_bench: {e}");
        std::process::exit(1);
    }
}

/// How the value is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `get_or_compute`: each missing key computed once.
    Guarded,
    /// Plain cache-aside through the same cache: `get`, on a miss compute and `set`.
    Naive,
}

/// How values expire (`--expiry-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// At the TTL; the next caller computes and the others wait.
    Hard,
    /// Served for one more TTL after it, while one caller refreshes in the background.
    Stale,
    /// Refreshed before the TTL with XFetch's probability (beta 1.0).
    Xfetch,
}

impl Expiry {
    fn name(self) -> &'static str {
        match self {
            Expiry::Hard => "hard",
            Expiry::Stale => "stale",
            Expiry::Xfetch => "xfetch",
        }
    }

    fn options(self, ttl: Duration) -> CallOptions {
        let options = CallOptions::default();
        match self {
            Expiry::Hard => options,
            Expiry::Stale => options.stale_for(ttl),
            Expiry::Xfetch => options.early_refresh(1.0),
        }
    }
}

/// What `--url` names: one server (the contract), or seed nodes of a Redis Cluster.
#[derive(Debug, Clone)]
enum Target {
    Server(String),
    Cluster(Vec<String>),
}

impl Target {
    /// One URL is a server; a comma-separated list of several is a cluster's seed nodes.
    fn parse(urls: &str) -> Result<Self, BoxError> {
        let mut seeds: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        match seeds.len() {
            0 => Err(format!("--url is required\n{USAGE}").into()),
            1 => Ok(Target::Server(seeds.remove(0))),
            _ => Ok(Target::Cluster(seeds)),
        }
    }
}

/// The command line of BENCH.md; workers re-parse the same arguments.
#[derive(Debug, Clone)]
struct Config {
    target: Target,
    processes: usize,
    tasks: usize,
    keys: usize,
    compute: Duration,
    payload: usize,
    rounds: usize,
    ttl: Duration,
    mode: Mode,
    expiry: Expiry,
    /// `Some(N)`: one steady-state run of N seconds instead of the rounds.
    steady: Option<Duration>,
    /// In steady state, each caller's pause between two calls.
    think: Duration,
    /// `Some(N)`: every worker's cache has a near tier of at most N entries.
    near: Option<u64>,
    /// The fail-safe duration, if given.
    fail_safe: Option<Duration>,
    /// The soft timeout, if given.
    soft_timeout: Option<Duration>,
    /// The hard timeout (`max_hold`), if given.
    hard_timeout: Option<Duration>,
    /// In steady state, every computation fails from this far into the run on.
    fail_after: Option<Duration>,
    /// Each caller asks for its K keys in one `get_or_compute_many` call.
    batch: bool,
}

const USAGE: &str = "usage: stampede_bench --url redis://HOST:PORT/DB[,redis://HOST:PORT...] \
[--processes P] [--tasks T] [--keys K] [--compute-ms C] [--payload S] [--rounds R] [--ttl SECONDS] [--mode guarded|naive] \
[--expiry-mode hard|stale|xfetch] [--steady-secs N] [--think-ms MS] [--near-cache N] \
[--fail-safe-secs S] [--soft-timeout-ms MS] [--hard-timeout-ms MS] [--fail-after-secs N] [--batch]";

impl Config {
    /// Parses the flags by hand: nine flags do not need a parser crate.
    fn from_args(args: impl Iterator<Item = String>) -> Result<Self, BoxError> {
        let mut url = String::new();
        let mut config = Config {
            target: Target::Server(String::new()),
            processes: 4,
            tasks: 25,
            keys: 12,
            compute: Duration::from_millis(200),
            payload: 1024,
            rounds: 3,
            ttl: Duration::from_secs(300),
            mode: Mode::Guarded,
            expiry: Expiry::Hard,
            steady: None,
            think: Duration::from_millis(10),
            near: None,
            fail_safe: None,
            soft_timeout: None,
            hard_timeout: None,
            fail_after: None,
            batch: false,
        };
        let mut args = args;
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(USAGE.into());
            }
            // The one flag without a value.
            if flag == "--batch" {
                config.batch = true;
                continue;
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{flag} takes a whole number, not {value:?}"))
            };
            match flag.as_str() {
                "--url" => url = value.clone(),
                "--processes" => config.processes = number()? as usize,
                "--tasks" => config.tasks = number()? as usize,
                "--keys" => config.keys = number()? as usize,
                "--compute-ms" => config.compute = Duration::from_millis(number()?),
                "--payload" => config.payload = number()? as usize,
                "--rounds" => config.rounds = number()? as usize,
                "--ttl" => config.ttl = Duration::from_secs(number()?),
                "--mode" => {
                    config.mode = match value.as_str() {
                        "guarded" => Mode::Guarded,
                        "naive" => Mode::Naive,
                        other => {
                            return Err(format!("--mode is guarded or naive, not {other:?}").into())
                        }
                    }
                }
                "--expiry-mode" => {
                    config.expiry = match value.as_str() {
                        "hard" => Expiry::Hard,
                        "stale" => Expiry::Stale,
                        "xfetch" => Expiry::Xfetch,
                        other => {
                            return Err(format!(
                                "--expiry-mode is hard, stale or xfetch, not {other:?}"
                            )
                            .into())
                        }
                    }
                }
                "--steady-secs" => config.steady = Some(Duration::from_secs(number()?)),
                "--think-ms" => config.think = Duration::from_millis(number()?),
                "--near-cache" => config.near = Some(number()?),
                "--fail-safe-secs" => config.fail_safe = Some(Duration::from_secs(number()?)),
                "--soft-timeout-ms" => config.soft_timeout = Some(Duration::from_millis(number()?)),
                "--hard-timeout-ms" => config.hard_timeout = Some(Duration::from_millis(number()?)),
                "--fail-after-secs" => config.fail_after = Some(Duration::from_secs(number()?)),
                other => return Err(format!("unknown flag {other:?}\n{USAGE}").into()),
            }
        }
        config.target = Target::parse(&url)?;
        if config.processes == 0 || config.tasks == 0 || config.keys == 0 {
            return Err("--processes, --tasks and --keys must be at least 1".into());
        }
        if config.ttl.is_zero() {
            return Err("--ttl must be at least 1 second".into());
        }
        if config.fail_after.is_some() && config.steady.is_none() {
            return Err(format!("--fail-after-secs needs --steady-secs\n{USAGE}").into());
        }
        if config.fail_safe.is_some_and(|d| d.is_zero()) {
            return Err("--fail-safe-secs must be at least 1 second".into());
        }
        Ok(config)
    }

    /// The call options of the workers' caches: the expiry mode's, and the fail-safe's.
    fn options(&self) -> CallOptions {
        let mut options = self.expiry.options(self.ttl);
        if let Some(keep) = self.fail_safe {
            options = options.fail_safe_for(keep);
        }
        options
            .soft_timeout(self.soft_timeout)
            .max_hold(self.hard_timeout)
    }
}

/// The i-th key: months from 2019-01.
impl Config {
    /// The cache every worker (and the steady state's warm-up) calls through.
    async fn cache(&self) -> Result<Cache, BoxError> {
        let mut builder = Cache::builder()
            .namespace(NAMESPACE)
            .options(self.options());
        if let Some(entries) = self.near {
            builder = builder.near_cache(NearCacheOptions::new(entries));
        }
        let cache = match &self.target {
            Target::Server(url) => builder.redis_url(url.as_str()),
            Target::Cluster(seeds) => builder.redis_cluster(seeds.iter().cloned()),
        }
        .build()
        .await?;
        Ok(cache)
    }
}

/// Before the steady state's clock starts, computes each key once, all at once (the work of a
/// computation, without its counted `INCR`), so that its percentiles describe the steady state
/// and not the cold start, and a kept value exists for the fail-safe from the first expiry on.
fn warm_up(config: &Config, months: &[String]) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let cache = config.cache().await?;
        let mut computations = tokio::task::JoinSet::new();
        for m in months {
            let (cache, m, config) = (cache.clone(), m.clone(), config.clone());
            computations.spawn(async move {
                let (value, work) = (expected_value(&m, config.payload), config.compute);
                cache
                    .get_or_compute(&m, config.ttl, move || async move {
                        tokio::time::sleep(work).await;
                        Ok::<_, String>(value)
                    })
                    .await
                    .map(drop)
                    .map_err(|e| format!("warm-up of {m} failed: {e}"))
            });
        }
        while let Some(done) = computations.join_next().await {
            done??;
        }
        Ok::<_, BoxError>(())
    })
}

fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// The counter that the computation of `month` increments, on db 0.
fn counter_key(month: &str) -> String {
    format!("bench:computes:{month}")
}

/// The counter that each call of the batch computation increments (`--batch`), on db 0.
const BATCH_CALLS_KEY: &str = "bench:batch_calls";

/// Clears the round's counters (on db 0, which FLUSHDB misses when the URL names another db).
fn clear_counters(
    counters: &mut dyn redis::ConnectionLike,
    months: &[String],
) -> Result<(), BoxError> {
    for m in months {
        redis::cmd("DEL").arg(counter_key(m)).exec(&mut *counters)?;
    }
    redis::cmd("DEL")
        .arg(BATCH_CALLS_KEY)
        .exec(&mut *counters)?;
    Ok(())
}

/// The round's counts: computations over every month, and calls of the batch computation.
fn read_counters(
    counters: &mut dyn redis::ConnectionLike,
    months: &[String],
) -> Result<(u64, u64), BoxError> {
    let mut computes = 0u64;
    for m in months {
        let n: Option<u64> = redis::cmd("GET")
            .arg(counter_key(m))
            .query(&mut *counters)?;
        computes += n.unwrap_or(0);
    }
    let batch_calls: Option<u64> = redis::cmd("GET")
        .arg(BATCH_CALLS_KEY)
        .query(&mut *counters)?;
    Ok((computes, batch_calls.unwrap_or(0)))
}

/// The value of `month`: `(month + "|")` repeated and truncated to `size` bytes.
fn expected_value(month: &str, size: usize) -> String {
    let unit = format!("{month}|");
    unit.repeat(size / unit.len() + 1)[..size].to_owned()
}

/// Microseconds since the Unix epoch: the one clock that parent and workers share.
fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The same server as `url`, on db 0, where the compute counters live.
fn db0_client(url: &str) -> Result<redis::Client, redis::RedisError> {
    let info = redis::Client::open(url)?.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_db(0);
    redis::Client::open(info.set_redis_settings(settings))
}

/// The parent's connection to the compute counters: db 0 of the server, or the cluster (the
/// counter keys of different months hash to different slots, which a cluster connection routes).
fn counters_connection(target: &Target) -> Result<Box<dyn redis::ConnectionLike>, BoxError> {
    Ok(match target {
        Target::Server(url) => {
            Box::new(db0_client(url)?.get_connection_with_timeout(ADMIN_TIMEOUT)?)
        }
        Target::Cluster(seeds) => Box::new(
            ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                .connection_timeout(ADMIN_TIMEOUT)
                .response_timeout(ADMIN_TIMEOUT)
                .build()?
                .get_connection()?,
        ),
    })
}

/// The generator's side of the servers: flushing a round, resetting and reading the command
/// statistics. One server is its own single master. A cluster's nodes are found with
/// `CLUSTER NODES` on a seed and reached each over a plain connection.
struct Admin {
    /// Flushed each round; the round's `redis_cmds` is the sum of their `INFO commandstats`.
    masters: Vec<redis::Connection>,
    /// Statistics reset, never counted: a replica re-executes every write that its master
    /// replicates to it (the effects of scripts included), so counting replicas would count those
    /// writes a second time rather than work that the clients asked for.
    replicas: Vec<redis::Connection>,
}

impl Admin {
    fn connect(target: &Target) -> Result<Self, BoxError> {
        match target {
            Target::Server(url) => Ok(Admin {
                masters: vec![redis::Client::open(url.as_str())?
                    .get_connection_with_timeout(ADMIN_TIMEOUT)?],
                replicas: Vec::new(),
            }),
            Target::Cluster(seeds) => Self::connect_cluster(seeds),
        }
    }

    /// Asks the first seed that answers for `CLUSTER NODES`, and connects to every master and
    /// replica listed there, with the seed's settings (user, password) and the node's address.
    fn connect_cluster(seeds: &[String]) -> Result<Self, BoxError> {
        let mut last_error: BoxError = "no seed URL".into();
        for seed in seeds {
            let listing = redis::Client::open(seed.as_str())
                .and_then(|c| c.get_connection_with_timeout(ADMIN_TIMEOUT))
                .and_then(|mut conn| {
                    redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query::<String>(&mut conn)
                });
            match listing {
                Ok(listing) => return Self::connect_nodes(seed, &listing),
                Err(e) => last_error = format!("cluster seed {seed}: {e}").into(),
            }
        }
        Err(last_error)
    }

    fn connect_nodes(seed: &str, listing: &str) -> Result<Self, BoxError> {
        let seed_info = redis::Client::open(seed)?.get_connection_info().clone();
        let mut admin = Admin {
            masters: Vec::new(),
            replicas: Vec::new(),
        };
        // `<id> <ip:port@cport[,hostname]> <flags> <master id> <ping> <pong> <epoch> <link> <slots>`
        for line in listing.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
                return Err(format!("unexpected CLUSTER NODES line {line:?}").into());
            };
            let flags: Vec<&str> = flags.split(',').collect();
            if flags
                .iter()
                .any(|f| matches!(*f, "fail" | "noaddr" | "handshake"))
            {
                eprintln!("stampede_bench: skipping cluster node {address} ({flags:?})");
                continue;
            }
            let host_port = address.split(['@', ',']).next().unwrap_or_default();
            let (host, port) = host_port
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .ok_or_else(|| format!("unexpected node address {address:?} in CLUSTER NODES"))?;
            let info = seed_info
                .clone()
                .set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
            let conn = redis::Client::open(info)?
                .get_connection_with_timeout(ADMIN_TIMEOUT)
                .map_err(|e| format!("cluster node {host_port}: {e}"))?;
            if flags.contains(&"master") {
                admin.masters.push(conn);
            } else if flags.contains(&"slave") {
                admin.replicas.push(conn);
            }
        }
        if admin.masters.is_empty() {
            return Err(format!("CLUSTER NODES on {seed} lists no master").into());
        }
        Ok(admin)
    }

    /// Starts a round cold: `FLUSHDB` on every master (replicas follow their masters).
    fn flush(&mut self) -> Result<(), BoxError> {
        for conn in &mut self.masters {
            redis::cmd("FLUSHDB").exec(conn)?;
        }
        Ok(())
    }

    /// `CONFIG RESETSTAT` on every node, replicas included.
    fn reset_stats(&mut self) -> Result<(), BoxError> {
        for conn in self.masters.iter_mut().chain(&mut self.replicas) {
            redis::cmd("CONFIG").arg("RESETSTAT").exec(conn)?;
        }
        Ok(())
    }

    /// Commands that the masters ran since [`reset_stats`](Self::reset_stats), without the
    /// generator's own bookkeeping (see [`commands_executed`]). On a cluster this includes the
    /// `REPLCONF ACK` that each replica sends its master once a second: a few per round.
    fn commands_executed(&mut self) -> Result<u64, BoxError> {
        let mut total = 0;
        for conn in &mut self.masters {
            let stats: String = redis::cmd("INFO").arg("commandstats").query(conn)?;
            total += commands_executed(&stats);
        }
        Ok(total)
    }
}

fn parent() -> Result<(), BoxError> {
    let config = Config::from_args(std::env::args().skip(1))?;
    let mut admin = Admin::connect(&config.target)?;
    let mut counters = counters_connection(&config.target)?;
    let months: Vec<String> = (0..config.keys).map(month).collect();
    if let Target::Cluster(_) = config.target {
        eprintln!(
            "stampede_bench: Redis Cluster of {} masters and {} replicas",
            admin.masters.len(),
            admin.replicas.len()
        );
    }
    eprintln!(
        "stampede_bench: {:?} mode, {} processes × {} tasks × {} keys, compute {:?}, payload {} B, {} rounds",
        config.mode, config.processes, config.tasks, config.keys, config.compute, config.payload, config.rounds
    );
    if let Some(seconds) = config.steady {
        return steady(&config, seconds, &mut admin, &mut *counters, &months);
    }
    for round in 0..config.rounds {
        admin.flush()?;
        clear_counters(&mut *counters, &months)?;
        let outcome = run_round(&config, &mut admin)?;
        // Commands first: the GETs of the counters below must not be counted.
        let executed = admin.commands_executed()?;
        let (computes, batch_calls) = read_counters(&mut *counters, &months)?;
        let redis_cmds = executed.saturating_sub(computes + batch_calls);
        println!(
            "{}",
            json_line(round, computes, redis_cmds, &config, &outcome, batch_calls)
        );
        std::io::stdout().flush()?;
    }
    Ok(())
}

/// One steady-state run: a warm-up, then every caller asks for random keys for `seconds`.
fn steady(
    config: &Config,
    seconds: Duration,
    admin: &mut Admin,
    counters: &mut dyn redis::ConnectionLike,
    months: &[String],
) -> Result<(), BoxError> {
    admin.flush()?;
    clear_counters(&mut *counters, months)?;
    eprintln!(
        "stampede_bench: steady state for {seconds:?}, TTL {:?}, {} expiry",
        config.ttl,
        config.expiry.name()
    );
    warm_up(config, months)?;
    let outcome = run_round(config, admin)?;
    // Commands first: the GETs of the counters below must not be counted.
    let executed = admin.commands_executed()?;
    let (computes, batch_calls) = read_counters(&mut *counters, months)?;
    let mut calls = outcome.calls.clone();
    calls.sort_unstable();
    // After the warm-up, every window expires each key once.
    let windows = (seconds.as_secs_f64() / config.ttl.as_secs_f64()).max(1.0);
    println!(
        concat!(
            r#"{{"peer": "stampede-guard", "run": "steady", "expiry_mode": "{}", "seconds": {}, "#,
            r#""ttl_ms": {}, "computes": {}, "computes_per_key_per_window": {:.3}, "calls": {}, "#,
            r#""calls_per_sec": {:.1}, "redis_cmds": {}, "#,
            r#""p50_ms": {:.3}, "p99_ms": {:.3}, "p999_ms": {:.3}, "max_ms": {:.3}, "errors": {}{}}}"#
        ),
        config.expiry.name(),
        seconds.as_secs(),
        config.ttl.as_millis(),
        computes,
        computes as f64 / (config.keys as f64 * windows),
        calls.len(),
        calls.len() as f64 / seconds.as_secs_f64().max(f64::MIN_POSITIVE),
        executed.saturating_sub(computes + batch_calls),
        percentile_ms(&calls, 50.0),
        percentile_ms(&calls, 99.0),
        percentile_ms(&calls, 99.9),
        calls.last().map_or(0.0, |us| *us as f64 / 1000.0),
        outcome.errors,
        extra_fields(config, &outcome, batch_calls),
    );
    std::io::stdout().flush()?;
    Ok(())
}

/// What the workers of one round reported.
#[derive(Debug, Default)]
struct Outcome {
    /// Per `get_or_compute` call, in µs.
    calls: Vec<u64>,
    /// Per caller's whole K-key request, in µs.
    reqs: Vec<u64>,
    errors: u64,
    /// Calls answered with a kept value (`Source::FailSafe`).
    fallbacks: u64,
    wall: Duration,
}

/// A line a worker wrote, tagged with its index; `None` when its stdout closed.
type Event = (usize, Option<String>);

fn run_round(config: &Config, admin: &mut Admin) -> Result<Outcome, BoxError> {
    let exe = std::env::current_exe()?;
    let (tx, events) = mpsc::channel::<Event>();
    let mut workers: Vec<(Child, ChildStdin)> = Vec::with_capacity(config.processes);
    for index in 0..config.processes {
        let mut child = Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(WORKER_ENV, index.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("a worker's pipes were not set up".into());
        };
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((index, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((index, None));
        });
        workers.push((child, stdin));
    }
    drop(tx);

    let result = barrier_and_collect(config, admin, &mut workers, &events);
    // Every worker has reported or is given up on: reap them all, killing stragglers (ours, by pid).
    for (mut child, stdin) in workers {
        drop(stdin);
        if result.is_err() || !matches!(child.try_wait(), Ok(Some(_))) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
    result
}

fn barrier_and_collect(
    config: &Config,
    admin: &mut Admin,
    workers: &mut [(Child, ChildStdin)],
    events: &mpsc::Receiver<Event>,
) -> Result<Outcome, BoxError> {
    // 1. Everyone connected and warmed up.
    let mut ready = 0;
    let deadline = Instant::now() + READY_LIMIT;
    while ready < workers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok((_, Some(line))) if line == "ready" => ready += 1,
            Ok((index, Some(line))) => {
                return Err(format!("worker {index} said {line:?} before ready").into())
            }
            Ok((index, None)) => {
                return Err(format!("worker {index} exited before it was ready").into())
            }
            Err(_) => {
                return Err(format!(
                    "only {ready} of {} workers got ready within {READY_LIMIT:?}",
                    workers.len()
                )
                .into())
            }
        }
    }
    // 2. Count from here, then release all callers at once.
    admin.reset_stats()?;
    let released = unix_micros();
    for (_, stdin) in workers.iter_mut() {
        // A worker that cannot be told to go never reports: counted below as unfinished callers.
        let _ = stdin.write_all(b"go\n").and_then(|()| stdin.flush());
    }
    eprintln!(
        "stampede_bench: released {} callers",
        workers.len() * config.tasks
    );

    // 3. Collect the samples.
    let mut outcome = Outcome::default();
    let mut finished_at = released;
    let mut done = vec![false; workers.len()];
    let mut open = workers.len();
    let limit = CALLER_LIMIT
        + config.compute * config.keys as u32
        + config.steady.unwrap_or_default()
        + Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((index, line)) = events.recv_timeout(left) else {
            eprintln!("stampede_bench: {open} workers did not finish within {limit:?}");
            break;
        };
        let Some(line) = line else {
            open -= 1;
            continue;
        };
        let (kind, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match kind {
            "calls" => outcome.calls.extend(parse_numbers(rest)),
            "reqs" => outcome.reqs.extend(parse_numbers(rest)),
            "fallbacks" => outcome.fallbacks += parse_numbers(rest).sum::<u64>(),
            "done" => {
                let fields: Vec<u64> = parse_numbers(rest).collect();
                if let [errors, at] = fields[..] {
                    outcome.errors += errors;
                    finished_at = finished_at.max(at);
                    done[index] = true;
                }
            }
            _ => eprintln!("stampede_bench: worker {index}: unexpected line {line:?}"),
        }
    }
    // A worker that never reported: all its callers count as never finished.
    let silent = done.iter().filter(|d| !**d).count();
    outcome.errors += (silent * config.tasks) as u64;
    outcome.wall = Duration::from_micros(finished_at.saturating_sub(released));
    Ok(outcome)
}

fn parse_numbers(s: &str) -> impl Iterator<Item = u64> + '_ {
    s.split_whitespace().filter_map(|n| n.parse().ok())
}

/// Commands the server ran since `CONFIG RESETSTAT`, from `INFO commandstats`, without the
/// generator's own bookkeeping (BENCH.md): `info`, `config|*`, `flushdb`, `client|*`, `hello`.
fn commands_executed(stats: &str) -> u64 {
    stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, fields) = line.split_once(':')?;
            let excluded = matches!(name, "info" | "flushdb" | "hello")
                || name.starts_with("config|")
                || name.starts_with("client|");
            if excluded {
                return None;
            }
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// Nearest-rank percentile of sorted µs samples, in ms.
fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1] as f64 / 1000.0
}

fn json_line(
    round: usize,
    computes: u64,
    redis_cmds: u64,
    config: &Config,
    outcome: &Outcome,
    batch_calls: u64,
) -> String {
    let mut calls = outcome.calls.clone();
    calls.sort_unstable();
    let mut reqs = outcome.reqs.clone();
    reqs.sort_unstable();
    // Calls that never returned have no sample; they are in `errors`.
    let max = |v: &[u64]| v.last().map_or(0.0, |us| *us as f64 / 1000.0);
    format!(
        concat!(
            r#"{{"peer": "stampede-guard", "round": {}, "computes": {}, "computes_per_key": {:.3}, "#,
            r#""wall_ms": {:.3}, "p50_ms": {:.3}, "p99_ms": {:.3}, "max_ms": {:.3}, "redis_cmds": {}, "#,
            r#""errors": {}, "req_p50_ms": {:.3}, "req_p99_ms": {:.3}, "req_max_ms": {:.3}{}}}"#
        ),
        round,
        computes,
        computes as f64 / config.keys as f64,
        outcome.wall.as_secs_f64() * 1000.0,
        percentile_ms(&calls, 50.0),
        percentile_ms(&calls, 99.0),
        max(&calls),
        redis_cmds,
        outcome.errors,
        percentile_ms(&reqs, 50.0),
        percentile_ms(&reqs, 99.0),
        max(&reqs),
        extra_fields(config, outcome, batch_calls),
    )
}

/// The fields of the options given: `, "near_cache": N` with a near tier; the fail-safe flags
/// given and `"fallback_served"` with any of them; `"batch": true, "batch_calls": n` with
/// `--batch`.
fn extra_fields(config: &Config, outcome: &Outcome, batch_calls: u64) -> String {
    let mut fields = String::new();
    if let Some(n) = config.near {
        fields += &format!(r#", "near_cache": {n}"#);
    }
    if let Some(d) = config.fail_safe {
        fields += &format!(r#", "fail_safe_secs": {}"#, d.as_secs());
    }
    if let Some(d) = config.soft_timeout {
        fields += &format!(r#", "soft_timeout_ms": {}"#, d.as_millis());
    }
    if let Some(d) = config.hard_timeout {
        fields += &format!(r#", "hard_timeout_ms": {}"#, d.as_millis());
    }
    if let Some(d) = config.fail_after {
        fields += &format!(r#", "fail_after_secs": {}"#, d.as_secs());
    }
    let fail_safe_flags = [config.soft_timeout, config.hard_timeout, config.fail_after];
    if config.fail_safe.is_some() || fail_safe_flags.iter().any(Option::is_some) {
        fields += &format!(r#", "fallback_served": {}"#, outcome.fallbacks);
    }
    if config.batch {
        fields += &format!(r#", "batch": true, "batch_calls": {batch_calls}"#);
    }
    fields
}

/// The worker process: T callers in one tokio runtime, released by the parent's `go`.
mod worker {
    use super::*;
    use redis::aio::MultiplexedConnection;
    use redis::cluster_async::ClusterConnection;
    use tokio::sync::watch;

    /// Why a call's value is missing or wrong (errors are counted, not stringified further).
    type CallError = String;

    pub(super) fn run(index: &str) -> Result<(), BoxError> {
        let config = Config::from_args(std::env::args().skip(1))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(work(config, index))
    }

    async fn work(config: Config, index: &str) -> Result<(), BoxError> {
        let cache = config.cache().await?;
        let counters = Counters::connect(&config.target).await?;
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

        // The release: when it came, from which `--fail-after-secs` counts.
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
                let mut caller = Caller {
                    fail_at: released
                        .zip(config.fail_after)
                        .map(|(at, after)| at + after),
                    ..Caller::default()
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

        say("ready")?;
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).map(|_| line)
        })
        .await??;
        if line.trim() != "go" {
            return Err(format!("expected go from the parent, got {line:?}").into());
        }
        go_tx.send_replace(Some(Instant::now()));

        let (mut calls, mut reqs, mut errors, mut finished_at, mut fallbacks) =
            (Vec::new(), Vec::new(), 0u64, 0u64, 0u64);
        while let Some(joined) = callers.join_next().await {
            match joined {
                Ok(caller) => {
                    calls.extend(caller.calls);
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
        say(&format!("calls {}", join(&calls)))?;
        say(&format!("reqs {}", join(&reqs)))?;
        say(&format!("fallbacks {fallbacks}"))?;
        say(&format!("done {errors} {finished_at}"))?;
        Ok(())
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
    #[derive(Debug, Default)]
    struct Caller {
        calls: Vec<u64>,
        req: Option<u64>,
        errors: u64,
        finished_at: u64,
        /// Calls answered with a kept value.
        fallbacks: u64,
        /// `--fail-after-secs`: computations that start from then on fail.
        fail_at: Option<Instant>,
    }

    impl Caller {
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
            let until = Instant::now() + seconds;
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
            self.calls.push(took);
            for (month, value) in months.iter().zip(values) {
                match value {
                    Ok(v) if v == expected_value(month, config.payload) => {}
                    Ok(_) => {
                        eprintln!("stampede_bench: wrong value for {month}");
                        self.errors += 1;
                    }
                    Err(e) => {
                        eprintln!("stampede_bench: {month}: {e}");
                        self.errors += 1;
                    }
                }
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
            self.calls.push(call.elapsed().as_micros() as u64);
            match value {
                Ok(v) if v == expected_value(month, config.payload) => {}
                Ok(_) => {
                    eprintln!("stampede_bench: wrong value for {month}");
                    self.errors += 1;
                }
                Err(e) => {
                    eprintln!("stampede_bench: {month}: {e}");
                    self.errors += 1;
                }
            }
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
}
