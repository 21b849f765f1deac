//! A leader's schedule across a change of leader: the standby that takes over runs the job one
//! interval after the last run, not at once. Paused tokio time on the embedded store, so the
//! schedule is exact; `leader_processes` checks the same with `kill -9` on real processes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stampede_guard::leader::{JobContext, Leader};
use stampede_guard::{CallOptions, Lock};
use tokio::time::Instant;

type Runs = Arc<Mutex<Vec<(&'static str, Instant)>>>;

fn job(
    name: &'static str,
    runs: Runs,
) -> impl FnMut(JobContext) -> std::future::Ready<Result<(), String>> {
    move |_ctx| {
        runs.lock().unwrap().push((name, Instant::now()));
        std::future::ready(Ok(()))
    }
}

async fn until(runs: &Runs, done: impl Fn(&[(&'static str, Instant)]) -> bool) {
    while !done(&runs.lock().unwrap()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_that_takes_over_runs_one_interval_after_the_last_run() {
    let every = Duration::from_secs(10);
    let lock = Lock::builder("nightly-report")
        .options(CallOptions::default().lease(Duration::from_secs(1)))
        .build()
        .await
        .expect("an in-memory lock");
    let runs: Runs = Arc::default();
    let first = tokio::spawn(
        Leader::new(lock.clone(), every).run(job("first", runs.clone()), std::future::pending()),
    );
    until(&runs, |r| !r.is_empty()).await;
    let second = tokio::spawn(
        Leader::new(lock.clone(), every).run(job("second", runs.clone()), std::future::pending()),
    );
    // The first leader dies right after its second run.
    until(&runs, |r| r.len() == 2).await;
    first.abort();
    until(&runs, |r| r.iter().any(|(name, _)| *name == "second")).await;
    second.abort();

    let runs = runs.lock().unwrap().clone();
    let last_of_first = runs
        .iter()
        .filter(|(n, _)| *n == "first")
        .map(|(_, at)| *at)
        .max();
    let first_of_second = runs
        .iter()
        .filter(|(n, _)| *n == "second")
        .map(|(_, at)| *at)
        .min();
    let gap = first_of_second.unwrap() - last_of_first.unwrap();
    assert!(
        gap >= every,
        "the new leader ran {gap:?} after the last run, within the {every:?} interval: {runs:?}"
    );
    // And not much later either: it keeps the schedule, it does not restart it from its term.
    assert!(gap < every + Duration::from_secs(1), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_first_leader_runs_at_once() {
    let lock = Lock::builder("fresh-job").build().await.expect("a lock");
    let runs: Runs = Arc::default();
    let started = Instant::now();
    let leader = tokio::spawn(
        Leader::new(lock, Duration::from_secs(3600))
            .run(job("only", runs.clone()), std::future::pending()),
    );
    until(&runs, |r| !r.is_empty()).await;
    leader.abort();
    assert!(runs.lock().unwrap()[0].1 - started < Duration::from_secs(1));
}
