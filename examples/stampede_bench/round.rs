//! One round of worker processes: start them, wait until all are ready, release every caller at
//! once over their stdin pipes, and collect what they report on their stdout.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::admin::Admin;
use crate::config::Config;
use crate::workload::unix_micros;
use crate::{BoxError, CALLER_LIMIT, READY_LIMIT, WORKER_ENV};

/// What the workers of one round reported.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Per `get_or_compute` call, in µs.
    pub(crate) calls: Vec<u64>,
    /// Per caller's whole K-key request, in µs.
    pub(crate) reqs: Vec<u64>,
    pub(crate) errors: u64,
    /// Calls answered with a kept value (`Source::FailSafe`).
    pub(crate) fallbacks: u64,
    pub(crate) wall: Duration,
}

/// A line a worker wrote, tagged with its index; `None` when its stdout closed.
pub(crate) type Event = (usize, Option<String>);

pub(crate) fn run_round(config: &Config, admin: &mut Admin) -> Result<Outcome, BoxError> {
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

pub(crate) fn barrier_and_collect(
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

pub(crate) fn parse_numbers(s: &str) -> impl Iterator<Item = u64> + '_ {
    s.split_whitespace().filter_map(|n| n.parse().ok())
}
