//! Real OS processes sharing one real redis-server. The binary re-executes itself as the workers
//! (`STAMPEDE_CHILD` names the role), so it has its own `main` and prints a libtest-like summary.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod clock;
    pub mod poll;
    pub mod process;
    pub mod runtime;
    pub mod server;
    pub mod worker;
    pub use {clock::*, poll::*, process::*, runtime::*, server::*, worker::*};
}

use std::time::Duration;

use rand::seq::SliceRandom;
use redis::Commands;
use stampede_guard::{Cache, CallOptions};
use support::runtime;
use support::{eventually, now_us, RedisServer, Worker};

const LEASE: Duration = Duration::from_secs(1);

fn main() {
    let tests: &[(&str, fn())] = &[
        (
            "one_key_two_hundred_callers_in_four_processes_computes_once",
            one_key_in_four_processes,
        ),
        (
            "twelve_months_in_four_processes_compute_once_each",
            twelve_months_in_four_processes,
        ),
        (
            "a_killed_holder_is_replaced_after_its_lease",
            a_killed_holder_is_replaced_after_its_lease,
        ),
        (
            "batches_in_four_processes_compute_each_month_once",
            batches_in_four_processes,
        ),
        (
            "a_cancelled_batch_hands_its_keys_to_a_waiter_in_another_process_at_once",
            a_cancelled_batch_hands_its_keys_over,
        ),
    ];
    support::run_child_or_tests("processes", tests, child);
}

fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// Releases the workers together: each says it is ready, then waits for the `go` key.
fn release_when_ready(conn: &mut redis::Connection, workers: usize) {
    assert!(
        eventually(Duration::from_secs(60), || conn
            .get::<_, Option<usize>>("ready")
            .unwrap()
            .unwrap_or(0)
            == workers),
        "workers did not get ready"
    );
    let _: () = conn.set("go", 1).unwrap();
}

/// Four worker processes of `tasks` callers each ask for `keys` months, each computation taking
/// `compute_ms`; checks that no two computations of one month ever ran at once, and returns the
/// server (with its per-month computation counters) for the test's own assertions.
fn stampede_in_four_processes(tasks: usize, keys: usize, compute_ms: u64) -> RedisServer {
    let server = RedisServer::start();
    let mut workers: Vec<Worker> = (0..4)
        .map(|_| {
            Worker::spawn(
                "stampede",
                &[
                    ("STAMPEDE_URL", server.url()),
                    ("TASKS", tasks.to_string()),
                    ("KEYS", keys.to_string()),
                    ("COMPUTE_MS", compute_ms.to_string()),
                ],
            )
        })
        .collect();
    let mut conn = server.conn();
    release_when_ready(&mut conn, workers.len());
    for worker in &mut workers {
        assert!(worker.wait_success(), "a worker failed");
    }
    let overlaps: Option<usize> = conn.get("overlaps").unwrap();
    assert_eq!(
        overlaps, None,
        "the probe never saw two computations of one month at once"
    );
    server
}

fn one_key_in_four_processes() {
    let server = stampede_in_four_processes(50, 1, 200);
    let computes: usize = server.conn().get("computes:2019-01").unwrap();
    assert_eq!(
        computes, 1,
        "one computation across 4 processes × 50 callers"
    );
}

fn twelve_months_in_four_processes() {
    let server = stampede_in_four_processes(25, 12, 50);
    let mut conn = server.conn();
    for i in 0..12 {
        let computes: usize = conn.get(format!("computes:{}", month(i))).unwrap();
        assert_eq!(computes, 1, "month {}", month(i));
    }
}

fn a_killed_holder_is_replaced_after_its_lease() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let url = || [("STAMPEDE_URL", server.url())];
    let mut holder = Worker::spawn("holder", &url());
    assert!(
        eventually(Duration::from_secs(60), || conn
            .exists::<_, bool>("holder:started")
            .unwrap()),
        "the holder did not start computing"
    );
    let mut waiters: Vec<Worker> = (0..2).map(|_| Worker::spawn("waiter", &url())).collect();
    assert!(
        eventually(Duration::from_secs(60), || conn
            .get::<_, Option<usize>>("waiting")
            .unwrap()
            == Some(2)),
        "the waiters did not start"
    );
    // Let the waiters reach their wait, and the holder renew its lease a few times.
    std::thread::sleep(LEASE * 2);
    let killed_at = now_us() / 1000;
    holder.child.kill().expect("SIGKILL the holder");
    let _ = holder.child.wait();
    for waiter in &mut waiters {
        assert!(waiter.wait_success(), "a waiter failed");
    }

    let computes: usize = conn.get("computes:2019-05").unwrap();
    assert_eq!(
        computes, 2,
        "the killed holder's computation and exactly one takeover"
    );
    let takeovers: Vec<u64> = conn.lrange("takeover_started_ms", 0, -1).unwrap();
    assert_eq!(takeovers.len(), 1);
    assert!(
        takeovers[0] >= killed_at,
        "the takeover began only after the holder was gone"
    );
    let done: Vec<u64> = conn.lrange("waiter_done_ms", 0, -1).unwrap();
    assert_eq!(done.len(), 2);
    let bound = LEASE + CallOptions::default().get_backoff().max();
    for d in done {
        let waited = Duration::from_millis(d - killed_at);
        assert!(
            waited < bound,
            "a waiter waited {waited:?} after the kill, over lease + one backoff step ({bound:?})"
        );
    }
}

/// Four processes × 25 callers, each asking for the year in one `get_or_compute_many` call.
fn batches_in_four_processes() {
    let server = RedisServer::start();
    let mut workers: Vec<Worker> = (0..4)
        .map(|_| Worker::spawn("batch_stampede", &[("STAMPEDE_URL", server.url())]))
        .collect();
    let mut conn = server.conn();
    release_when_ready(&mut conn, workers.len());
    for worker in &mut workers {
        assert!(worker.wait_success(), "a worker failed");
    }
    for i in 0..12 {
        let computes: usize = conn.get(format!("computes:{}", month(i))).unwrap();
        assert_eq!(computes, 1, "month {}", month(i));
    }
    let overlaps: Option<usize> = conn.get("overlaps").unwrap();
    assert_eq!(overlaps, None, "no two computations of one month at once");
    let calls: usize = conn.get("batch_calls").unwrap();
    assert!(
        (1..=4).contains(&calls),
        "at most one call of f per process: {calls}"
    );
}

/// A process's batch is cancelled (its future dropped, the process alive) while `f` runs under
/// a 30 s lease: a caller in another process waiting for one of its months takes over within
/// one backoff step of the cancellation, not at the lease.
fn a_cancelled_batch_hands_its_keys_over() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let url = || [("STAMPEDE_URL", server.url())];
    let mut holder = Worker::spawn("batch_holder", &url());
    assert!(
        eventually(Duration::from_secs(60), || conn
            .exists::<_, bool>("batch:started")
            .unwrap()),
        "the batch did not start computing"
    );
    let mut waiter = Worker::spawn("batch_waiter", &url());
    assert!(
        eventually(Duration::from_secs(60), || conn
            .exists::<_, bool>("waiting")
            .unwrap()),
        "the waiter did not start"
    );
    // Let the waiter reach its wait.
    std::thread::sleep(Duration::from_millis(500));
    let _: () = conn.set("cancel", 1).unwrap();
    assert!(waiter.wait_success(), "the waiter failed");
    assert!(holder.wait_success(), "the holder failed");
    let cancelled: u64 = conn.get("cancelled_ms").unwrap();
    let done: u64 = conn.get("waiter_done_ms").unwrap();
    let waited = Duration::from_millis(done.saturating_sub(cancelled));
    let bound = CallOptions::default().get_backoff().max();
    assert!(
        waited < bound,
        "the waiter took over {waited:?} after the cancellation, over one backoff step ({bound:?})"
    );
    let computes: usize = conn.get("computes:2019-05").unwrap();
    assert_eq!(
        computes, 1,
        "computed by the waiter; the cancelled batch wrote nothing"
    );
}

/// The batch roles: a stampede of batches, a batch cancelled mid-computation, its waiter.
async fn batch_child(
    role: &str,
    cache: Cache,
    mut conn: redis::aio::MultiplexedConnection,
) -> Result<(), String> {
    let year: Vec<String> = (0..12).map(month).collect();
    match role {
        "batch_stampede" => {
            let _: () = redis::cmd("INCR")
                .arg("ready")
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            while !redis::cmd("EXISTS")
                .arg("go")
                .query_async::<bool>(&mut conn)
                .await
                .map_err(|e| e.to_string())?
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let mut callers = Vec::new();
            for _ in 0..25 {
                let (cache, conn) = (cache.clone(), conn.clone());
                let mut asked = year.clone();
                asked.shuffle(&mut rand::rng());
                callers.push(tokio::spawn(async move {
                    let values = cache
                        .get_or_compute_many(
                            &asked,
                            Duration::from_secs(300),
                            move |keys: Vec<String>| {
                                let mut conn = conn.clone();
                                async move {
                                    redis::cmd("INCR")
                                        .arg("batch_calls")
                                        .query_async::<()>(&mut conn)
                                        .await
                                        .map_err(|e| e.to_string())?;
                                    for m in &keys {
                                        let running: i64 = redis::cmd("INCR")
                                            .arg(format!("probe:{m}"))
                                            .query_async(&mut conn)
                                            .await
                                            .map_err(|e| e.to_string())?;
                                        if running > 1 {
                                            redis::cmd("INCR")
                                                .arg("overlaps")
                                                .query_async::<()>(&mut conn)
                                                .await
                                                .map_err(|e| e.to_string())?;
                                        }
                                        redis::cmd("INCR")
                                            .arg(format!("computes:{m}"))
                                            .query_async::<()>(&mut conn)
                                            .await
                                            .map_err(|e| e.to_string())?;
                                    }
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    for m in &keys {
                                        redis::cmd("DECR")
                                            .arg(format!("probe:{m}"))
                                            .query_async::<()>(&mut conn)
                                            .await
                                            .map_err(|e| e.to_string())?;
                                    }
                                    Ok::<_, String>(
                                        keys.into_iter()
                                            .map(|m| (m.clone(), format!("report {m}")))
                                            .collect::<Vec<_>>(),
                                    )
                                }
                            },
                        )
                        .await;
                    for (key, value) in asked.iter().zip(values) {
                        let value = value.map_err(|e| format!("{key}: {e}"))?;
                        if value != format!("report {key}") {
                            return Err(format!("wrong value {value:?} for {key}"));
                        }
                    }
                    Ok::<(), String>(())
                }));
            }
            for caller in callers {
                caller.await.map_err(|e| e.to_string())??;
            }
            Ok(())
        }
        "batch_holder" => {
            let cache = cache.with_options(CallOptions::default().lease(Duration::from_secs(30)));
            let signal = conn.clone();
            let batch = tokio::spawn(async move {
                cache
                    .get_or_compute_many(&year, Duration::from_secs(300), move |_keys| {
                        let mut conn = signal.clone();
                        async move {
                            redis::cmd("SET")
                                .arg("batch:started")
                                .arg(now_us() / 1000)
                                .query_async::<()>(&mut conn)
                                .await
                                .map_err(|e| e.to_string())?;
                            tokio::time::sleep(Duration::from_secs(120)).await;
                            Ok::<Vec<(String, String)>, String>(Vec::new())
                        }
                    })
                    .await
            });
            while !redis::cmd("EXISTS")
                .arg("cancel")
                .query_async::<bool>(&mut conn)
                .await
                .map_err(|e| e.to_string())?
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let cancelled = now_us() / 1000;
            batch.abort();
            let _ = batch.await;
            redis::cmd("SET")
                .arg("cancelled_ms")
                .arg(cancelled)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            // Alive a while longer: the locks are freed by the cancellation, not by an exit.
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(())
        }
        "batch_waiter" => {
            let cache = cache.with_options(CallOptions::default().lease(Duration::from_secs(30)));
            redis::cmd("SET")
                .arg("waiting")
                .arg(1)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let mut compute_conn = conn.clone();
            let value = cache
                .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                    redis::cmd("INCR")
                        .arg("computes:2019-05")
                        .query_async::<()>(&mut compute_conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>("from the waiter".to_string())
                })
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("SET")
                .arg("waiter_done_ms")
                .arg(now_us() / 1000)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if value == "from the waiter" {
                Ok(())
            } else {
                Err(format!("unexpected value {value:?}"))
            }
        }
        other => Err(format!("unknown role {other}")),
    }
}

fn child(role: &str) -> Result<(), String> {
    let url = std::env::var("STAMPEDE_URL").map_err(|e| e.to_string())?;
    let runtime = runtime();
    runtime.block_on(async move {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let options = CallOptions::default().lease(LEASE);
        let cache = Cache::builder()
            .redis_url(url.as_str())
            .namespace("reports")
            .options(options)
            .build()
            .await
            .map_err(|e| e.to_string())?;
        match role {
            "stampede" => stampede_worker(cache, conn).await,
            batch if batch.starts_with("batch_") => batch_child(batch, cache, conn).await,
            "holder" => {
                cache
                    .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                        let _: () = redis::cmd("INCR")
                            .arg("computes:2019-05")
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        let _: () = redis::cmd("SET")
                            .arg("holder:started")
                            .arg(now_us() / 1000)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        tokio::time::sleep(Duration::from_secs(120)).await;
                        Ok::<_, String>("from the holder".to_string())
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                Err("the holder was meant to be killed".into())
            }
            "waiter" => {
                let _: () = redis::cmd("INCR")
                    .arg("waiting")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut compute_conn = conn.clone();
                let value = cache
                    .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                        let _: () = redis::cmd("RPUSH")
                            .arg("takeover_started_ms")
                            .arg(now_us() / 1000)
                            .query_async(&mut compute_conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        let _: () = redis::cmd("INCR")
                            .arg("computes:2019-05")
                            .query_async(&mut compute_conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok::<_, String>("from a waiter".to_string())
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                let _: () = redis::cmd("RPUSH")
                    .arg("waiter_done_ms")
                    .arg(now_us() / 1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if value == "from a waiter" {
                    Ok(())
                } else {
                    Err(format!("unexpected value {value:?}"))
                }
            }
            other => Err(format!("unknown role {other}")),
        }
    })
}

/// TASKS callers, each asking for KEYS months in its own random order; the computation counts
/// itself and probes for overlap through the server.
async fn stampede_worker(
    cache: Cache,
    mut conn: redis::aio::MultiplexedConnection,
) -> Result<(), String> {
    let var = |name: &str| -> Result<usize, String> {
        std::env::var(name)
            .map_err(|e| format!("{name}: {e}"))?
            .parse()
            .map_err(|e| format!("{name}: {e}"))
    };
    let (tasks, keys, compute_ms) = (var("TASKS")?, var("KEYS")?, var("COMPUTE_MS")?);
    let _: () = redis::cmd("INCR")
        .arg("ready")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let go: bool = redis::cmd("EXISTS")
            .arg("go")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if go {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut callers = Vec::new();
    for _ in 0..tasks {
        let (cache, conn) = (cache.clone(), conn.clone());
        callers.push(tokio::spawn(async move {
            let mut months: Vec<String> = (0..keys).map(month).collect();
            months.shuffle(&mut rand::rng());
            for key in months {
                let (mut conn, m) = (conn.clone(), key.clone());
                let value = cache
                    .get_or_compute(&key, Duration::from_secs(300), move || async move {
                        let running: i64 = redis::cmd("INCR")
                            .arg(format!("probe:{m}"))
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        if running > 1 {
                            let _: () = redis::cmd("INCR")
                                .arg("overlaps")
                                .query_async(&mut conn)
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        let _: () = redis::cmd("INCR")
                            .arg(format!("computes:{m}"))
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        tokio::time::sleep(Duration::from_millis(compute_ms as u64)).await;
                        let _: () = redis::cmd("DECR")
                            .arg(format!("probe:{m}"))
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok::<_, String>(format!("report {m}"))
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                if value != format!("report {key}") {
                    return Err(format!("wrong value {value:?} for {key}"));
                }
            }
            Ok::<(), String>(())
        }));
    }
    for caller in callers {
        caller.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}
