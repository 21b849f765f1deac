//! Connection settings ([`ConnectionOptions`]) against a listener the test controls: how many
//! attempts a call makes while no Redis answers, counted as accepted TCP connections.
//!
//! What the client does (redis-rs's `ConnectionManager`): the first call connects, with
//! `1 + reconnect_retries` attempts; a call that fails for want of a connection starts one
//! reconnection in the background (again `1 + reconnect_retries` attempts), which the next call
//! awaits or finds failed. So `n` calls in a row while the server is down make exactly
//! `(n + 1) * (1 + reconnect_retries)` attempts; a cache's `build()` adds one, the attempt of
//! its capability probe, on a connection of its own. The circuit breaker is off here: it exists to
//! stop exactly these attempts (`tests/outage.rs` tests it), and this file tests the client's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{BreakerOptions, Cache, ConnectionOptions, Lock, Redlock};
use tokio::net::TcpListener;

/// A loopback listener that accepts every connection and closes it at once, as a server that
/// dies during the handshake would: each accepted connection is one attempt of the client.
async fn hang_up_listener() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/0", listener.local_addr().unwrap());
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (url, attempts)
}

fn fail_fast(retries: usize) -> ConnectionOptions {
    ConnectionOptions::default()
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .reconnect_retries(retries)
}

/// Waits until the count has stayed put for a while, so that a late attempt would be counted.
async fn settled(attempts: &AtomicUsize) -> usize {
    let mut last = attempts.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let now = attempts.load(Ordering::SeqCst);
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failed_call_costs_one_attempt_plus_the_configured_retries() {
    for retries in [0, 2] {
        let (url, attempts) = hang_up_listener().await;
        let cache = Cache::builder()
            .redis_url(url.as_str())
            .connection(fail_fast(retries))
            .breaker(BreakerOptions::disabled())
            .build()
            .await
            .unwrap();
        // Building probes the server (its capabilities) over a one-off connection: one
        // attempt, whatever the retries of the data connection.
        let built = settled(&attempts).await;
        assert_eq!(built, 1, "building makes one attempt");
        for calls in 1..=3 {
            let e = cache.get::<u8>("k").await.unwrap_err();
            assert!(e.is_backend(), "{e:?}");
            assert_eq!(
                settled(&attempts).await,
                built + (calls + 1) * (1 + retries),
                "attempts after {calls} calls with reconnect_retries({retries})"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_redlock_nodes_use_the_connection_settings_too() {
    let (url, attempts) = hang_up_listener().await;
    let lock = Lock::builder("sync")
        .redis_url(url.as_str())
        .connection(fail_fast(0))
        .build()
        .await
        .unwrap();
    let e = lock.try_acquire().await.unwrap_err();
    assert!(e.is_backend(), "{e:?}");
    // Two calls, without retries: the acquisition, then (its connection dropped, so the server
    // may have granted it) the release of the lock it may hold.
    assert_eq!(settled(&attempts).await, 2 + 1);

    let mut nodes = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..3 {
        let (url, attempts) = hang_up_listener().await;
        nodes.push(url);
        counts.push(attempts);
    }
    let redlock = Redlock::builder("sync")
        .nodes(nodes)
        // Long enough for the refused attempts; the node bound is not what is tested here.
        .node_timeout(Duration::from_secs(3))
        .connection(fail_fast(1))
        .build()
        .await
        .unwrap();
    assert!(redlock.try_acquire().await.is_err());
    for attempts in &counts {
        // Two calls per node (the acquisition, then the release of whatever it took), each
        // with 1 + 1 retry, after the first connection's 1 + 1 and the build's: it connects
        // every node (1 + 1), so that a first acquisition does not set connections up within
        // the node timeout.
        assert_eq!(settled(attempts).await, 4 * 2);
    }
}
