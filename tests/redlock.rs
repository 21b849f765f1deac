//! Redlock over five independent redis-server processes started by the test: quorum with nodes
//! down, no quorum, fencing across masters, and a node restarted empty mid-hold.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod server;
    pub mod signal;
    pub use {server::*, signal::*};
}

use std::time::{Duration, Instant};

use redis::Commands;
use stampede_guard::{CallOptions, Error, Lock, Redlock};
use support::RedisServer;

fn five_nodes() -> Vec<RedisServer> {
    std::thread::scope(|s| {
        let starting: Vec<_> = (0..5).map(|_| s.spawn(RedisServer::start)).collect();
        starting
            .into_iter()
            .map(|h| h.join().expect("a node"))
            .collect()
    })
}

async fn redlock(nodes: &[RedisServer], options: CallOptions) -> Lock {
    Redlock::builder("copy-counters")
        .nodes(nodes.iter().map(RedisServer::url))
        .namespace("jobs")
        .options(options)
        .build()
        .await
        .expect("a Redlock over the test nodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_five_nodes_down_the_lock_is_still_taken() {
    let mut nodes = five_nodes();
    let lock = redlock(&nodes, CallOptions::default()).await;
    nodes[0].kill();
    nodes[3].kill();
    let guard = lock.acquire().await.unwrap();
    assert!(guard.is_held());
    let other = redlock(&nodes, CallOptions::default()).await;
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "a majority holds it"
    );
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let next = other
        .try_acquire()
        .await
        .unwrap()
        .expect("released on the live majority");
    assert!(next.fencing_token() > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_of_five_nodes_gone_it_is_a_typed_no_quorum_error_well_within_the_lease() {
    let mut nodes = five_nodes();
    let lease = Duration::from_secs(10);
    let options = CallOptions::default()
        .lease(lease)
        .wait_timeout(Duration::from_secs(30));
    let lock = redlock(&nodes, options).await;
    nodes[1].kill();
    // Paused rather than killed: these never answer, so only the per-node timeout ends the wait.
    support::signal(nodes[2].pid().unwrap(), "STOP");
    support::signal(nodes[4].pid().unwrap(), "STOP");
    let started = Instant::now();
    let err = lock.acquire().await.unwrap_err();
    let took = started.elapsed();
    support::signal(nodes[2].pid().unwrap(), "CONT");
    support::signal(nodes[4].pid().unwrap(), "CONT");
    assert!(
        matches!(
            err,
            Error::NoQuorum {
                reached: 2,
                needed: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(took < lease / 4, "no quorum took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_across_majorities_that_do_not_share_the_highest_counter() {
    let nodes = five_nodes();
    let lock = redlock(&nodes, CallOptions::default()).await;
    // Make the counters diverge: node 0's is far ahead of the others.
    let mut conn = nodes[0].conn();
    let _: () = conn
        .set("jobs:{copy-counters}_fence", 9_000_000_000_000_000u64)
        .unwrap();

    let mut last = 0;
    // Each acquisition sees a different majority: the others are paused.
    for up in [[0, 1, 2], [2, 3, 4], [1, 3, 4], [0, 3, 4], [1, 2, 3]] {
        let down: Vec<usize> = (0..5).filter(|i| !up.contains(i)).collect();
        for &i in &down {
            support::signal(nodes[i].pid().unwrap(), "STOP");
        }
        let guard = lock.acquire().await;
        for &i in &down {
            support::signal(nodes[i].pid().unwrap(), "CONT");
        }
        let guard = guard.unwrap_or_else(|e| panic!("majority {up:?}: {e:?}"));
        let token = guard.fencing_token();
        assert!(
            token > last,
            "majority {up:?} handed out {token} after {last}"
        );
        last = token;
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_mid_hold_gives_no_one_else_a_majority() {
    let mut nodes = five_nodes();
    let options = CallOptions::default().lease(Duration::from_secs(2));
    let holder = redlock(&nodes, options.clone()).await;
    let rival = redlock(&nodes, options).await;
    let guard = holder.acquire().await.unwrap();
    nodes[2].restart(); // forgets the lock
    for _ in 0..10 {
        assert!(
            rival.try_acquire().await.unwrap().is_none(),
            "a second holder got a majority"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(guard.is_held(), "renewal kept the majority");
    guard.release().await.unwrap();
    assert!(rival.try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_even_or_small_node_count_is_refused() {
    for n in [1usize, 2, 4] {
        let err = Redlock::builder("x")
            .nodes((0..n).map(|i| format!("redis://127.0.0.1:{}", 1000 + i)))
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{n} nodes: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_can_take_its_per_key_locks_through_redlock() {
    let lock_nodes = five_nodes();
    let values = RedisServer::start();
    let urls: Vec<String> = lock_nodes.iter().map(RedisServer::url).collect();
    let mut caches = Vec::new();
    for _ in 0..4 {
        caches.push(
            stampede_guard::Cache::builder()
                .redis_url(values.url())
                .redlock(urls.clone())
                .namespace("reports")
                .build()
                .await
                .unwrap(),
        );
    }
    let computes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut callers = Vec::new();
    for i in 0..100 {
        let (cache, computes) = (caches[i % 4].clone(), computes.clone());
        callers.push(tokio::spawn(async move {
            for m in ["2019-01", "2019-02", "2019-03", "2019-04"] {
                let (computes, key) = (computes.clone(), m.to_string());
                let v = cache
                    .get_or_compute(m, Duration::from_secs(300), move || async move {
                        computes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, String>(format!("report {key}"))
                    })
                    .await
                    .unwrap();
                assert_eq!(v, format!("report {m}"));
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(
        computes.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "each month once"
    );

    // The locks live on the quorum, the values on their own server.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let computing = {
        let cache = caches[0].clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
                    let _ = started_tx.send(());
                    let _ = go_rx.await;
                    Ok::<_, String>("computed before the invalidation".to_string())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let on_quorum = lock_nodes
        .iter()
        .filter(|n| {
            n.conn()
                .exists::<_, bool>("reports:{2019-05}_lock")
                .unwrap()
        })
        .count();
    assert!(
        on_quorum >= 3,
        "the lock is held on a majority of the Redlock nodes"
    );
    assert!(!values
        .conn()
        .exists::<_, bool>("reports:{2019-05}_lock")
        .unwrap());
    // An invalidation during the computation refuses its write, across the two stores.
    let _ = caches[1].invalidate("2019-05").await.unwrap();
    go_tx.send(()).unwrap();
    assert_eq!(
        computing.await.unwrap().unwrap(),
        "computed before the invalidation"
    );
    assert_eq!(caches[2].get::<String>("2019-05").await.unwrap(), None);
    let fresh = caches[3]
        .get_or_compute("2019-05", Duration::from_secs(300), || async {
            Ok::<_, String>("fresh".to_string())
        })
        .await
        .unwrap();
    assert_eq!(fresh, "fresh");
    assert_eq!(
        caches[0].get::<String>("2019-05").await.unwrap().as_deref(),
        Some("fresh")
    );
}
