//! Smoke test of the load generator (`examples/stampede_bench/`, contract in BENCH.md): a small
//! run against a redis-server of its own must exit 0 and print one valid JSON line per round; so
//! must a run against a Redis Cluster of its own, given as a comma-separated list of node URLs.
//! A short steady run with an outage (issue 21) must report its timeline second by second, its
//! workers' warnings, and count its computations on the counter server.
//!
//! `cargo test` builds the examples next to the test binaries (`target/<profile>/examples/`), so
//! the generator is found there; a run that did not build it fails and says how to build it.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cluster;
    pub mod example;
    pub mod poll;
    pub mod server;
    pub use {cluster::*, example::*, server::*};
}

use std::path::PathBuf;
use std::process::Command;

use redis::Commands;
use support::{example_binary, RedisCluster, RedisServer};

const PROCESSES: usize = 2;
const TASKS: usize = 5;
const KEYS: usize = 4;
const COMPUTE_MS: u64 = 50;
const ROUNDS: usize = 2;

/// The load generator's binary.
fn generator() -> PathBuf {
    example_binary(
        "stampede_bench",
        "run `cargo build --example stampede_bench` (plain `cargo test` builds it; `cargo test \
         --test stampede_bench_smoke` alone does not)",
    )
}

/// Runs the generator with the smoke-test sizes against `url` (one server, or a cluster's nodes
/// separated by commas); returns its JSON lines, parsed.
fn run(url: &str, mode: &str) -> Vec<serde_json::Value> {
    run_with(url, &["--mode", mode])
}

/// [`run`] with other flags than `--mode`.
fn run_with(url: &str, flags: &[&str]) -> Vec<serde_json::Value> {
    let output = Command::new(generator())
        .args(["--url", url])
        .args(["--processes", &PROCESSES.to_string()])
        .args(["--tasks", &TASKS.to_string()])
        .args(["--keys", &KEYS.to_string()])
        .args(["--compute-ms", &COMPUTE_MS.to_string()])
        .args(["--payload", "1024"])
        .args(["--rounds", &ROUNDS.to_string()])
        .args(flags)
        .output()
        .expect("the load generator starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the generator failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // stdout holds only the JSON lines: one per round, nothing else.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), ROUNDS, "one line per round, got:\n{stdout}");
    lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// Every field of BENCH.md, with the type it must have (the calls by answer, which the
/// guarded mode adds, checked apart: [`assert_answers_add_up`]).
fn assert_contract_fields(line: &serde_json::Value, round: usize) {
    let mut line = line.clone();
    if let Some(object) = line.as_object_mut() {
        for field in ["answers", "answered", "computations_saved"] {
            object.remove(field);
        }
    }
    let line = &line;
    assert_eq!(line["peer"], "stampede-guard", "{line}");
    assert_eq!(line["round"].as_u64(), Some(round as u64), "{line}");
    for field in ["computes", "redis_cmds", "errors"] {
        assert!(line[field].is_u64(), "{field} is a whole number: {line}");
    }
    for field in [
        "computes_per_key",
        "wall_ms",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "req_p50_ms",
        "req_p99_ms",
        "req_max_ms",
    ] {
        assert!(line[field].is_number(), "{field} is a number: {line}");
    }
    assert_eq!(line.as_object().map(|o| o.len()), Some(13), "{line}");
    assert_eq!(line["errors"].as_u64(), Some(0), "{line}");
    // Some caller computed a key, so it waited at least C; and the round cannot be shorter.
    let f = |field: &str| line[field].as_f64().unwrap();
    assert!(f("max_ms") >= COMPUTE_MS as f64, "{line}");
    assert!(f("wall_ms") >= COMPUTE_MS as f64, "{line}");
    assert!(
        f("p50_ms") <= f("p99_ms") && f("p99_ms") <= f("max_ms"),
        "{line}"
    );
    assert!(line["redis_cmds"].as_u64().unwrap() > 0, "{line}");
}

#[test]
fn guarded_rounds_compute_each_key_once_and_print_one_json_line_each() {
    let server = RedisServer::start();
    let lines = run(&server.url(), "guarded");
    for (round, line) in lines.iter().enumerate() {
        assert_contract_fields(line, round);
        assert_eq!(line["computes"].as_u64(), Some(KEYS as u64), "{line}");
        assert_eq!(line["computes_per_key"].as_f64(), Some(1.0), "{line}");
        // Every call is at least one command (the hit path's GET).
        let calls = (PROCESSES * TASKS * KEYS) as u64;
        assert!(line["redis_cmds"].as_u64().unwrap() >= calls, "{line}");
    }
    // The last round is not flushed: its counters are there, under the contract's names, on db 0.
    let mut conn = server.conn();
    for i in 0..KEYS {
        let month = format!("{}-{:02}", 2019 + i / 12, i % 12 + 1);
        let n: Option<u64> = conn.get(format!("bench:computes:{month}")).unwrap();
        assert_eq!(n, Some(1), "bench:computes:{month}");
    }
}

/// The answers of a cold round of `calls` calls for `KEYS` keys, counted by the workers' caches
/// (`Stats::calls`), add up: every call in exactly one answer, one computation per key (the
/// same figure as the computations' own `INCR`s), and every other call either read the value
/// itself (a hit) or was answered by someone else's computation (`computations_saved`).
fn assert_answers_add_up(line: &serde_json::Value, calls: u64) {
    let answers = line["answers"].as_object().expect("the calls by answer");
    let answer = |name: &str| {
        answers[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {line}"))
    };
    let names = [
        "near_hit",
        "hit",
        "computed",
        "joined",
        "waited",
        "stale",
        "fail_safe",
        "held",
        "uncached",
        "error",
    ];
    assert_eq!(answers.len(), names.len(), "{line}");
    let total: u64 = names.iter().map(|name| answer(name)).sum();
    assert_eq!(total, calls, "each call counted once, none twice: {line}");
    assert_eq!(line["answered"].as_u64(), Some(calls), "{line}");
    assert_eq!(answer("computed"), KEYS as u64, "{line}");
    assert_eq!(
        line["computes"].as_u64(),
        Some(answer("computed")),
        "{line}"
    );
    let hits = answer("hit") + answer("near_hit");
    let saved = line["computations_saved"]
        .as_u64()
        .expect("computations_saved");
    assert_eq!(saved, calls - KEYS as u64 - hits, "{line}");
    assert_eq!(saved, answer("joined") + answer("waited"), "{line}");
    // Without a near tier, no call is answered by one.
    if line.get("near_cache").is_none() {
        assert_eq!(answer("near_hit"), 0, "{line}");
    }
    // Nobody here waited on a computation that was not there: no fallbacks, no errors.
    for name in ["stale", "fail_safe", "held", "uncached", "error"] {
        assert_eq!(answer(name), 0, "{name}: {line}");
    }
}

#[test]
fn the_calls_of_a_guarded_round_add_up_by_how_each_was_answered() {
    let server = RedisServer::start();
    let calls = (PROCESSES * TASKS * KEYS) as u64;
    for line in run(&server.url(), "guarded") {
        assert_answers_add_up(&line, calls);
        // A cold stampede: more calls were saved a computation than ran one.
        assert!(
            line["computations_saved"].as_u64().unwrap() > KEYS as u64,
            "{line}"
        );
    }
    // With a near tier, the same arithmetic; nothing is counted twice across the tiers.
    for line in run_with(&server.url(), &["--near-cache", "100"]) {
        assert_answers_add_up(&line, calls);
    }
}

#[test]
fn rounds_with_a_near_cache_still_compute_each_key_once_and_say_so() {
    let server = RedisServer::start();
    let lines = run_with(&server.url(), &["--near-cache", "100"]);
    for (round, line) in lines.iter().enumerate() {
        let mut contract = line.clone();
        let near = contract
            .as_object_mut()
            .and_then(|o| o.remove("near_cache"));
        assert_eq!(near.and_then(|n| n.as_u64()), Some(100), "{line}");
        assert_contract_fields(&contract, round);
        assert_eq!(line["computes"].as_u64(), Some(KEYS as u64), "{line}");
    }
}

#[test]
fn batch_rounds_compute_each_key_once_with_at_most_one_batch_call_per_process() {
    let server = RedisServer::start();
    let lines = run_with(&server.url(), &["--batch"]);
    for (round, line) in lines.iter().enumerate() {
        let mut contract = line.clone();
        let object = contract.as_object_mut().expect("a JSON object");
        assert_eq!(
            object.remove("batch"),
            Some(serde_json::Value::Bool(true)),
            "{line}"
        );
        let batch_calls = object
            .remove("batch_calls")
            .and_then(|n| n.as_u64())
            .expect("batch_calls");
        assert_contract_fields(&contract, round);
        assert_eq!(line["computes"].as_u64(), Some(KEYS as u64), "{line}");
        assert!(
            (1..=PROCESSES as u64).contains(&batch_calls),
            "one batch call per process at most: {line}"
        );
        // One call per request: the per-call and per-request figures are the same samples.
        assert_eq!(line["p99_ms"], line["req_p99_ms"], "{line}");
        // Each key of a batch is counted as a call, once.
        assert_answers_add_up(line, (PROCESSES * TASKS * KEYS) as u64);
    }
}

#[test]
fn naive_rounds_run_through_the_same_cache_without_errors() {
    let server = RedisServer::start();
    for (round, line) in run(&server.url(), "naive").iter().enumerate() {
        assert_contract_fields(line, round);
        // No `get_or_compute` call: no answers to count.
        assert!(line.get("answers").is_none(), "{line}");
        // Plain cache-aside stampedes: at least one computation per key, usually many.
        assert!(line["computes_per_key"].as_f64().unwrap() >= 1.0, "{line}");
    }
}

#[test]
fn guarded_rounds_against_a_redis_cluster_compute_each_key_once() {
    let cluster = RedisCluster::start();
    // The compute counters land on more than one master: the generator must route them.
    let masters: std::collections::HashSet<usize> = (0..KEYS)
        .map(|i| {
            cluster.master_of(&format!(
                "bench:computes:{}-{:02}",
                2019 + i / 12,
                i % 12 + 1
            ))
        })
        .collect();
    assert!(masters.len() > 1, "the counters all hash to one master");

    let lines = run(&cluster.urls().join(","), "guarded");
    for (round, line) in lines.iter().enumerate() {
        assert_contract_fields(line, round);
        assert_eq!(line["computes"].as_u64(), Some(KEYS as u64), "{line}");
        assert_eq!(line["computes_per_key"].as_f64(), Some(1.0), "{line}");
        // Summed over the masters: every call is at least one command there (the hit's GET).
        let calls = (PROCESSES * TASKS * KEYS) as u64;
        assert!(line["redis_cmds"].as_u64().unwrap() >= calls, "{line}");
    }
}

/// A steady run of `STEADY_SECS` with `flags`, the smoke-test sizes and a 1 s TTL (so keys
/// expire and are computed again during the run); returns its one JSON line, parsed, and the
/// generator's stderr.
fn run_steady(url: &str, flags: &[&str]) -> (serde_json::Value, String) {
    let output = steady_command(url, flags)
        .output()
        .expect("the load generator starts");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        output.status.success(),
        "the generator failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line for a steady run, got:\n{stdout}");
    let line =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {}", lines[0]));
    (line, stderr)
}

const STEADY_SECS: u64 = 4;

fn steady_command(url: &str, flags: &[&str]) -> Command {
    let mut command = Command::new(generator());
    command
        .args(["--url", url])
        .args(["--processes", &PROCESSES.to_string()])
        .args(["--tasks", &TASKS.to_string()])
        .args(["--keys", &KEYS.to_string()])
        .args(["--compute-ms", &COMPUTE_MS.to_string()])
        .args(["--ttl", "1", "--steady-secs", &STEADY_SECS.to_string()])
        .args(flags);
    command
}

/// The `timeline` of a steady line: one `[second, calls, errors, p99_ms]` per second of the
/// run, in order; returns the entries' calls and errors.
fn assert_timeline(line: &serde_json::Value) -> Vec<(u64, u64)> {
    let timeline = line["timeline"].as_array().expect("a timeline array");
    assert_eq!(
        timeline.len() as u64,
        STEADY_SECS,
        "one entry per second: {line}"
    );
    let entries: Vec<(u64, u64)> = timeline
        .iter()
        .enumerate()
        .map(|(second, entry)| {
            let entry = entry.as_array().expect("an entry is an array");
            assert_eq!(entry.len(), 4, "[second, calls, errors, p99_ms]: {line}");
            assert_eq!(entry[0].as_u64(), Some(second as u64), "{line}");
            assert!(entry[3].is_number(), "p99_ms is a number: {line}");
            let count = |i: usize| entry[i].as_u64().expect("a whole number");
            (count(1), count(2))
        })
        .collect();
    let calls: u64 = entries.iter().map(|(calls, _)| calls).sum();
    let errors: u64 = entries.iter().map(|(_, errors)| errors).sum();
    assert_eq!(
        line["calls"].as_u64(),
        Some(calls),
        "the seconds' calls sum to calls: {line}"
    );
    // `errors` also counts callers that never finished, which no second holds.
    assert!(errors <= line["errors"].as_u64().unwrap(), "{line}");
    entries
}

/// The sum of the computation counters on `server`, db 0.
fn computes_on(server: &RedisServer) -> u64 {
    let mut conn = server.conn();
    (0..KEYS)
        .map(|i| {
            let month = format!("{}-{:02}", 2019 + i / 12, i % 12 + 1);
            let n: Option<u64> = conn.get(format!("bench:computes:{month}")).unwrap();
            n.unwrap_or(0)
        })
        .sum()
}

#[test]
fn a_steady_run_with_an_outage_reports_each_second_and_counts_on_the_counter_server() {
    let cache_server =
        RedisServer::start_with(&["--enable-debug-command".into(), "local".into()], "");
    let counter_server = RedisServer::start();
    let (line, _) = run_steady(
        &cache_server.url(),
        &[
            "--counter-url",
            &counter_server.url(),
            "--outage-at-secs",
            "1",
            "--outage-secs",
            "1",
        ],
    );
    assert_eq!(line["run"], "steady", "{line}");
    assert_eq!(line["outage_at_secs"].as_u64(), Some(1), "{line}");
    assert_eq!(line["outage_secs"].as_u64(), Some(1), "{line}");
    assert!(
        line["warn_lines"].is_u64(),
        "warn_lines is a whole number: {line}"
    );
    let timeline = assert_timeline(&line);
    // The callers go on after the cache's server wakes up: the last second has calls.
    assert!(timeline[STEADY_SECS as usize - 1].0 > 0, "{line}");
    // The keys expire every second: computed during the run, and counted where --counter-url
    // says, none on the cache's server (which the outage froze).
    let computes = line["computes"].as_u64().expect("computes");
    assert!(computes > 0, "{line}");
    assert_eq!(computes_on(&counter_server), computes, "{line}");
    assert_eq!(computes_on(&cache_server), 0, "{line}");
}

#[test]
fn warn_lines_counts_the_workers_warnings_which_still_reach_stderr() {
    let server = RedisServer::start();
    // From second 1 on every computation fails and the fail-safe serves the kept value, with a
    // warning from the crate's log.
    let (line, stderr) = run_steady(
        &server.url(),
        &[
            "--fail-after-secs",
            "1",
            "--fail-safe-secs",
            "60",
            "--near-cache",
            "100",
            "--serve-while-down-secs",
            "60",
        ],
    );
    assert_eq!(line["serve_while_down_secs"].as_u64(), Some(60), "{line}");
    assert_eq!(line["near_cache"].as_u64(), Some(100), "{line}");
    let forwarded = stderr
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .count() as u64;
    assert!(forwarded > 0, "the fail-safe logged no warning:\n{stderr}");
    assert_eq!(
        line["warn_lines"].as_u64(),
        Some(forwarded),
        "{line}\n{stderr}"
    );
    assert_timeline(&line);
}

#[test]
fn outage_flags_out_of_place_are_usage_errors() {
    // No DEBUG command on this server, so the outage must be refused with the reason.
    let server = RedisServer::start();
    let refused = |flags: &[&str], says: &str| {
        let output = steady_command(&server.url(), flags)
            .output()
            .expect("the load generator starts");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{flags:?} was accepted:\n{stderr}"
        );
        assert!(
            stderr.contains(says),
            "{flags:?}: expected {says:?} in:\n{stderr}"
        );
        assert!(output.stdout.is_empty(), "{flags:?}: no JSON line");
    };
    refused(
        &["--outage-at-secs", "1"],
        "--outage-at-secs and --outage-secs go together",
    );
    refused(
        &["--outage-secs", "1"],
        "--outage-at-secs and --outage-secs go together",
    );
    refused(
        &["--serve-while-down-secs", "5"],
        "--serve-while-down-secs needs --near-cache",
    );
    refused(
        &["--outage-at-secs", "1", "--outage-secs", "1"],
        "--enable-debug-command local",
    );
}
