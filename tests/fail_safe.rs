//! The fail-safe and the soft and hard timeouts on a real redis-server, one test per row of the
//! table in `docs/fail-safe.md`. The waiter and the throttle tests run real OS processes (the
//! binary re-executes itself; `STAMPEDE_CHILD` names the role), since a waiter in another process
//! reaches the fallback only through Redis.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod poll;
    pub mod process;
    pub mod runtime;
    pub mod server;
    pub mod worker;
    pub use {cache::*, poll::*, process::*, runtime::*, server::*, worker::*};
}

use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use redis::Commands;
use stampede_guard::{Cache, CallOptions, Computed, Error, Fetched, Lease, Source};
use support::{cache, runtime};
use support::{eventually, RedisServer, Worker};

const KEY: &str = "2019-05";
const TTL: Duration = Duration::from_millis(500);
const NAMESPACE: &str = "reports";

fn main() {
    let tests: &[(&str, fn())] = &[
        (
            "the_computing_caller_gets_the_fallback_at_its_soft_timeout_and_the_value_lands_later",
            computing_caller_soft_timeout,
        ),
        (
            "a_waiter_in_another_process_gets_the_fallback_at_its_soft_timeout",
            waiter_in_another_process,
        ),
        (
            "without_a_fallback_the_soft_timeout_does_nothing",
            no_fallback_no_effect,
        ),
        (
            "the_hard_timeout_frees_the_lock_at_once_and_the_late_value_is_refused",
            hard_timeout,
        ),
        (
            "a_failing_source_is_called_once_per_throttle_across_processes",
            throttle_across_processes,
        ),
        (
            "the_near_tier_never_serves_a_kept_value_as_fresh",
            near_tier_never_serves_a_kept_value,
        ),
        (
            "a_batch_over_expired_values_locks_them_in_one_script_and_calls_f_once",
            batch_over_expired_values,
        ),
        (
            "a_batch_answers_with_its_fallbacks_at_the_soft_timeout_and_the_values_land_later",
            batch_soft_timeout,
        ),
        (
            "the_hard_timeout_of_a_batch_frees_its_locks_and_serves_the_kept_values",
            batch_hard_timeout,
        ),
        (
            "a_batch_waiting_on_another_process_gets_the_fallback_at_its_soft_timeout",
            batch_waiter_in_another_process,
        ),
        (
            "an_invalidation_while_waiting_takes_the_fallback_away",
            invalidation_takes_the_fallback_away,
        ),
    ];
    support::run_child_or_tests("fail_safe", tests, child);
}

fn fail_safe() -> CallOptions {
    CallOptions::default()
        .fail_safe_for(Duration::from_secs(3600))
        .lease(Duration::from_secs(2))
}

/// Computes `value` for `KEY`, fresh for `TTL`, and waits until it is past its stale window.
async fn expired_value(cache: &Cache, value: &str) {
    let value = value.to_owned();
    let first = cache
        .fetch(KEY, TTL, move |_| async move {
            Ok::<_, String>(Computed::new(value))
        })
        .await
        .unwrap();
    assert_eq!(first.source, Source::Computed);
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
}

/// A call whose computation takes `takes` and returns `value`, or fails with `None`.
async fn call(
    cache: &Cache,
    takes: Duration,
    value: Option<&str>,
) -> Result<stampede_guard::Fetched<String>, Error> {
    let value = value.map(str::to_owned);
    cache
        .fetch(KEY, TTL, move |_| async move {
            tokio::time::sleep(takes).await;
            value.map(Computed::new).ok_or("the database is down")
        })
        .await
}

fn lock_key() -> String {
    format!("{NAMESPACE}:{{{KEY}}}_lock")
}

fn computing_caller_soft_timeout() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let options = fail_safe().soft_timeout(Some(Duration::from_millis(100)));
        let cache = cache(&server, NAMESPACE, options).await;
        expired_value(&cache, "old").await;
        let start = Instant::now();
        let fetched = call(&cache, Duration::from_secs(1), Some("new"))
            .await
            .unwrap();
        let took = start.elapsed();
        assert_eq!(
            (fetched.value.as_str(), fetched.source),
            ("old", Source::FailSafe)
        );
        assert!(
            took < Duration::from_millis(900),
            "answered at the soft timeout, not after the computation ({took:?})"
        );
        // The computation goes on under its lock and lands.
        let mut conn = server.conn();
        assert!(conn.exists::<_, bool>(lock_key()).unwrap(), "still held");
        let landed = eventually(Duration::from_secs(5), || {
            !conn.exists::<_, bool>(lock_key()).unwrap()
        });
        assert!(landed, "the computation finished and let its lock go");
        let plain = cache.get::<String>(KEY).await.unwrap();
        assert_eq!(plain.as_deref(), Some("new"), "the value landed");
        assert_eq!(cache.stats().soft_timeouts, 1);
    });
}

/// `KEY` past its stale window ("old"), and another process holding its lock while it computes
/// "new" for 3 s, without a soft timeout.
fn expired_and_held_elsewhere(server: &RedisServer) -> Worker {
    let mut conn = server.conn();
    runtime().block_on(async {
        let cache = cache(server, NAMESPACE, fail_safe()).await;
        expired_value(&cache, "old").await;
    });
    let holder = Worker::spawn("slow-holder", &[("STAMPEDE_URL", server.url())]);
    assert!(
        eventually(Duration::from_secs(30), || conn
            .exists::<_, bool>(lock_key())
            .unwrap()),
        "the holder took the lock"
    );
    holder
}

fn waiter_in_another_process() {
    let server = RedisServer::start();
    let mut holder = expired_and_held_elsewhere(&server);
    // A third process waits on it, with a soft timeout of 200 ms.
    let mut waiter = Worker::spawn("soft-waiter", &[("STAMPEDE_URL", server.url())]);
    assert!(waiter.wait_success(), "the waiter failed");
    let (_, line) = waiter.last("served ").expect("the waiter's answer");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[1..3], ["old", "FailSafe"], "{line}");
    let took_ms: u64 = words[3].parse().unwrap();
    assert!(
        (200..1500).contains(&took_ms),
        "served at its soft timeout, not after the holder's 3 s ({took_ms} ms)"
    );
    assert!(holder.wait_success(), "the holder failed");
    let (_, line) = holder.last("served ").expect("the holder's answer");
    assert!(line.starts_with("served new Computed"), "{line}");
}

fn no_fallback_no_effect() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let options = fail_safe().soft_timeout(Some(Duration::from_millis(100)));
        let cache = cache(&server, NAMESPACE, options).await;
        let start = Instant::now();
        let fetched = call(&cache, Duration::from_millis(600), Some("new"))
            .await
            .unwrap();
        assert_eq!(
            (fetched.value.as_str(), fetched.source),
            ("new", Source::Computed)
        );
        assert!(start.elapsed() >= Duration::from_millis(600));
        assert_eq!(cache.stats().soft_timeouts, 0);
    });
}

fn hard_timeout() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        let options = CallOptions::default()
            .lease(Duration::from_secs(30))
            .max_hold(Some(Duration::from_millis(200)));
        let cache = cache(&server, NAMESPACE, options).await;
        let start = Instant::now();
        let cut = call(&cache, Duration::from_secs(2), Some("late")).await;
        let took = start.elapsed();
        assert!(
            matches!(&cut, Err(Error::ComputeTimeout { key, .. }) if key == KEY),
            "{cut:?}"
        );
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(
            !conn.exists::<_, bool>(lock_key()).unwrap(),
            "the lock is freed at once, not after its 30 s lease"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            cache.get::<String>(KEY).await.unwrap(),
            None,
            "no late value"
        );

        // With a kept value, the hard timeout serves it.
        let kept = cache.with_options(fail_safe().max_hold(Some(Duration::from_millis(200))));
        expired_value(&kept, "old").await;
        let fetched = call(&kept, Duration::from_secs(2), Some("late"))
            .await
            .unwrap();
        assert_eq!(
            (fetched.value.as_str(), fetched.source),
            ("old", Source::FailSafe)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stored: Option<String> = kept.get(KEY).await.unwrap();
        assert_ne!(
            stored.as_deref(),
            Some("late"),
            "the late value never lands"
        );
    });
}

/// Three processes of 20 callers each ask for the key for 3 s while its source is down; the
/// throttle is 1 s, so the source is called about once a second in all, and every call is
/// answered with the kept value.
fn throttle_across_processes() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        let cache = cache(&server, NAMESPACE, fail_safe()).await;
        expired_value(&cache, "old").await;
    });
    let mut workers: Vec<Worker> = (0..3)
        .map(|_| Worker::spawn("down-source", &[("STAMPEDE_URL", server.url())]))
        .collect();
    for worker in &mut workers {
        assert!(worker.wait_success(), "a worker failed");
    }
    let calls: usize = conn.get("source_calls").unwrap();
    let answered: usize = conn.get("fallbacks").unwrap();
    assert!(
        (2..=5).contains(&calls),
        "{calls} calls of the failing source in 3 s with a 1 s throttle"
    );
    assert!(
        answered > 100,
        "{answered} calls answered with the fallback"
    );
}

fn near_tier_never_serves_a_kept_value() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let cache = Cache::builder()
            .redis_url(server.url())
            .namespace(NAMESPACE)
            .options(fail_safe())
            .near_cache(stampede_guard::NearCacheOptions::new(100))
            .build()
            .await
            .unwrap();
        expired_value(&cache, "old").await;
        // A failure writes the throttled copy, which the near tier must not take for fresh.
        let fetched = call(&cache, Duration::ZERO, None).await.unwrap();
        assert_eq!(fetched.source, Source::FailSafe);
        for _ in 0..20 {
            let again = call(&cache, Duration::ZERO, None).await.unwrap();
            assert_eq!(
                (again.value.as_str(), again.source),
                ("old", Source::FailSafe)
            );
        }
        assert_eq!(cache.stats().near_hits, 0);
    });
}

/// The months of the batch tests: one value each, past its stale window when `expired`.
const MONTHS: [&str; 3] = ["2019-01", "2019-02", "2019-03"];

fn lock_of(key: &str) -> String {
    format!("{NAMESPACE}:{{{key}}}_lock")
}

/// Computes `value` for each of `keys`, fresh for `TTL`, and waits until they are past their
/// stale window.
async fn expired_values(cache: &Cache, keys: &[&str], value: &str) {
    for key in keys {
        let value = value.to_owned();
        cache
            .fetch(key, TTL, move |_| async move {
                Ok::<_, String>(Computed::new(value))
            })
            .await
            .unwrap();
    }
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
}

/// The keys each call of a batch computation was asked for, in order.
type Asked = Arc<Mutex<Vec<Vec<String>>>>;

/// A batch call whose computation records its keys, takes `takes`, and returns `value` for
/// each key (or fails with `None`).
async fn batch_call(
    cache: &Cache,
    keys: &[&str],
    takes: Duration,
    value: Option<&str>,
    asked: &Asked,
) -> Vec<Result<Fetched<String>, Error>> {
    let (value, asked) = (value.map(str::to_owned), Arc::clone(asked));
    cache
        .fetch_many(keys, TTL, move |missing: Vec<(String, Lease)>| {
            let (value, asked) = (value.clone(), Arc::clone(&asked));
            async move {
                let names: Vec<String> = missing.into_iter().map(|(key, _)| key).collect();
                asked.lock().unwrap().push(names.clone());
                tokio::time::sleep(takes).await;
                let value = value.ok_or("the database is down")?;
                let values = names
                    .into_iter()
                    .map(|key| (key, Computed::new(value.clone())));
                Ok::<_, &str>(values.collect::<Vec<_>>())
            }
        })
        .await
}

/// What a batch answered, as `(value, source)` per key, or the error's kind.
fn answers(results: &[Result<Fetched<String>, Error>]) -> Vec<String> {
    results
        .iter()
        .map(|result| match result {
            Ok(fetched) => format!("{} {:?}", fetched.value, fetched.source),
            Err(Error::ComputeTimeout { .. }) => "ComputeTimeout".to_owned(),
            Err(Error::Compute(_)) => "Compute".to_owned(),
            Err(e) => format!("{e:?}"),
        })
        .collect()
}

/// Values past their stale window are replaced by one lock script and one call of `f` for all
/// of them (the lock is taken over each, without reading it again), not one call per key.
fn batch_over_expired_values() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let cache = cache(&server, NAMESPACE, fail_safe()).await;
        expired_values(&cache, &MONTHS, "old").await;
        let asked = Asked::default();
        let results = batch_call(&cache, &MONTHS, Duration::ZERO, Some("new"), &asked).await;
        assert_eq!(answers(&results), vec!["new Computed"; 3]);
        assert_eq!(
            *asked.lock().unwrap(),
            vec![MONTHS.map(str::to_owned).to_vec()],
            "one call of f for the three expired months"
        );
    });
}

/// With a fallback for every key, the batch answers at its soft timeout while its computation
/// goes on under its locks and lands; a batch with a key that has no fallback waits for it.
fn batch_soft_timeout() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let options = fail_safe().soft_timeout(Some(Duration::from_millis(100)));
        let cache = cache(&server, NAMESPACE, options).await;
        expired_values(&cache, &MONTHS[..2], "old").await;
        let asked = Asked::default();
        let start = Instant::now();
        let results = batch_call(
            &cache,
            &MONTHS[..2],
            Duration::from_secs(1),
            Some("new"),
            &asked,
        )
        .await;
        let took = start.elapsed();
        assert_eq!(answers(&results), vec!["old FailSafe"; 2]);
        assert!(
            took < Duration::from_millis(900),
            "answered at the soft timeout, not after the computation ({took:?})"
        );
        let mut conn = server.conn();
        assert!(
            conn.exists::<_, bool>(lock_of(MONTHS[0])).unwrap(),
            "still held"
        );
        let landed = eventually(Duration::from_secs(5), || {
            !conn.exists::<_, bool>(lock_of(MONTHS[0])).unwrap()
                && !conn.exists::<_, bool>(lock_of(MONTHS[1])).unwrap()
        });
        assert!(landed, "the computation finished and let its locks go");
        for month in &MONTHS[..2] {
            let plain = cache.get::<String>(month).await.unwrap();
            assert_eq!(plain.as_deref(), Some("new"), "the value of {month} landed");
        }
        assert_eq!(cache.stats().soft_timeouts, 2);
        assert_eq!(asked.lock().unwrap().len(), 1, "one computation");

        // 2019-03 was never cached: no fallback for it, so the batch waits for its value.
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        let results = batch_call(
            &cache,
            &MONTHS,
            Duration::from_millis(400),
            Some("newer"),
            &asked,
        )
        .await;
        assert_eq!(answers(&results), vec!["newer Computed"; 3]);
        assert_eq!(cache.stats().soft_timeouts, 2, "no soft timeout this time");
    });
}

/// The hard timeout cancels the batch computation and frees every lock at once: a key with a
/// kept value answers with it, a key without gets the timeout, and no late value lands.
fn batch_hard_timeout() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        let options = fail_safe()
            .lease(Duration::from_secs(30))
            .max_hold(Some(Duration::from_millis(200)));
        let cache = cache(&server, NAMESPACE, options).await;
        expired_values(&cache, &MONTHS[..1], "old").await;
        let asked = Asked::default();
        let start = Instant::now();
        let keys = &MONTHS[..2];
        let results = batch_call(&cache, keys, Duration::from_secs(2), Some("late"), &asked).await;
        let took = start.elapsed();
        assert_eq!(answers(&results), ["old FailSafe", "ComputeTimeout"]);
        assert!(took < Duration::from_secs(1), "{took:?}");
        for key in keys {
            assert!(
                !conn.exists::<_, bool>(lock_of(key)).unwrap(),
                "the lock of {key} is freed at once, not after its 30 s lease"
            );
        }
        assert_eq!(cache.stats().hard_timeouts, 2);
        // Within the throttle the kept key is answered by its throttled copy: only the key
        // without a fallback is computed.
        let again = batch_call(&cache, keys, Duration::ZERO, Some("now"), &asked).await;
        assert_eq!(answers(&again), ["old FailSafe", "now Computed"]);
        assert_eq!(
            asked.lock().unwrap().last(),
            Some(&vec![MONTHS[1].to_owned()])
        );
        let _ = cache.invalidate(MONTHS[1]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        for key in keys {
            let stored = cache.get::<String>(key).await.unwrap();
            assert_ne!(stored.as_deref(), Some("late"), "no late value for {key}");
        }
    });
}

/// A batch whose key another process is computing answers with the kept value at its soft
/// timeout, without waiting for the holder.
fn batch_waiter_in_another_process() {
    let server = RedisServer::start();
    let mut holder = expired_and_held_elsewhere(&server);
    runtime().block_on(async {
        let options = fail_safe().soft_timeout(Some(Duration::from_millis(200)));
        let cache = cache(&server, NAMESPACE, options).await;
        let asked = Asked::default();
        let start = Instant::now();
        let results = batch_call(&cache, &[KEY], Duration::ZERO, Some("mine"), &asked).await;
        let took = start.elapsed();
        assert_eq!(answers(&results), ["old FailSafe"]);
        assert!(
            took < Duration::from_millis(1500),
            "served at its soft timeout, not after the holder's 3 s ({took:?})"
        );
        assert!(
            asked.lock().unwrap().is_empty(),
            "the holder computes, not the batch"
        );
        assert_eq!(cache.stats().soft_timeouts, 1);
    });
    assert!(holder.wait_success(), "the holder failed");
}

/// A value invalidated while a caller waited for the lock is no fallback: when the caller then
/// computes and fails, it gets the error (a single key and a batch alike), and no throttled copy
/// brings the invalidated value back.
fn invalidation_takes_the_fallback_away() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        let cache = cache(&server, NAMESPACE, fail_safe()).await;
        for batch in [false, true] {
            expired_value(&cache, "old").await;
            // Another process holds the lock for 400 ms; the value is invalidated meanwhile.
            let _: () = redis::cmd("SET")
                .arg(lock_key())
                .arg("another-process")
                .arg("PX")
                .arg(400)
                .query(&mut conn)
                .unwrap();
            let caller = {
                let cache = cache.clone();
                tokio::spawn(async move {
                    if batch {
                        let asked = Asked::default();
                        let mut results =
                            batch_call(&cache, &[KEY], Duration::ZERO, None, &asked).await;
                        results.remove(0)
                    } else {
                        call(&cache, Duration::ZERO, None).await
                    }
                })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = cache.invalidate(KEY).await.unwrap();
            let outcome = caller.await.unwrap();
            assert!(
                matches!(outcome, Err(Error::Compute(_))),
                "batch {batch}: the invalidated value must not come back: {outcome:?}"
            );
            assert_eq!(
                cache.get::<String>(KEY).await.unwrap(),
                None,
                "batch {batch}"
            );
        }
    });
}

fn child(role: &str) -> Result<(), String> {
    let url = std::env::var("STAMPEDE_URL").map_err(|e| e.to_string())?;
    runtime().block_on(async move {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        match role {
            "slow-holder" => {
                let cache = cache(&url, NAMESPACE, fail_safe()).await;
                let fetched = call(&cache, Duration::from_secs(3), Some("new"))
                    .await
                    .map_err(|e| e.to_string())?;
                println!("served {} {:?}", fetched.value, fetched.source);
                Ok(())
            }
            "soft-waiter" => {
                let options = fail_safe().soft_timeout(Some(Duration::from_millis(200)));
                let cache = cache(&url, NAMESPACE, options).await;
                let start = Instant::now();
                let fetched = call(&cache, Duration::ZERO, Some("from the waiter"))
                    .await
                    .map_err(|e| e.to_string())?;
                println!(
                    "served {} {:?} {}",
                    fetched.value,
                    fetched.source,
                    start.elapsed().as_millis()
                );
                Ok(())
            }
            "down-source" => {
                let options = fail_safe().fail_safe_throttle(Duration::from_secs(1));
                let cache = cache(&url, NAMESPACE, options).await;
                let until = Instant::now() + Duration::from_secs(3);
                let mut callers = Vec::new();
                for _ in 0..20 {
                    let (cache, conn) = (cache.clone(), conn.clone());
                    callers.push(tokio::spawn(async move {
                        while Instant::now() < until {
                            let mut source = conn.clone();
                            let fetched = cache
                                .fetch(KEY, TTL, move |_| async move {
                                    let _: () = redis::cmd("INCR")
                                        .arg("source_calls")
                                        .query_async(&mut source)
                                        .await
                                        .map_err(|e| e.to_string())?;
                                    Err::<Computed<String>, _>("the database is down".to_owned())
                                })
                                .await
                                .map_err(|e| e.to_string())?;
                            if (fetched.value.as_str(), fetched.source) != ("old", Source::FailSafe)
                            {
                                return Err(format!("unexpected answer {fetched:?}"));
                            }
                            let _: () = redis::cmd("INCR")
                                .arg("fallbacks")
                                .query_async(&mut conn.clone())
                                .await
                                .map_err(|e| e.to_string())?;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok::<(), String>(())
                    }));
                }
                for caller in callers {
                    caller.await.map_err(|e| e.to_string())??;
                }
                let _ = &mut conn;
                Ok(())
            }
            other => Err(format!("unknown role {other}")),
        }
    })
}
