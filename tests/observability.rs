//! What a cache reports about itself: `Cache::stats()`. (The `metrics` facade: tests/metrics.rs.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, Error};

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
    holder.abort();
}
