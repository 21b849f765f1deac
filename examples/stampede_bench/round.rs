//! One round of worker processes: start them, wait until all are ready, release every caller at
//! once over their stdin pipes, and collect what they report on their stdout.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::admin::Admin;
use crate::config::Config;
use crate::logs;
use crate::outage::{self, Saboteur};
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
    /// Per call, the whole second of the steady clock (from the release) in which it started,
    /// and its latency in µs: the same calls as `calls`.
    pub(crate) started: Vec<(u64, u64)>,
    /// Per wrong or missing value, the second in which its call started (callers that never
    /// finished have no call to place, and are only in `errors`).
    pub(crate) error_seconds: Vec<u64>,
    /// The WARN and ERROR lines that the workers' logs wrote to their stderr.
    pub(crate) warn_lines: u64,
    /// The calls by how each was answered (`Stats::calls`), summed over the workers, in the
    /// order the first worker gave them; empty in naive mode (no `get_or_compute`).
    pub(crate) answers: Vec<(String, u64)>,
}

impl Outcome {
    /// Adds a worker's `answer=n ...` line to the sums.
    fn add_answers(&mut self, line: &str) {
        for (answer, n) in line
            .split_whitespace()
            .filter_map(|pair| pair.split_once('='))
        {
            let n: u64 = n.parse().unwrap_or(0);
            match self.answers.iter_mut().find(|(name, _)| name == answer) {
                Some((_, sum)) => *sum += n,
                None => self.answers.push((answer.to_owned(), n)),
            }
        }
    }

    /// The calls answered so (0 if none was).
    pub(crate) fn answered(&self, answer: &str) -> u64 {
        (self.answers.iter())
            .find(|(name, _)| name == answer)
            .map_or(0, |(_, n)| *n)
    }
}

/// What one worker sent: its calls and their start seconds come on separate lines, paired only
/// within one worker's report.
#[derive(Debug, Default)]
struct Samples {
    calls: Vec<u64>,
    starts: Vec<u64>,
}

/// A line a worker wrote, tagged with its index; `None` when its stdout closed.
pub(crate) type Event = (usize, Option<String>);

/// One round (or the steady-state run): `outage`, if any, freezes the cache's server at its
/// second of the run.
pub(crate) fn run_round(
    config: &Config,
    admin: &mut Admin,
    outage: Option<Saboteur>,
) -> Result<Outcome, BoxError> {
    let exe = std::env::current_exe()?;
    let (tx, events) = mpsc::channel::<Event>();
    let mut workers: Vec<(Child, ChildStdin)> = Vec::with_capacity(config.processes);
    let mut logs = Vec::with_capacity(config.processes);
    for index in 0..config.processes {
        let mut child = Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(WORKER_ENV, index.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("a worker's pipes were not set up".into());
        };
        logs.push(logs::forward_and_count(stderr));
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

    let mut result = barrier_and_collect(config, admin, &mut workers, &events, outage);
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
    // Each worker's stderr closed with its exit: its forwarder has counted every line.
    let warn_lines: u64 = logs.into_iter().map(logs::counted).sum();
    if let Ok(outcome) = result.as_mut() {
        outcome.warn_lines = warn_lines;
    }
    result
}

pub(crate) fn barrier_and_collect(
    config: &Config,
    admin: &mut Admin,
    workers: &mut [(Child, ChildStdin)],
    events: &mpsc::Receiver<Event>,
    outage: Option<Saboteur>,
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
    // The steady clock starts here, for the parent (the outage) and the workers (the timeline)
    // alike: the workers get the moment on the clock they share, the Unix epoch's.
    let (released, released_at) = (unix_micros(), Instant::now());
    let outage = outage.map(|saboteur| saboteur.schedule(released_at));
    let go = format!("go {released}\n");
    for (_, stdin) in workers.iter_mut() {
        // A worker that cannot be told to go never reports: counted below as unfinished callers.
        let _ = stdin.write_all(go.as_bytes()).and_then(|()| stdin.flush());
    }
    eprintln!(
        "stampede_bench: released {} callers",
        workers.len() * config.tasks
    );

    // 3. Collect the samples.
    let mut outcome = Outcome::default();
    let mut samples: Vec<Samples> = workers.iter().map(|_| Samples::default()).collect();
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
            "calls" => samples[index].calls.extend(parse_numbers(rest)),
            "starts" => samples[index].starts.extend(parse_numbers(rest)),
            "call_errors" => outcome.error_seconds.extend(parse_numbers(rest)),
            "reqs" => outcome.reqs.extend(parse_numbers(rest)),
            "fallbacks" => outcome.fallbacks += parse_numbers(rest).sum::<u64>(),
            "answers" => outcome.add_answers(rest),
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
    for (index, worker) in samples.into_iter().enumerate() {
        if worker.starts.len() != worker.calls.len() {
            return Err(format!(
                "worker {index} reported {} calls but {} start seconds",
                worker.calls.len(),
                worker.starts.len()
            )
            .into());
        }
        outcome.started.extend(
            worker
                .starts
                .iter()
                .copied()
                .zip(worker.calls.iter().copied()),
        );
        outcome.calls.extend(worker.calls);
    }
    // The parent's reads of the server (INFO commandstats next) would wait for it anyway; and
    // a run whose outage did not happen must not pass for one that had it.
    if let Some(outage) = outage {
        outage::wait_for_end(outage)?;
    }
    Ok(outcome)
}

pub(crate) fn parse_numbers(s: &str) -> impl Iterator<Item = u64> + '_ {
    s.split_whitespace().filter_map(|n| n.parse().ok())
}
