//! A cache whose values live on one Redis and whose per-key locks are taken through a Redlock over
//! three others (`CacheBuilder::redlock`): taking the lock there is not one step with reading the
//! value, so the protocol has to make up for it.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod proxy;
    pub mod runtime;
    pub mod server;
    pub use {runtime::*, server::*};
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Backoff, Cache, CallOptions};
use support::proxy::{Mode, Proxy};
use support::runtime;
use support::RedisServer;

fn servers(n: usize) -> Vec<RedisServer> {
    std::thread::scope(|s| {
        let starting: Vec<_> = (0..n).map(|_| s.spawn(RedisServer::start)).collect();
        starting
            .into_iter()
            .map(|h| h.join().expect("a server"))
            .collect()
    })
}

async fn split_cache(values: &RedisServer, lock_urls: Vec<String>, options: CallOptions) -> Cache {
    Cache::builder()
        .redis_url(values.url())
        .redlock(lock_urls)
        .namespace("split")
        .options(options)
        .build()
        .await
        .expect("a cache with Redlock locks")
}

/// B reads the value (a miss: A is computing), then asks the lock nodes; its request is held in
/// the proxies until A has written its value and freed the lock, so B is granted the lock over a
/// value that has landed. B must read again before computing, or the value is computed twice.
#[test]
fn a_lock_granted_after_the_value_landed_is_not_computed_again() {
    let values = RedisServer::start();
    let lock_nodes = servers(3);
    // The proxies run their own runtimes: started and dropped outside the test's.
    let held: Vec<Proxy> = lock_nodes.iter().map(|n| Proxy::start(n.port())).collect();
    runtime().block_on(async {
        let options = CallOptions::default().lease(Duration::from_secs(30));
        let fast_a = split_cache(
            &values,
            lock_nodes.iter().map(RedisServer::url).collect(),
            options.clone(),
        )
        .await;
        let held_b = split_cache(&values, held.iter().map(Proxy::url).collect(), options).await;
        // Connected while the proxies pass.
        let warm_up = held_b.lock("warm-up").expect("a lock name");
        drop(warm_up.acquire().await.expect("the lock nodes answer"));
        let fence = || -> u64 {
            let mut conn = lock_nodes[0].conn();
            redis::cmd("GET")
                .arg("split:{2019-05}_fence")
                .query::<Option<u64>>(&mut conn)
                .expect("GET on a lock node")
                .unwrap_or(0)
        };

        let computes = Arc::new(AtomicUsize::new(0));
        let compute = |computes: Arc<AtomicUsize>| {
            move || async move {
                computes.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>("report for 2019-05".to_string())
            }
        };
        let (computing_tx, computing_rx) = tokio::sync::oneshot::channel();
        let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
        let a = tokio::spawn({
            let (cache, computes) = (fast_a.clone(), computes.clone());
            async move {
                cache
                    .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                        computes.fetch_add(1, Ordering::SeqCst);
                        let _ = computing_tx.send(());
                        let _ = finish_rx.await;
                        Ok::<_, std::io::Error>("report for 2019-05".to_string())
                    })
                    .await
            }
        });
        // B starts while A computes, so B's first read is a miss; its lock request is held.
        computing_rx.await.expect("A computes");
        for proxy in &held {
            proxy.set_mode(Mode::Blackhole);
        }
        let b = tokio::spawn({
            let (cache, computes) = (held_b.clone(), computes.clone());
            async move {
                cache
                    .get_or_compute("2019-05", Duration::from_secs(300), compute(computes))
                    .await
            }
        });
        // Give B's read and its lock request time to go out (the request then waits in the
        // proxies), then let A write its value and free the lock.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = finish_tx.send(());
        let a = a.await.expect("A's task").expect("A computes");
        let fence_after_a = fence();
        for proxy in &held {
            proxy.set_mode(Mode::Pass);
        }
        let b = b.await.expect("B's task").expect("B gets the value");
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("report for 2019-05", "report for 2019-05")
        );
        // A bump hands out at least the server's clock in µs, so the counter moved on, by one
        // or more: B's held request was granted the lock after A's value landed.
        assert!(
            fence() > fence_after_a,
            "B's held request was granted the lock (the case this test is about)"
        );
        assert_eq!(computes.load(Ordering::SeqCst), 1, "computed twice");
    });
}

/// A computation that fails frees its lock on the lock nodes; the waiters listen on the value
/// store and must be woken there, not left to their backoff (here longer than the test's bound).
#[test]
fn waiters_learn_of_a_failed_computation_at_once() {
    let values = RedisServer::start();
    let lock_nodes = servers(3);
    let urls: Vec<String> = lock_nodes.iter().map(RedisServer::url).collect();
    runtime().block_on(async {
        let options = CallOptions::default()
            .lease(Duration::from_secs(30))
            .wait_timeout(Duration::from_secs(120))
            .backoff(Backoff::new(
                Duration::from_secs(60),
                Duration::from_secs(60),
            ));
        let failing = split_cache(&values, urls.clone(), options.clone()).await;
        let waiting = split_cache(&values, urls, options).await;

        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let failed = tokio::spawn(async move {
            failing
                .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                    let _ = started_tx.send(());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Err::<String, _>(std::io::Error::other("the database is down"))
                })
                .await
        });
        started_rx.await.expect("the failing computation starts");
        let waited = tokio::time::timeout(
            Duration::from_secs(20),
            waiting.get_or_compute("2019-05", Duration::from_secs(300), || async {
                Ok::<_, std::io::Error>("computed by the waiter".to_string())
            }),
        )
        .await
        .expect("woken by the release, not by the 60 s backoff")
        .expect("the waiter computes after the failure");
        assert_eq!(waited, "computed by the waiter");
        assert!(failed.await.expect("the failing task").is_err());
    });
}

/// A holder paused (here: computing without renewal) for longer than the value store's fencing
/// counter lives after an invalidation must not write its now stale value: a counter that lapsed
/// refuses the write instead of taking any token.
#[test]
fn a_holder_paused_past_the_counters_life_does_not_write_over_an_invalidation() {
    let values = RedisServer::start();
    let lock_nodes = servers(3);
    let urls: Vec<String> = lock_nodes.iter().map(RedisServer::url).collect();
    runtime().block_on(async {
        // Not shorter: each Redlock node gets a twentieth of the lease to answer (at least 10 ms),
        // which a loaded machine missed with 200 ms (NoQuorum).
        let lease = Duration::from_secs(1);
        let paused = split_cache(
            &values,
            urls.clone(),
            CallOptions::default().lease(lease).renew(false),
        )
        .await;
        // Its invalidation keeps the counter for two of its (short) leases.
        let other = split_cache(&values, urls, CallOptions::default().lease(lease)).await;
        let (computing_tx, computing_rx) = tokio::sync::oneshot::channel();
        let computation = tokio::spawn(async move {
            paused
                .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                    let _ = computing_tx.send(());
                    // Far past the lease and the counter's retention (two leases).
                    tokio::time::sleep(lease * 6).await;
                    Ok::<_, std::io::Error>("stale: computed before the invalidation".to_string())
                })
                .await
        });
        if computing_rx.await.is_err() {
            // The call ended before computing: say how (a NoQuorum on a loaded machine, ...).
            let ended = computation.await.expect("the task");
            panic!("the computation never started; the call returned {ended:?}");
        }
        let _ = other.invalidate("2019-05").await.expect("invalidated");
        let returned = computation
            .await
            .expect("the task")
            .expect("its caller gets it");
        assert_eq!(returned, "stale: computed before the invalidation");
        assert_eq!(
            other.get::<String>("2019-05").await.expect("read"),
            None,
            "the stale value was written after the invalidation"
        );
    });
}
