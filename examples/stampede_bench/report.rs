//! The JSON lines on stdout.

use crate::config::Config;
use crate::round::Outcome;

/// Nearest-rank percentile of sorted µs samples, in ms.
pub(crate) fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1] as f64 / 1000.0
}

pub(crate) fn json_line(
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
/// `--batch`; `"outage_at_secs": A, "outage_secs": B` with an outage;
/// `"serve_while_down_secs": N` with that bound.
pub(crate) fn extra_fields(config: &Config, outcome: &Outcome, batch_calls: u64) -> String {
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
    if let Some(outage) = config.outage {
        fields += &format!(
            r#", "outage_at_secs": {}, "outage_secs": {}"#,
            outage.at.as_secs(),
            outage.length.as_secs()
        );
    }
    if let Some(bound) = config.serve_while_down {
        fields += &format!(r#", "serve_while_down_secs": {}"#, bound.as_secs());
    }
    if config.compute_uncached {
        fields += r#", "compute_uncached": true"#;
    }
    fields + &answer_fields(outcome)
}

/// In guarded mode, the calls by how each was answered (`Stats::calls`, summed over the
/// workers): `, "answers": {"near_hit": n, "hit": n, "computed": n, "joined": n, ...},
/// "answered": n, "computations_saved": n`. Each call is in one answer, so `answered` is the
/// number of calls made; `computations_saved` is `joined + waited`, the calls answered by
/// another caller's computation (or read).
fn answer_fields(outcome: &Outcome) -> String {
    if outcome.answers.is_empty() {
        return String::new();
    }
    let answers: Vec<String> = (outcome.answers.iter())
        .map(|(answer, n)| format!(r#""{answer}": {n}"#))
        .collect();
    let answered: u64 = outcome.answers.iter().map(|(_, n)| n).sum();
    let saved = outcome.answered("joined") + outcome.answered("waited");
    format!(
        r#", "answers": {{{}}}, "answered": {answered}, "computations_saved": {saved}"#,
        answers.join(", ")
    )
}

/// The steady state second by second: `[[second, calls, errors, p99_ms], ...]`, one entry per
/// whole second of the `seconds`-long run (seconds without a call included), counting the
/// calls that started in that second over every worker. A call that started later than the
/// run (none does: callers stop at its end) lands in the last second rather than out of sight.
pub(crate) fn timeline(seconds: u64, outcome: &Outcome) -> String {
    let last = seconds.max(1) - 1;
    let slot = |second: u64| second.min(last) as usize;
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); slot(last) + 1];
    for &(second, us) in &outcome.started {
        latencies[slot(second)].push(us);
    }
    let mut errors = vec![0u64; latencies.len()];
    for &second in &outcome.error_seconds {
        errors[slot(second)] += 1;
    }
    let entries: Vec<String> = latencies
        .iter_mut()
        .zip(errors)
        .enumerate()
        .map(|(second, (calls, errors))| {
            calls.sort_unstable();
            format!(
                "[{second}, {}, {errors}, {:.3}]",
                calls.len(),
                percentile_ms(calls, 99.0)
            )
        })
        .collect();
    format!("[{}]", entries.join(", "))
}
