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
//!   (`calls`; `starts`, the second of the run in which each of those calls started;
//!   `call_errors`, the second of each wrong or missing value; `reqs`) and
//!   `done <errors> <finished at, µs since the epoch>`;
//! - parent → worker (its stdin): `go <the release, µs since the epoch>`, written to all workers
//!   right after `CONFIG RESETSTAT`; the release is second 0 of the run for every process.
//!
//! Progress goes to stderr; the parent's stdout holds only the JSON lines. The workers log
//! through `tracing-subscriber` (INFO and above) to their stderr, which the parent forwards to
//! its own.
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
//! In guarded mode (beyond the contract) every JSON line also carries the calls by how each was
//! answered, from the workers' `Cache::stats().calls` summed (the warm-up left out):
//! `"answers": {"near_hit": n, "hit": n, "computed": n, "joined": n, "waited": n, ...},
//! "answered": n, "computations_saved": n`. Each call is in one answer, so `answered` is
//! P × T × K, and in a cold round `computed` = K and `computations_saved` = calls − K − hits
//! (`docs/observability.md`).
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
//!
//! Outages (BENCH.md, "Outages"; issue 21), in steady state:
//! - `--counter-url URL`: the computation counters (`bench:computes:<month>`,
//!   `bench:batch_calls`, on db 0) live on this server instead of `--url`'s, and are read back
//!   there, so that the cache's server can fail mid-run without losing the count (its
//!   `redis_cmds` then has no INCRs to subtract);
//! - `--outage-at-secs A --outage-secs B` (both or neither): at second A of the run the parent
//!   sends `DEBUG SLEEP B` to the cache's server on a connection of its own: the server is
//!   frozen, its connections open and silent. The server must run with
//!   `--enable-debug-command local`; the generator checks that before it starts and fails
//!   saying so. `redis_cmds` is read after the outage's end. Adds
//!   `"outage_at_secs": A, "outage_secs": B`;
//! - `--serve-while-down-secs N` (needs `--near-cache`): how long the near tier may serve what
//!   it holds while the backend is unreachable; adds `"serve_while_down_secs": N` (see
//!   `config::near_options`);
//! - `--compute-uncached` (no value): a call whose backend is down computes without the cache
//!   (`OnBackendError::ComputeUncached`); adds `"compute_uncached": true`.
//!
//! Every steady line ends with `"timeline": [[second, calls, errors, p99_ms], ...]`, one entry
//! per second of the run (the calls that started in it, over all workers), and
//! `"warn_lines": n`, the WARN and ERROR lines the workers' logs wrote to stderr.
//!
//! ```text
//! redis-server --port 40281 --enable-debug-command local ... &   # the cache's server
//! redis-server --port 40282 ... &                                # the counters' server
//! cargo run --release --example stampede_bench -- --url redis://127.0.0.1:40281/0 \
//!   --counter-url redis://127.0.0.1:40282/0 --processes 4 --tasks 25 --keys 12 \
//!   --compute-ms 50 --ttl 2 --steady-secs 40 --near-cache 1000 --fail-safe-secs 60 \
//!   --serve-while-down-secs 60 --outage-at-secs 10 --outage-secs 15
//! ```

mod admin;
mod config;
mod cost;
mod logs;
mod outage;
mod report;
mod round;
mod steady;
mod worker;
mod workload;

use std::io::Write;
use std::time::Duration;

use admin::{clear_counters, counters_connection, read_counters, Admin};
use config::{Config, Target};
use report::json_line;
use round::run_round;
use workload::month;

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

fn parent() -> Result<(), BoxError> {
    let config = Config::from_args(std::env::args().skip(1))?;
    let mut admin = Admin::connect(&config.target)?;
    let mut counters = counters_connection(&config.counters)?;
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
        return steady::steady(&config, seconds, &mut admin, &mut *counters, &months);
    }
    for round in 0..config.rounds {
        admin.flush()?;
        clear_counters(&mut *counters, &months)?;
        let outcome = run_round(&config, &mut admin, None)?;
        // Commands first: the GETs of the counters below must not be counted.
        let executed = admin.commands_executed()?;
        let (computes, batch_calls) = read_counters(&mut *counters, &months)?;
        let redis_cmds = executed.saturating_sub(config.counter_incrs(computes, batch_calls));
        println!(
            "{}",
            json_line(round, computes, redis_cmds, &config, &outcome, batch_calls)
        );
        std::io::stdout().flush()?;
    }
    Ok(())
}
