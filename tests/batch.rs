//! `get_or_compute_many`: the batch path, against real redis-server processes and the memory
//! store. (Across real OS processes: tests/processes.rs; on Redis Cluster: tests/cluster.rs.)

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod monitor;
    pub mod server;
    pub use {cache::*, monitor::*, server::*};
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stampede_guard::{BreakerOptions, Cache, CallOptions, Error, Lease, Source};
use support::cache;
use support::{Monitor, RedisServer};

const TTL: Duration = Duration::from_secs(300);

fn month(i: usize) -> String {
    format!("2019-{:02}", i + 1)
}

fn year() -> Vec<String> {
    (0..12).map(month).collect()
}

/// Records every call of a batch computation: the keys it was asked for.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Vec<String>>>>);

impl Calls {
    fn record(&self, keys: &[String]) {
        self.0.lock().unwrap().push(keys.to_vec());
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// How many times each key was computed, over every call.
    fn per_key(&self) -> HashMap<String, usize> {
        let mut per_key = HashMap::new();
        for call in self.0.lock().unwrap().iter() {
            for key in call {
                *per_key.entry(key.clone()).or_default() += 1;
            }
        }
        per_key
    }
}

/// What a batch computation of these tests returns.
type Answer = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<HashMap<String, String>, std::io::Error>> + Send>,
>;

/// A batch computation that takes `work`, then answers `"<key>:v"` for each key asked.
fn report(calls: &Calls, work: Duration) -> impl Fn(Vec<String>) -> Answer + Send + Sync + 'static {
    let calls = calls.clone();
    move |keys: Vec<String>| {
        calls.record(&keys);
        Box::pin(async move {
            tokio::time::sleep(work).await;
            Ok(keys
                .into_iter()
                .map(|k| (k.clone(), format!("{k}:v")))
                .collect())
        })
    }
}

fn values(results: Vec<Result<String, Error>>) -> Vec<String> {
    results
        .into_iter()
        .map(|r| r.expect("every key has its value"))
        .collect()
}

fn expected(keys: &[String]) -> Vec<String> {
    keys.iter().map(|k| format!("{k}:v")).collect()
}

#[tokio::test]
async fn a_warm_batch_is_one_mget_and_a_cold_one_one_lock_script() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    let calls = Calls::default();
    // A batch on other keys first: the clock is calibrated and the scripts are loaded, so
    // neither shows in the counts below.
    values(
        cache
            .get_or_compute_many(["warm-up"], TTL, report(&calls, Duration::ZERO))
            .await,
    );
    calls.0.lock().unwrap().clear();

    let monitor = Monitor::start(&server);
    let got = cache
        .get_or_compute_many(year(), TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(values(got), expected(&year()));
    let cold = monitor.commands_until_now(&server);
    assert_eq!(calls.count(), 1, "one computation for the twelve months");
    assert_eq!(cold.iter().filter(|c| *c == "MGET").count(), 1, "{cold:?}");
    let scripts = cold.iter().filter(|c| c.starts_with("EVAL")).count();
    // One read-or-lock for all twelve (on one server it also answers the namespace's clock, the
    // values' birth, for tags and clear), then one fenced write per month (sent concurrently).
    assert_eq!(scripts, 1 + 12, "{cold:?}");

    let monitor = Monitor::start(&server);
    let got = cache
        .get_or_compute_many(year(), TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(values(got), expected(&year()));
    assert_eq!(monitor.commands_until_now(&server), vec!["MGET"]);
    assert_eq!(calls.count(), 1);
}

#[tokio::test]
async fn order_and_duplicates_are_kept_and_a_duplicate_is_computed_once() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    let calls = Calls::default();
    let _ = cache
        .set("2019-03", &"2019-03:v".to_string(), TTL)
        .await
        .unwrap();
    let asked: Vec<String> = ["2019-05", "2019-03", "2019-05", "2019-01", "2019-03"]
        .map(String::from)
        .to_vec();
    let got = cache
        .get_or_compute_many(&asked, TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(values(got), expected(&asked));
    assert_eq!(
        *calls.0.lock().unwrap(),
        vec![vec!["2019-05".to_string(), "2019-01".to_string()]],
        "the missing keys, once each, in the order first asked"
    );
}

#[tokio::test]
async fn invalid_keys_fail_alone() {
    let cache = Cache::in_memory();
    let calls = Calls::default();
    let asked = vec!["2019-01".to_string(), String::new(), "2019-02".to_string()];
    let got = cache
        .get_or_compute_many(&asked, TTL, report(&calls, Duration::ZERO))
        .await;
    assert!(matches!(got[1], Err(Error::InvalidKey { .. })));
    assert_eq!(got[0].as_deref().unwrap(), "2019-01:v");
    assert_eq!(got[2].as_deref().unwrap(), "2019-02:v");
}

/// Eight `Cache` instances (each with its own connections, as eight processes would have), 25
/// tasks each, every task asking for the year in one call on a cold cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cold_stampede_of_batches_computes_each_key_once() {
    let server = RedisServer::start();
    let calls = Calls::default();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let cache = cache(&server, "batch", CallOptions::default()).await;
        for _ in 0..25 {
            let (cache, calls) = (cache.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                let got = cache
                    .get_or_compute_many(year(), TTL, report(&calls, Duration::from_millis(100)))
                    .await;
                assert_eq!(values(got), expected(&year()));
                cache
            }));
        }
    }
    for task in tasks {
        let cache = task.await.unwrap();
        assert_eq!(cache.in_flight(), 0);
    }
    let per_key = calls.per_key();
    assert_eq!(per_key.len(), 12);
    assert!(per_key.values().all(|&n| n == 1), "{per_key:?}");
    assert!(
        calls.count() <= 8,
        "at most one call of f per instance: {}",
        calls.count()
    );
}

async fn overlapping_batches_compute_each_key_once(cache: Cache) {
    let calls = Calls::default();
    let first: Vec<String> = (0..6).map(month).collect();
    let second: Vec<String> = (3..12).map(month).collect();
    let single = {
        let (cache, calls) = (cache.clone(), calls.clone());
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-12", TTL, move || async move {
                    calls.record(&["2019-12".to_string()]);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, std::io::Error>("2019-12:v".to_string())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let a = {
        let (cache, calls, first) = (cache.clone(), calls.clone(), first.clone());
        tokio::spawn(async move {
            cache
                .get_or_compute_many(&first, TTL, report(&calls, Duration::from_millis(200)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = cache
        .fetch_many(&second, TTL, {
            let report = report(&calls, Duration::from_millis(200));
            move |keys: Vec<(String, Lease)>| {
                let values = report(keys.into_iter().map(|(key, _lease)| key).collect());
                async move {
                    values.await.map(|v| {
                        v.into_iter()
                            .map(|(k, v)| (k, stampede_guard::Computed::new(v)))
                            .collect::<Vec<_>>()
                    })
                }
            }
        })
        .await;
    assert_eq!(values(a.await.unwrap()), expected(&first));
    assert_eq!(single.await.unwrap().unwrap(), "2019-12:v");
    let sources: Vec<Source> = b.iter().map(|r| r.as_ref().unwrap().source).collect();
    // 04..06 were the first batch's, 12 the single call's: waited for, not computed.
    assert_eq!(&sources[..3], &[Source::Waited; 3]);
    assert_eq!(&sources[3..8], &[Source::Computed; 5]);
    assert_eq!(sources[8], Source::Waited);
    let per_key = calls.per_key();
    assert_eq!(per_key.len(), 12);
    assert!(per_key.values().all(|&n| n == 1), "{per_key:?}");
    assert_eq!(
        calls.0.lock().unwrap()[2],
        (6..11).map(month).collect::<Vec<_>>(),
        "the second batch computed only the keys no one else was computing"
    );
    assert_eq!(cache.in_flight(), 0);
}

#[tokio::test]
async fn overlapping_batches_and_a_single_call_compute_each_key_once_on_redis() {
    let server = RedisServer::start();
    overlapping_batches_compute_each_key_once(
        cache(&server, "batch", CallOptions::default()).await,
    )
    .await;
}

#[tokio::test]
async fn overlapping_batches_and_a_single_call_compute_each_key_once_in_memory() {
    overlapping_batches_compute_each_key_once(Cache::in_memory()).await;
}

/// `f` leaves 2019-02 out: that key alone fails, nothing is cached for it, and its lock is
/// free at once: a caller of another instance that was waiting for it computes it itself long
/// before the lease would have run out.
async fn a_key_left_out_fails_alone_and_frees_its_lock(batcher: Cache, other: Cache) {
    let options = CallOptions::default().lease(Duration::from_secs(30));
    let batcher = batcher.with_options(options.clone());
    let other = other.with_options(options);
    let batch = tokio::spawn(async move {
        batcher
            .get_or_compute_many(["2019-01", "2019-02", "2019-03"], TTL, |keys| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let values: Vec<(String, u32)> = keys
                    .into_iter()
                    .filter(|k| k != "2019-02")
                    .map(|k| (k, 1))
                    .collect();
                Ok::<_, std::io::Error>(values)
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let waiter = other
        .fetch("2019-02", TTL, |_| async {
            Ok::<_, std::io::Error>(stampede_guard::Computed::new(2u32))
        })
        .await
        .unwrap();
    let got = batch.await.unwrap();
    assert_eq!(*got[0].as_ref().unwrap(), 1);
    assert!(
        matches!(&got[1], Err(Error::MissingFromBatch { key }) if key == "2019-02"),
        "{:?}",
        got[1]
    );
    assert_eq!(*got[2].as_ref().unwrap(), 1);
    assert_eq!((waiter.value, waiter.source), (2, Source::Computed));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the waiter took over when the key was left out, not at the lease: {:?}",
        started.elapsed()
    );
    assert_eq!(other.get::<u32>("2019-02").await.unwrap(), Some(2));
}

#[tokio::test]
async fn a_key_left_out_fails_alone_and_frees_its_lock_on_redis() {
    let server = RedisServer::start();
    let a = cache(&server, "batch", CallOptions::default()).await;
    let b = cache(&server, "batch", CallOptions::default()).await;
    a_key_left_out_fails_alone_and_frees_its_lock(a, b).await;
}

#[tokio::test]
async fn a_key_left_out_fails_alone_and_frees_its_lock_in_memory() {
    let cache =
        Cache::in_memory().with_options(CallOptions::default().lease(Duration::from_secs(30)));
    let got = cache
        .get_or_compute_many(["2019-01", "2019-02"], TTL, |keys| async move {
            let values: Vec<(String, u32)> = keys
                .into_iter()
                .filter(|k| k != "2019-02")
                .map(|k| (k, 1))
                .collect();
            Ok::<_, std::io::Error>(values)
        })
        .await;
    assert_eq!(*got[0].as_ref().unwrap(), 1);
    assert!(
        matches!(&got[1], Err(Error::MissingFromBatch { .. })),
        "{:?}",
        got[1]
    );
    // Its lock is free: the next call computes it at once (a lock left held would make it wait
    // for the 30 s lease).
    let next = tokio::time::timeout(
        Duration::from_secs(5),
        cache.fetch("2019-02", TTL, |_| async {
            Ok::<_, std::io::Error>(stampede_guard::Computed::new(2u32))
        }),
    )
    .await
    .expect("not held up by a leftover lock")
    .unwrap();
    assert_eq!((next.value, next.source), (2, Source::Computed));
    assert_eq!(cache.in_flight(), 0);
}

/// An error from `f` fails the keys it was computing, all with the same shared error, and no
/// other key: a hit in the same batch is still served.
#[tokio::test]
async fn an_error_fails_all_and_only_the_keys_it_was_computing() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    let _ = cache.set("2019-01", &1u32, TTL).await.unwrap();
    let got = cache
        .get_or_compute_many(["2019-01", "2019-02", "2019-03"], TTL, |_keys| async {
            Err::<Vec<(String, u32)>, _>(std::io::Error::other("the database is down"))
        })
        .await;
    assert_eq!(*got[0].as_ref().unwrap(), 1);
    let (Err(Error::Compute(a)), Err(Error::Compute(b))) = (&got[1], &got[2]) else {
        panic!("both computed keys fail: {got:?}");
    };
    assert!(
        stampede_guard::ComputeError::ptr_eq(a, b),
        "one shared error"
    );
    assert_eq!(a.to_string(), "the database is down");
    // Nothing cached, no lock left: the next call computes them.
    let again = cache
        .get_or_compute_many(["2019-02", "2019-03"], TTL, |keys| async move {
            Ok::<_, std::io::Error>(keys.into_iter().map(|k| (k, 7u32)).collect::<Vec<_>>())
        })
        .await;
    assert_eq!(
        again.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![7, 7]
    );
}

#[tokio::test]
async fn failures_are_remembered_per_key_with_a_negative_ttl() {
    let server = RedisServer::start();
    let options = CallOptions::default().negative_ttl(Some(Duration::from_secs(60)));
    let cache = cache(&server, "batch", options).await;
    let _ = cache.set("2019-01", &1u32, TTL).await.unwrap();
    let got = cache
        .get_or_compute_many(["2019-01", "2019-02"], TTL, |_keys| async {
            Err::<Vec<(String, u32)>, _>("no rows".to_string())
        })
        .await;
    assert!(got[1].as_ref().unwrap_err().is_compute());
    // Remembered for 2019-02 (every caller, any process, gets it without computing); 2019-01
    // keeps its value.
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let again = cache
        .get_or_compute_many(["2019-01", "2019-02"], TTL, move |keys| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, String>(keys.into_iter().map(|k| (k, 9u32)).collect::<Vec<_>>()) }
        })
        .await;
    assert_eq!(*again[0].as_ref().unwrap(), 1);
    assert!(
        matches!(&again[1], Err(Error::RecentFailure { key, message }) if key == "2019-02" && message == "no rows"),
        "{:?}",
        again[1]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// An invalidation of one key while `f` runs refuses that key's write only; the caller still
/// gets every value computed.
#[tokio::test]
async fn an_invalidation_during_the_batch_refuses_that_keys_write_only() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    let invalidator = cache.clone();
    let got = cache
        .get_or_compute_many(["2019-01", "2019-02", "2019-03"], TTL, move |keys| {
            let invalidator = invalidator.clone();
            async move {
                let _ = invalidator
                    .invalidate("2019-02")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(keys.into_iter().map(|k| (k, 5u32)).collect::<Vec<_>>())
            }
        })
        .await;
    assert_eq!(
        got.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![5, 5, 5]
    );
    assert_eq!(cache.get::<u32>("2019-01").await.unwrap(), Some(5));
    assert_eq!(
        cache.get::<u32>("2019-02").await.unwrap(),
        None,
        "fenced out"
    );
    assert_eq!(cache.get::<u32>("2019-03").await.unwrap(), Some(5));
}

/// A batch dropped while `f` runs frees every lock it took at once: a caller of another
/// instance waiting for one of its keys takes over within a backoff step, not at the lease.
async fn a_cancelled_batch_frees_every_lock(batcher: Cache, other: Cache) {
    let options = CallOptions::default().lease(Duration::from_secs(30));
    let batcher = batcher.with_options(options.clone());
    let other = other.with_options(options);
    let entered = Arc::new(tokio::sync::Notify::new());
    let signal = entered.clone();
    let handle = batcher.clone();
    let batch = tokio::spawn(async move {
        handle
            .get_or_compute_many(year(), TTL, move |_keys| {
                signal.notify_one();
                async {
                    std::future::pending::<()>().await;
                    Ok::<Vec<(String, u32)>, std::io::Error>(Vec::new())
                }
            })
            .await
    });
    entered.notified().await;
    let waiters: Vec<_> = ["2019-04", "2019-11"]
        .into_iter()
        .map(|key| {
            let other = other.clone();
            tokio::spawn(async move {
                other
                    .fetch(key, TTL, |_| async {
                        Ok::<_, std::io::Error>(stampede_guard::Computed::new(3u32))
                    })
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled = std::time::Instant::now();
    batch.abort();
    assert!(batch.await.unwrap_err().is_cancelled());
    for waiter in waiters {
        let fetched = waiter.await.unwrap().unwrap();
        assert_eq!((fetched.value, fetched.source), (3, Source::Computed));
    }
    assert!(
        cancelled.elapsed() < Duration::from_secs(5),
        "taken over at once, not at the 30 s lease: {:?}",
        cancelled.elapsed()
    );
    assert_eq!(batcher.in_flight(), 0, "nothing left behind");
}

#[tokio::test]
async fn a_cancelled_batch_frees_every_lock_on_redis() {
    let server = RedisServer::start();
    let a = cache(&server, "batch", CallOptions::default()).await;
    let b = cache(&server, "batch", CallOptions::default()).await;
    a_cancelled_batch_frees_every_lock(a, b).await;
}

#[tokio::test]
async fn a_cancelled_batch_frees_every_lock_in_memory() {
    // One store, one process: the waiters follow the batch's flights, find them abandoned, and
    // take the keys over; the locks the batch held must be free by then.
    let cache = Cache::in_memory();
    a_cancelled_batch_frees_every_lock(cache.clone(), cache).await;
}

#[tokio::test]
async fn a_panic_in_f_frees_every_lock() {
    let server = RedisServer::start();
    let cache = cache(
        &server,
        "batch",
        CallOptions::default().lease(Duration::from_secs(30)),
    )
    .await;
    let handle = cache.clone();
    let batch = tokio::spawn(async move {
        handle
            .get_or_compute_many(["2019-01", "2019-02"], TTL, |_keys| async {
                panic!("the query panicked");
                #[allow(unreachable_code)]
                Ok::<Vec<(String, u32)>, std::io::Error>(Vec::new())
            })
            .await
    });
    assert!(batch.await.unwrap_err().is_panic());
    let other = support::cache(&server, "batch", CallOptions::default()).await;
    let started = std::time::Instant::now();
    let got = other
        .get_or_compute_many(["2019-01", "2019-02"], TTL, |keys| async move {
            Ok::<_, std::io::Error>(keys.into_iter().map(|k| (k, 4u32)).collect::<Vec<_>>())
        })
        .await;
    assert_eq!(
        got.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![4, 4]
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(cache.in_flight(), 0);
}

#[tokio::test]
async fn invalidate_many_is_one_round_trip() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    for key in year() {
        let _ = cache.set(&key, &1u8, TTL).await.unwrap();
    }
    let _ = cache.invalidate_many(["warm-up"]).await.unwrap(); // loads the script
    let monitor = Monitor::start(&server);
    let _ = cache.invalidate_many(year()).await.unwrap();
    let commands = monitor.commands_until_now(&server);
    assert_eq!(commands, vec!["EVALSHA"], "{commands:?}");
    for key in year() {
        assert_eq!(cache.get::<u8>(&key).await.unwrap(), None);
    }
}

/// A server that lacks a script (new, restarted, flushed) gets it loaded once, however many
/// calls meet that together: here the chunks of one `invalidate_many`, sent at once. Each load
/// compiles the script on the server; every chunk loading it was 40 loads here.
#[tokio::test]
async fn a_script_the_server_lacks_is_loaded_once_for_the_calls_that_meet_that_together() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    let keys: Vec<String> = (0..5_000).map(|i| format!("k{i}")).collect();
    let monitor = Monitor::start(&server);
    let _ = cache.invalidate_many(&keys).await.unwrap();
    let commands = monitor.commands_until_now(&server);
    let sent = |name: &str| commands.iter().filter(|c| *c == name).count();
    assert_eq!(sent("SCRIPT"), 1, "{commands:?}");
    assert!(
        sent("EVALSHA") > 2,
        "the keys went out in chunks: {commands:?}"
    );
}

#[tokio::test]
async fn the_near_tier_answers_the_keys_it_holds_without_a_request() {
    let server = RedisServer::start();
    let cache = Cache::builder()
        .redis_url(server.url())
        .namespace("batch")
        .near_cache(stampede_guard::NearCacheOptions::new(100))
        .build()
        .await
        .unwrap();
    let calls = Calls::default();
    values(
        cache
            .get_or_compute_many(year(), TTL, report(&calls, Duration::ZERO))
            .await,
    );
    // A computed value goes into the near tier at its next read, once the feed is live.
    let first: Vec<String> = (0..6).map(month).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while cache.stats().near_hits < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "the near tier never served"
        );
        values(
            cache
                .get_or_compute_many(&first, TTL, report(&calls, Duration::ZERO))
                .await,
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = cache.stats().near_hits;
    let monitor = Monitor::start(&server);
    let got = cache
        .get_or_compute_many(year(), TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(values(got), expected(&year()));
    // The six months held near cost nothing; the other six, one MGET.
    assert_eq!(monitor.commands_until_now(&server), vec!["MGET"]);
    assert_eq!(cache.stats().near_hits - before, 6);
    assert_eq!(calls.count(), 1);
}

/// Batches for the same keys started at once on several threads: the first to claim the keys
/// leads all of them and the others follow, so the computation is never split between them
/// (it once was, when each key was claimed on its own: two database queries for one year).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_batches_for_the_same_keys_call_f_once() {
    for round in 0..30 {
        let cache = Cache::in_memory();
        let calls = Calls::default();
        let keys: Vec<String> = (0..12).map(|i| format!("{round}-{i}")).collect();
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let (cache, keys) = (cache.clone(), keys.clone());
                let f = report(&calls, Duration::from_millis(20));
                tokio::spawn(async move { cache.get_or_compute_many(&keys, TTL, f).await })
            })
            .collect();
        for caller in callers {
            assert_eq!(values(caller.await.unwrap()), expected(&keys));
        }
        assert_eq!(
            calls.count(),
            1,
            "round {round}: {:?}",
            calls.0.lock().unwrap()
        );
    }
}

/// The fail-safe per key: a batch that fails over a kept value answers with it as the fallback
/// (never a hit) and leaves a throttled copy, not its remembered failure; within the throttle
/// a single-key call and a batch both get that copy without calling their computations.
#[tokio::test(start_paused = true)]
async fn a_failed_batch_serves_the_kept_value_and_leaves_a_throttled_copy() {
    let ttl = Duration::from_secs(60);
    let cache = Cache::in_memory().with_options(
        CallOptions::default()
            .fail_safe_for(Duration::from_secs(3600))
            .negative_ttl(Some(Duration::from_secs(30))),
    );
    cache
        .get_or_compute("2019-05", ttl, || async { Ok::<_, String>(7u32) })
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(120)).await;
    // Past its TTL: the batch computes 2019-05 and 2019-06 (never cached), and fails.
    let failed = cache
        .fetch_many(
            ["2019-05", "2019-06"],
            ttl,
            |_keys: Vec<(String, Lease)>| async {
                Err::<Vec<(String, stampede_guard::Computed<u32>)>, _>("database down".to_owned())
            },
        )
        .await;
    let kept = failed[0].as_ref().expect("the kept value");
    assert_eq!((kept.value, kept.source), (7, Source::FailSafe));
    assert!(matches!(failed[1], Err(Error::Compute(_))), "{failed:?}");
    // Within the throttle a single-key call gets the copy without computing (its source would
    // answer 99: only a throttled copy in the store keeps it from being called).
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let single = cache
        .fetch("2019-05", ttl, move |_| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(stampede_guard::Computed::new(99u32))
        })
        .await
        .unwrap();
    assert_eq!((single.value, single.source), (7, Source::FailSafe));
    // And a batch gets the same copy, as a fallback.
    let counted = Arc::clone(&calls);
    let batch = cache
        .get_or_compute_many(["2019-05"], ttl, move |keys: Vec<String>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, String>(keys.into_iter().map(|k| (k, 99u32)).collect::<Vec<_>>()) }
        })
        .await;
    assert_eq!(batch[0].as_ref().ok(), Some(&7));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the source is spared within the throttle"
    );
    // 2019-06 had no value to keep: its failure is remembered (the negative TTL).
    let remembered = cache
        .get_or_compute("2019-06", ttl, || async { Ok::<_, String>(1u32) })
        .await;
    assert!(
        matches!(remembered, Err(Error::RecentFailure { .. })),
        "{remembered:?}"
    );
}

/// A stale value in a batch is served as `Source::Stale` and refreshed in the background by a
/// call of `f` for that key alone, under that key's own lease; a fresh one starts nothing.
#[tokio::test(start_paused = true)]
async fn stale_keys_of_a_batch_are_refreshed_one_by_one_under_their_own_leases() {
    let ttl = Duration::from_secs(60);
    let cache =
        Cache::in_memory().with_options(CallOptions::default().stale_for(Duration::from_secs(600)));
    // Each call of `f`: its keys with their fencing tokens.
    type Asked = Arc<Mutex<Vec<Vec<(String, Option<u64>)>>>>;
    let asked = Asked::default();
    let f = {
        let asked = Arc::clone(&asked);
        move |keys: Vec<(String, Lease)>| {
            let asked = Arc::clone(&asked);
            async move {
                let call: Vec<(String, Option<u64>)> = keys
                    .iter()
                    .map(|(key, lease)| (key.clone(), lease.fencing_token()))
                    .collect();
                let round = {
                    let mut asked = asked.lock().unwrap();
                    asked.push(call);
                    asked.len()
                };
                let values = keys
                    .into_iter()
                    .map(|(key, _)| (key, stampede_guard::Computed::new(round)));
                Ok::<_, String>(values.collect::<Vec<_>>())
            }
        }
    };
    let first = cache.fetch_many(["a", "b"], ttl, f.clone()).await;
    assert!(first
        .iter()
        .all(|r| r.as_ref().unwrap().source == Source::Computed));
    tokio::time::advance(Duration::from_secs(120)).await;
    let _ = cache.set("c", &0usize, ttl).await.unwrap();
    let second = cache.fetch_many(["a", "b", "c"], ttl, f).await;
    let served: Vec<(usize, Source)> = second
        .iter()
        .map(|r| {
            let fetched = r.as_ref().unwrap();
            (fetched.value, fetched.source)
        })
        .collect();
    assert_eq!(
        served,
        [(1, Source::Stale), (1, Source::Stale), (0, Source::Hit)]
    );
    // The refreshes run in the background: one call of `f` per stale key, each alone.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let calls = asked.lock().unwrap().clone();
    assert_eq!(calls.len(), 3, "{calls:?}");
    let mut refreshed: Vec<&str> = calls[1..].iter().map(|c| c[0].0.as_str()).collect();
    refreshed.sort();
    assert_eq!(refreshed, ["a", "b"]);
    for call in &calls {
        assert!(
            call.iter().all(|(_, token)| token.is_some()),
            "every key is computed under its lease: {calls:?}"
        );
    }
    assert!(calls[1..].iter().all(|c| c.len() == 1));
    let now: Vec<usize> = cache
        .get_or_compute_many(["a", "b"], ttl, |_keys: Vec<String>| async {
            Err::<Vec<(String, usize)>, _>("not called".to_owned())
        })
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(
        now.iter().all(|&v| v > 1),
        "the refreshed values landed: {now:?}"
    );
}

/// A key the batch's computation leaves out is no answer for a single-key caller that joined
/// its flight: that caller computes the key with its own computation.
#[tokio::test(start_paused = true)]
async fn a_caller_following_a_key_the_batch_left_out_computes_it_itself() {
    let cache = Cache::in_memory();
    let batch = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute_many(
                    ["2019-05", "2019-06"],
                    TTL,
                    |keys: Vec<String>| async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let values = keys
                            .into_iter()
                            .filter(|k| k != "2019-05")
                            .map(|k| (k, 6u32));
                        Ok::<_, String>(values.collect::<Vec<_>>())
                    },
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let single = cache
        .get_or_compute("2019-05", TTL, move || async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(5u32)
        })
        .await;
    let batch = batch.await.unwrap();
    assert!(
        matches!(&batch[0], Err(Error::MissingFromBatch { key }) if key == "2019-05"),
        "{batch:?}"
    );
    assert_eq!(batch[1].as_ref().ok(), Some(&6));
    assert_eq!(single.ok(), Some(5), "the follower computed the key itself");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// One command as the server's slow log kept it: how long it ran and its arguments (at most
/// 32: past that, the last one says how many more there were).
struct Logged {
    micros: u64,
    args: Vec<Vec<u8>>,
}

impl Logged {
    fn name(&self) -> String {
        String::from_utf8_lossy(&self.args[0]).to_uppercase()
    }

    /// How many arguments the command had, the ones the slow log left out included.
    fn argc(&self) -> usize {
        let last = String::from_utf8_lossy(self.args.last().expect("a command name"));
        match last
            .strip_prefix("... (")
            .and_then(|rest| rest.strip_suffix(" more arguments)"))
        {
            Some(more) => self.args.len() - 1 + more.parse::<usize>().expect("a count"),
            None => self.args.len(),
        }
    }

    /// How many keys it carried: an `EVALSHA`'s `numkeys`, an `MGET`'s arguments.
    fn keys(&self) -> usize {
        match self.name().as_str() {
            "EVALSHA" | "EVAL" => String::from_utf8_lossy(&self.args[2])
                .parse()
                .expect("numkeys"),
            "MGET" => self.argc() - 1,
            _ => 0,
        }
    }
}

/// Every command the server ran since the slow log was last reset (it logs all of them: see
/// `log_every_command`).
fn slow_log(conn: &mut redis::Connection) -> Vec<Logged> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(conn)
        .expect("SLOWLOG GET");
    entries
        .into_iter()
        .map(|entry| {
            let (_id, _at, micros, args, ..): (u64, u64, u64, Vec<Vec<u8>>, String, String) =
                redis::from_redis_value(entry).expect("a slow log entry");
            Logged { micros, args }
        })
        .collect()
}

/// Has the server log every command in its slow log (those scripts run inside too, about
/// fifteen per key of a cold batch), and empties it.
fn log_every_command(conn: &mut redis::Connection) {
    for (name, value) in [
        ("slowlog-log-slower-than", "0"),
        ("slowlog-max-len", "500000"),
    ] {
        let _: () = redis::cmd(&support::admin("CONFIG"))
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(conn)
            .expect("CONFIG SET");
    }
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query(conn)
        .expect("SLOWLOG RESET");
}

/// Issue 27: Redis runs one script (one command) at a time, so a batch that handed it every key
/// in one script held every other client of the server for as long (147 ms for 10,000 keys).
/// A cold batch of 10,000 keys now reaches the server in bounded chunks: no `MGET` and no script
/// carries more than a chunk's keys, every key is still read once and locked once, and `f` still
/// runs once for all of them. The same for `invalidate_many`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_cold_batch_reaches_redis_in_bounded_chunks() {
    const KEYS: usize = 10_000;
    let chunk = stampede_guard::__private::REDIS_CHUNK_KEYS;
    let server = RedisServer::start();
    let mut admin = server.conn();
    // No circuit breaker: this test counts commands, and with every command logged to the slow
    // log on a machine busy with other builds (load 6-8 on 2 cores), the server went quiet for
    // its stall bound and the breaker failed the batch (half of the runs, before and after the
    // chunking). Its own tests are tests/outage.rs's.
    let cache = Cache::builder()
        .redis_url(server.url())
        .namespace("big")
        .breaker(BreakerOptions::disabled())
        .build()
        .await
        .expect("a cache");
    let calls = Calls::default();
    let days: Vec<String> = (0..KEYS).map(|i| format!("day-{i:05}")).collect();
    // Connections up and scripts loaded first, as in a running service (a script's first call
    // is sent again after `NOSCRIPT`, which would count its keys twice).
    values(
        cache
            .get_or_compute_many(["warm-up"], TTL, report(&calls, Duration::ZERO))
            .await,
    );
    let _ = cache
        .invalidate_many(["warm-up"])
        .await
        .expect("invalidated");
    calls.0.lock().unwrap().clear();

    log_every_command(&mut admin);
    let got = cache
        .get_or_compute_many(&days, TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(values(got), expected(&days));
    assert_eq!(
        calls.count(),
        1,
        "one computation for every key, whatever the chunks"
    );
    assert_eq!(calls.per_key().len(), KEYS);
    let log = slow_log(&mut admin);
    let mgets: Vec<&Logged> = log.iter().filter(|c| c.name() == "MGET").collect();
    let scripts: Vec<&Logged> = log.iter().filter(|c| c.name() == "EVALSHA").collect();
    let widest_mget = mgets.iter().map(|c| c.keys()).max().unwrap_or(0);
    let widest_script = scripts.iter().map(|c| c.keys()).max().unwrap_or(0);
    let longest = log.iter().max_by_key(|c| c.micros).expect("commands");
    eprintln!(
        "{} commands: {} MGETs (widest {widest_mget} keys), {} scripts (widest {widest_script} \
         keys), longest {} of {} keys, {} µs",
        log.len(),
        mgets.len(),
        scripts.len(),
        longest.name(),
        longest.keys(),
        longest.micros,
    );
    assert_eq!(
        mgets.iter().map(|c| c.keys()).sum::<usize>(),
        KEYS + 1,
        "every key read once, and the namespace's epoch"
    );
    assert!(widest_mget <= chunk, "an MGET of {widest_mget} keys");
    // Read-or-lock takes three keys per entry (value, lock, fence).
    assert!(
        widest_script <= 3 * chunk,
        "a script over {widest_script} keys"
    );
    // The locks were taken by the batch scripts, one entry each, not key by key.
    let locked: usize = scripts
        .iter()
        .filter(|c| c.keys() > 3)
        .map(|c| c.keys() / 3)
        .sum();
    assert!(
        locked >= KEYS - chunk,
        "{locked} keys locked by batch scripts"
    );

    log_every_command(&mut admin);
    let _ = cache.invalidate_many(&days).await.expect("invalidated");
    let log = slow_log(&mut admin);
    let scripts: Vec<&Logged> = log.iter().filter(|c| c.name() == "EVALSHA").collect();
    // Invalidate takes two keys per entry (value, fence).
    assert_eq!(
        scripts.iter().map(|c| c.keys()).sum::<usize>(),
        2 * KEYS,
        "every key invalidated once"
    );
    let widest = scripts.iter().map(|c| c.keys()).max().unwrap_or(0);
    assert!(widest <= 2 * chunk, "an invalidation over {widest} keys");
    let got = cache
        .get_or_compute_many(&days, TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(values(got), expected(&days));
    assert_eq!(calls.count(), 2, "every key computed again, in one call");
}

/// Above `MAX_BATCH_KEYS` a many-key call is refused whole, on every store: each key gets the
/// error, `f` never runs, nothing is invalidated; never a batch cut short.
#[tokio::test]
async fn a_call_over_the_key_limit_is_refused_whole() {
    let cache = Cache::in_memory();
    let calls = Calls::default();
    let _ = cache.set("day-0", &"kept".to_owned(), TTL).await.unwrap();
    let over: Vec<String> = (0..=stampede_guard::MAX_BATCH_KEYS)
        .map(|i| format!("day-{i}"))
        .collect();
    let got = cache
        .get_or_compute_many(&over, TTL, report(&calls, Duration::ZERO))
        .await;
    assert_eq!(got.len(), over.len());
    assert!(got.iter().all(|r| matches!(
        r,
        Err(Error::TooManyKeys { keys, limit })
            if *keys == over.len() && *limit == stampede_guard::MAX_BATCH_KEYS
    )));
    assert_eq!(calls.count(), 0);
    let refused = cache.invalidate_many(&over).await;
    assert!(
        matches!(refused, Err(Error::TooManyKeys { .. })),
        "{refused:?}"
    );
    assert_eq!(
        cache.get::<String>("day-0").await.unwrap().as_deref(),
        Some("kept")
    );

    // At the limit, the call goes through.
    let at = &over[..stampede_guard::MAX_BATCH_KEYS];
    let _ = cache.invalidate_many(at).await.expect("at the limit");
    assert_eq!(cache.get::<String>("day-0").await.unwrap(), None);
}

/// `get_or_compute_many_with` takes an `FnOnce` whose captures (the tenant, a map from each key
/// back to its month) move into its future, and runs a clone of it for each call of the batch:
/// the first, and the background refresh of each stale key, on a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_with_form_runs_a_clone_of_its_fnonce_computation_per_call() {
    let redis = RedisServer::start();
    let options = CallOptions::default().stale_for(Duration::from_secs(60));
    let cache = cache(&redis, "with-form", options).await;
    let tenant = String::from("acme");
    let months: HashMap<String, usize> =
        (0..3).map(|i| (format!("acme:{}", month(i)), i)).collect();
    let mut keys: Vec<String> = months.keys().cloned().collect();
    keys.sort();
    let calls = Calls::default();
    let recorded = calls.clone();
    let f = move |missing: Vec<String>, prices: Arc<Vec<u64>>| async move {
        calls.record(&missing);
        let call = calls.count();
        let values = missing.into_iter().map(|key| {
            let value = format!("{tenant} {} call {call}", prices[months[&key]]);
            (key, value)
        });
        Ok::<_, std::io::Error>(values.collect::<Vec<_>>())
    };
    let prices = Arc::new(vec![10u64, 20, 30]);
    let ttl = Duration::from_secs(1);
    let first: Vec<String> = cache
        .get_or_compute_many_with(&keys, ttl, &prices, f.clone())
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        first,
        ["acme 10 call 1", "acme 20 call 1", "acme 30 call 1"]
    );

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let stale: Vec<String> = cache
        .get_or_compute_many_with(&keys, ttl, &prices, f)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stale, first, "served stale while each key is refreshed");
    // One refresh per stale key, each a call of its own clone of `f`, alone; its values land.
    let mut refreshed = Vec::new();
    for _ in 0..500 {
        refreshed.clear();
        for key in &keys {
            refreshed.push(cache.get::<String>(key).await.unwrap().unwrap_or_default());
        }
        if refreshed.iter().all(|value| !value.ends_with("call 1")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (value, price) in refreshed.iter().zip([10, 20, 30]) {
        assert!(
            value.starts_with(&format!("acme {price} call ")),
            "{refreshed:?}"
        );
        assert!(!value.ends_with("call 1"), "{refreshed:?}");
    }
    assert_eq!(recorded.count(), 4, "{:?}", recorded.per_key());
    assert!(recorded.per_key().values().all(|&n| n == 2));
}
