//! What a cache reports about itself: `Cache::stats()`. (The `metrics` facade: tests/metrics.rs.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, Error};
use support::RedisServer;

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod server;
    pub use server::*;
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn stats_count_a_stampede_as_one_computation_and_the_rest_as_waits() {
    let cache = Cache::in_memory().with_options(CallOptions::default().lease(3 * SECOND));
    let computes = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for _ in 0..100 {
        let (cache, computes) = (cache.clone(), computes.clone());
        callers.push(tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, move || async move {
                    computes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(10 * SECOND).await; // three leases: renewed
                    Ok::<_, String>(1u8)
                })
                .await
        }));
    }
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    let _: u8 = cache
        .get_or_compute("2019-05", 60 * SECOND, || async { Ok::<_, String>(2) })
        .await
        .unwrap();
    let stats = cache.stats();
    assert_eq!(stats.computes, 1);
    assert_eq!(stats.misses, 100);
    assert_eq!(stats.waits, 99);
    assert_eq!(stats.hits, 1);
    assert!(stats.wait_time >= 99 * 9 * SECOND, "{:?}", stats.wait_time);
    assert!(
        stats.lease_renewals >= 3,
        "renewed while computing: {stats:?}"
    );
    assert_eq!(stats.leases_lost, 0);
    // The same calls, each counted once by how it was answered: one computed, 99 joined this
    // process's flight (saved a computation), and the later call a hit.
    let calls = stats.calls;
    assert_eq!((calls.computed, calls.joined, calls.hit), (1, 99, 1));
    assert_eq!(calls.total(), 101);
    assert_eq!(stats.computations_saved, 99);
    assert!(
        stats.compute_time >= 10 * SECOND,
        "{:?}",
        stats.compute_time
    );

    let impatient = cache.with_options(CallOptions::default().wait_timeout(SECOND));
    let holder = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-06", 60 * SECOND, || async {
                    tokio::time::sleep(3600 * SECOND).await;
                    Ok::<_, String>(0u8)
                })
                .await
        })
    };
    tokio::task::yield_now().await;
    let timed_out = impatient
        .get_or_compute("2019-06", 60 * SECOND, || async { Ok::<_, String>(0u8) })
        .await;
    assert!(matches!(timed_out, Err(Error::WaitTimeout { .. })));
    assert_eq!(cache.stats().wait_timeouts, 1);
    assert_eq!(
        cache.stats().calls.error,
        1,
        "a time-out is an error answer, once"
    );
    holder.abort();
}

/// Two caches on one Redis, as two instances of a service: `n` callers on each, cold key.
async fn two_instances(server: &RedisServer) -> (Cache, Cache) {
    let build = || {
        Cache::builder()
            .redis_url(server.url())
            .namespace("observability")
            .build()
    };
    (build().await.unwrap(), build().await.unwrap())
}

#[tokio::test]
async fn across_two_instances_one_computes_one_waits_on_the_lock_and_the_rest_join() {
    let server = RedisServer::start();
    let (a, b) = two_instances(&server).await;
    let mut callers = Vec::new();
    for cache in [&a, &b] {
        for _ in 0..10 {
            let cache = cache.clone();
            callers.push(tokio::spawn(async move {
                cache
                    .get_or_compute("2019-05", 60 * SECOND, || async {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok::<_, String>(5u8)
                    })
                    .await
            }));
        }
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), 5);
    }
    let (a, b) = (a.stats(), b.stats());
    let sum = |f: fn(&stampede_guard::Stats) -> u64| f(&a) + f(&b);
    assert_eq!(sum(|s| s.calls.total()), 20, "each call once: {a:?} {b:?}");
    assert_eq!(sum(|s| s.calls.computed), 1);
    assert_eq!(sum(|s| s.computes), 1);
    // The other instance's leader waited on the lock; everyone else joined a flight.
    assert_eq!(sum(|s| s.calls.waited), 1, "{a:?} {b:?}");
    assert_eq!(sum(|s| s.calls.joined), 18);
    assert_eq!(sum(|s| s.computations_saved), 19);
    assert_eq!(sum(|s| s.lock_takeovers), 0);
}

#[tokio::test]
async fn a_lock_freed_without_a_value_is_taken_over_by_its_waiter_and_counted() {
    let server = RedisServer::start();
    let (a, b) = two_instances(&server).await;
    let holder = tokio::spawn(async move {
        a.get_or_compute("2019-06", 60 * SECOND, || async {
            tokio::time::sleep(3600 * SECOND).await;
            Ok::<_, String>(0u8)
        })
        .await
    });
    // The holder has the lock once its computation runs; then it goes away (cancelled), and
    // its lock is freed with no value written.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.get_or_compute("2019-06", 60 * SECOND, || async { Ok::<_, String>(6u8) })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.abort();
    assert_eq!(waiter.await.unwrap().unwrap(), 6);
    let stats = b.stats();
    assert_eq!(stats.lock_takeovers, 1, "{stats:?}");
    assert_eq!((stats.calls.computed, stats.calls.total()), (1, 1));
}

#[tokio::test]
async fn each_key_of_a_batch_is_one_call_a_store_hit_is_no_near_hit() {
    let cache = Cache::in_memory();
    let months = ["2019-01", "2019-02", "2019-03"];
    let compute = |keys: Vec<String>| async move {
        Ok::<_, String>(keys.into_iter().map(|k| (k, 1u8)).collect::<Vec<_>>())
    };
    for _ in 0..2 {
        let answers = cache
            .get_or_compute_many(months, 60 * SECOND, compute)
            .await;
        assert!(answers.iter().all(|answer| matches!(answer, Ok(1))));
    }
    // Computed by the first batch, read from the store by the second: no near tier here.
    let calls = cache.stats().calls;
    assert_eq!((calls.computed, calls.hit, calls.near_hit), (3, 3, 0));
    assert_eq!(calls.total(), 6);
}
