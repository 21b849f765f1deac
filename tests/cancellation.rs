//! A caller dropped while its lock request is in flight: the server may already have granted the
//! lock, but the caller never sees the answer. The lock must still be freed at once (not after a
//! whole lease), or every waiter in the fleet stalls for the lease.
//!
//! A delaying proxy in front of a real redis-server makes the window between "granted on the
//! server" and "answer received" wide, and the caller is dropped at many points across it.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod poll;
    pub mod proxy;
    pub mod runtime;
    pub mod server;
    pub use {cache::*, poll::*, runtime::*, server::*};
}

use std::time::Duration;

use redis::Commands;
use stampede_guard::{CallOptions, Lock};
use support::proxy::{Mode, Proxy};
use support::{cache, runtime};
use support::{eventually, RedisServer};

/// Long enough that a lock left to expire could never pass for one that was freed.
const LEASE: Duration = Duration::from_secs(60);
/// Each chunk crosses the proxy this late, in both directions.
const DELAY: Duration = Duration::from_millis(80);

fn lock_exists(server: &RedisServer, key: &str) -> bool {
    let exists: bool = server
        .conn()
        .exists(key)
        .expect("EXISTS on the test server");
    exists
}

/// Drops `call(i)` at many points of its acquisition, then checks each time that no lock is left
/// behind: first at fixed delays across the whole cold path (before the request, while it is in
/// flight, after the guard exists), then right as the lock appears on the server, which is the
/// moment the grant is on its way back through the delaying proxy and the caller has not seen it.
async fn drop_at_every_point<F, Fut>(server: &RedisServer, lock_key: &str, call: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let fixed = (0..=640).step_by(80).map(Some);
    let on_grant = std::iter::repeat_n(None, 6);
    for (i, after_ms) in fixed.chain(on_grant).enumerate() {
        let key = lock_key.replace("{i}", &i.to_string());
        let task = tokio::spawn(call(i));
        match after_ms {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => assert!(
                eventually(Duration::from_secs(10), || lock_exists(server, &key)),
                "the lock {key} was never taken"
            ),
        }
        task.abort();
        let _ = task.await;
        // Freed through the (delayed) proxy by the dropped caller, far sooner than the lease.
        assert!(
            eventually(Duration::from_secs(10), || !lock_exists(server, &key)),
            "the lock {key} of a caller dropped {} was left to its {LEASE:?} lease",
            after_ms.map_or("as the server granted it".to_owned(), |ms| format!(
                "after {ms} ms"
            ))
        );
    }
}

/// The proxy runs its own runtime, so it is started (and dropped) outside the test's.
fn with_delaying_proxy(test: impl AsyncFnOnce(&RedisServer, &Proxy)) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_mode(Mode::Delay(DELAY));
    runtime().block_on(test(&server, &proxy));
}

#[test]
fn a_caller_dropped_during_lock_acquisition_frees_the_lock() {
    with_delaying_proxy(async |server, proxy| {
        let cache = cache(
            proxy.url().as_str(),
            "cancel",
            CallOptions::default().lease(LEASE),
        )
        .await;
        // Connect (and calibrate the clock) first, so that every drop below falls into a
        // request, not the connection set-up.
        let _ = cache
            .set("warm-up", &"ready".to_string(), Duration::from_secs(60))
            .await
            .expect("the proxy passes");

        drop_at_every_point(server, "cancel:{month-{i}}_lock", |i| {
            let cache = cache.clone();
            async move {
                let _ = cache
                    .get_or_compute(&format!("month-{i}"), Duration::from_secs(300), || async {
                        // The computation never ends: only the drop ends this call.
                        std::future::pending::<Result<String, std::io::Error>>().await
                    })
                    .await;
            }
        })
        .await;
    });
}

#[test]
fn a_lock_acquisition_dropped_in_flight_frees_the_lock() {
    with_delaying_proxy(async |server, proxy| {
        let mut locks = Vec::new();
        for i in 0..15 {
            let lock = Lock::builder(format!("job-{i}"))
                .redis_url(proxy.url())
                .namespace("cancel")
                .options(CallOptions::default().lease(LEASE))
                .build()
                .await
                .expect("a lock through the proxy");
            locks.push(lock);
        }
        // Connect every lock's connections first (a try and a release), so drops hit the request.
        for lock in &locks {
            let guard = lock.try_acquire().await.expect("the proxy passes");
            guard
                .expect("free")
                .release()
                .await
                .expect("released while held");
        }

        drop_at_every_point(server, "cancel:{job-{i}}_lock", |i| {
            let lock = locks[i].clone();
            async move {
                if let Ok(guard) = lock.acquire().await {
                    // Held: keep it until dropped, as a job would.
                    std::future::pending::<()>().await;
                    drop(guard);
                }
            }
        })
        .await;
    });
}
