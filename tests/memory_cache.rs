//! The embedded memory store's timing logic, under paused tokio time: TTLs, leases, wait bounds
//! and clean-up are checked to the millisecond of virtual time, without waiting for real time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, Error};
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);

fn counting(counter: &Arc<AtomicUsize>) -> Arc<AtomicUsize> {
    Arc::clone(counter)
}

#[tokio::test(start_paused = true)]
async fn concurrent_callers_share_one_computation() {
    let cache = Cache::in_memory();
    let computes = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for _ in 0..100 {
        let (cache, computes) = (cache.clone(), counting(&computes));
        callers.push(tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, move || async move {
                    computes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(SECOND).await;
                    Ok::<_, String>(5u32)
                })
                .await
        }));
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), 5);
    }
    assert_eq!(computes.load(Ordering::SeqCst), 1);
    assert_eq!(cache.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_value_is_served_until_its_ttl_and_recomputed_after() {
    let cache = Cache::in_memory();
    let computes = Arc::new(AtomicUsize::new(0));
    let call = |cache: Cache, computes: Arc<AtomicUsize>| async move {
        cache
            .get_or_compute("2019-05", 60 * SECOND, move || async move {
                Ok::<_, String>(computes.fetch_add(1, Ordering::SeqCst))
            })
            .await
            .unwrap()
    };
    assert_eq!(call(cache.clone(), counting(&computes)).await, 0);
    tokio::time::advance(60 * SECOND - Duration::from_millis(1)).await;
    assert_eq!(
        call(cache.clone(), counting(&computes)).await,
        0,
        "still fresh"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        call(cache.clone(), counting(&computes)).await,
        1,
        "expired: recomputed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiting_caller_gives_up_exactly_at_its_bound() {
    let cache = Cache::in_memory();
    let holder = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, move || async move {
                    tokio::time::sleep(3600 * SECOND).await;
                    Ok::<_, String>(1u8)
                })
                .await
        })
    };
    tokio::task::yield_now().await;
    let patient = cache.with_options(CallOptions::default().wait_timeout(2 * SECOND));
    let started = Instant::now();
    let result = patient
        .get_or_compute("2019-05", 60 * SECOND, move || async move {
            Ok::<_, String>(2u8)
        })
        .await;
    assert!(
        matches!(result, Err(Error::WaitTimeout { .. })),
        "{result:?}"
    );
    assert_eq!(started.elapsed(), 2 * SECOND);
    holder.abort();
}

#[tokio::test(start_paused = true)]
async fn without_renewal_the_lease_is_lost_when_it_runs_out() {
    let cache =
        Cache::in_memory().with_options(CallOptions::default().lease(5 * SECOND).renew(false));
    let started = Instant::now();
    let lost_after = cache
        .get_or_compute_with_lease("2019-05", 60 * SECOND, move |lease| async move {
            lease.lost().await;
            Ok::<_, String>(started.elapsed())
        })
        .await
        .unwrap();
    // Less the 500 ppm a holder gives up for its clock's drift (to tokio's millisecond).
    let lease = 5 * SECOND;
    assert!(
        lost_after >= lease - lease / 2000 && lost_after < lease,
        "lost after {lost_after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_renewal_a_long_computation_keeps_its_lease_and_its_write() {
    let cache = Cache::in_memory().with_options(CallOptions::default().lease(3 * SECOND));
    let (value, lost) = cache
        .get_or_compute_with_lease("2019-05", 60 * SECOND, move |lease| async move {
            tokio::time::sleep(20 * SECOND).await;
            Ok::<_, String>((7u8, lease.is_lost()))
        })
        .await
        .unwrap();
    assert_eq!((value, lost), (7, false));
    assert_eq!(
        cache.get::<(u8, bool)>("2019-05").await.unwrap(),
        Some((7, false))
    );
}

#[tokio::test(start_paused = true)]
async fn failures_panics_and_cancellations_leave_no_lock_behind() {
    // A lease far beyond the wait bound: a stranded lock would show as a WaitTimeout.
    let cache = Cache::in_memory().with_options(
        CallOptions::default()
            .lease(3600 * SECOND)
            .wait_timeout(SECOND),
    );
    let next = |cache: Cache| async move {
        cache
            .get_or_compute("2019-05", 60 * SECOND, move || async move {
                Ok::<_, String>(9u8)
            })
            .await
    };

    let failed = cache
        .get_or_compute("2019-05", 60 * SECOND, move || async move {
            Err::<u8, _>("no".to_string())
        })
        .await;
    assert!(matches!(failed, Err(Error::Compute(_))));
    assert_eq!(cache.in_flight(), 0);
    assert_eq!(next(cache.clone()).await.unwrap(), 9);
    let _ = cache.invalidate("2019-05").await.unwrap();

    let panicking = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, move || async move {
                    panic!("boom");
                    #[allow(unreachable_code)]
                    Ok::<u8, String>(0)
                })
                .await
        })
    };
    assert!(panicking.await.is_err_and(|e| e.is_panic()));
    assert_eq!(cache.in_flight(), 0);
    assert_eq!(next(cache.clone()).await.unwrap(), 9);
    let _ = cache.invalidate("2019-05").await.unwrap();

    let hanging = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute(
                    "2019-05",
                    60 * SECOND,
                    std::future::pending::<Result<u8, String>>,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(cache.in_flight(), 1);
    hanging.abort();
    assert!(hanging.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(cache.in_flight(), 0);
    assert_eq!(next(cache.clone()).await.unwrap(), 9);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_during_the_computation_refuses_its_write() {
    let cache = Cache::in_memory();
    let computing = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, move || async move {
                    tokio::time::sleep(SECOND).await;
                    Ok::<_, String>("stale".to_string())
                })
                .await
        })
    };
    tokio::time::sleep(SECOND / 2).await;
    let _ = cache.invalidate("2019-05").await.unwrap();
    assert_eq!(computing.await.unwrap().unwrap(), "stale");
    assert_eq!(cache.get::<String>("2019-05").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_set_during_the_computation_wins_over_it() {
    let cache = Cache::in_memory();
    let computing = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, move || async move {
                    tokio::time::sleep(SECOND).await;
                    Ok::<_, String>("computed".to_string())
                })
                .await
        })
    };
    tokio::time::sleep(SECOND / 2).await;
    let _ = cache
        .set("2019-05", &"set by hand".to_string(), 60 * SECOND)
        .await
        .unwrap();
    assert_eq!(computing.await.unwrap().unwrap(), "computed");
    assert_eq!(
        cache.get::<String>("2019-05").await.unwrap().as_deref(),
        Some("set by hand")
    );
}

#[tokio::test(start_paused = true)]
async fn values_too_large_are_refused_with_a_clear_error() {
    let cache = Cache::in_memory();
    let huge = vec![0u8; stampede_guard::MAX_VALUE_BYTES + 1];
    let err = cache.set("big", &huge, SECOND).await.unwrap_err();
    assert!(matches!(err, Error::ValueTooLarge { .. }), "{err:?}");
    assert!(err.to_string().contains("over the limit"));
}

/// A call that starts after a write of its key does not join a computation of this process
/// that began before the write: it would be answered from data older than the write.
#[tokio::test(start_paused = true)]
async fn a_call_after_a_write_does_not_share_a_computation_from_before_it() {
    let cache = Cache::in_memory();
    let before = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", 60 * SECOND, || async {
                    tokio::time::sleep(SECOND).await;
                    Ok::<_, String>("read before the write".to_owned())
                })
                .await
        })
    };
    // The computation above is under way.
    tokio::time::sleep(SECOND / 10).await;
    let written = cache.invalidate("2019-05").await.unwrap();
    assert!(written.is_applied());
    let after = cache
        .get_or_compute("2019-05", 60 * SECOND, || async {
            Ok::<_, String>("read after the write".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(after, "read after the write");
    // The earlier caller still gets its own computation's value.
    assert_eq!(before.await.unwrap().unwrap(), "read before the write");
}
