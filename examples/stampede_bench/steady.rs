//! The steady-state run (`--steady-secs N`): a warm-up, then every caller asks for random keys
//! for N seconds.

use std::io::Write;
use std::time::Duration;

use crate::admin::{clear_counters, read_counters, Admin};
use crate::config::{Config, Target};
use crate::cost;
use crate::outage::Saboteur;
use crate::report::{extra_fields, percentile_ms, timeline};
use crate::round::run_round;
use crate::workload::expected_value;
use crate::BoxError;

/// Before the steady state's clock starts, computes each key once, all at once (the work of a
/// computation, without its counted `INCR`), so that its percentiles describe the steady state
/// and not the cold start, and a kept value exists for the fail-safe from the first expiry on.
pub(crate) fn warm_up(config: &Config, months: &[String]) -> Result<(), BoxError> {
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

/// One steady-state run: a warm-up, then every caller asks for random keys for `seconds`.
pub(crate) fn steady(
    config: &Config,
    seconds: Duration,
    admin: &mut Admin,
    counters: &mut dyn redis::ConnectionLike,
    months: &[String],
) -> Result<(), BoxError> {
    // Before anything else: a server that refuses DEBUG fails the run now, not at second A.
    let saboteur = match (config.outage, &config.target) {
        (Some(outage), Target::Server(url)) => Some(Saboteur::connect(url, outage)?),
        _ => None,
    };
    admin.flush()?;
    clear_counters(&mut *counters, months)?;
    eprintln!(
        "stampede_bench: steady state for {seconds:?}, TTL {:?}, {} expiry",
        config.ttl,
        config.expiry.name()
    );
    warm_up(config, months)?;
    let cpu_before = cost::cpu_usec(admin)?;
    let outcome = run_round(config, admin, saboteur)?;
    // Commands first (the outage has ended: `run_round` waited for it): the GETs of the counters below must not be counted.
    let executed = admin.commands_executed()?;
    let usec = cost::command_usec(admin)?;
    let cpu = cost::cpu_usec(admin)?.saturating_sub(cpu_before);
    let (computes, batch_calls) = read_counters(&mut *counters, months)?;
    let per_compute = |usec: u64| usec as f64 / computes.max(1) as f64;
    let requests =
        cost::requests_per_won_miss(config)?.map_or_else(|| "null".to_owned(), |n| n.to_string());
    let mut calls = outcome.calls.clone();
    calls.sort_unstable();
    // After the warm-up, every window expires each key once.
    let windows = (seconds.as_secs_f64() / config.ttl.as_secs_f64()).max(1.0);
    println!(
        concat!(
            r#"{{"peer": "stampede-guard", "run": "steady", "expiry_mode": "{}", "seconds": {}, "#,
            r#""ttl_ms": {}, "computes": {}, "computes_per_key_per_window": {:.3}, "calls": {}, "#,
            r#""calls_per_sec": {:.1}, "redis_cmds": {}, "redis_usec_per_compute": {:.1}, "#,
            r#""redis_cpu_usec_per_compute": {:.1}, "requests_per_won_miss": {}, "#,
            r#""p50_ms": {:.3}, "p99_ms": {:.3}, "p999_ms": {:.3}, "max_ms": {:.3}, "errors": {}{}, "#,
            r#""timeline": {}, "warn_lines": {}}}"#
        ),
        config.expiry.name(),
        seconds.as_secs(),
        config.ttl.as_millis(),
        computes,
        computes as f64 / (config.keys as f64 * windows),
        calls.len(),
        calls.len() as f64 / seconds.as_secs_f64().max(f64::MIN_POSITIVE),
        executed.saturating_sub(config.counter_incrs(computes, batch_calls)),
        per_compute(usec),
        per_compute(cpu),
        requests,
        percentile_ms(&calls, 50.0),
        percentile_ms(&calls, 99.0),
        percentile_ms(&calls, 99.9),
        calls.last().map_or(0.0, |us| *us as f64 / 1000.0),
        outcome.errors,
        extra_fields(config, &outcome, batch_calls),
        timeline(seconds.as_secs(), &outcome),
        outcome.warn_lines,
    );
    std::io::stdout().flush()?;
    Ok(())
}
