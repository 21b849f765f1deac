//! `get_or_compute` against real redis-server processes started by the tests.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod monitor;
    pub mod poll;
    pub mod server;
    pub use {cache::*, monitor::*, poll::*, server::*};
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::SliceRandom;
use redis::Commands;
use stampede_guard::{Backoff, Cache, CallOptions, Error, OnBackendError};
use support::cache;
use support::{eventually, RedisServer};

const TTL: Duration = Duration::from_secs(300);

/// Eight `Cache` instances on one server, each with its own connections, as eight processes
/// would have.
async fn eight_caches(server: &RedisServer) -> Vec<Cache> {
    let mut caches = Vec::new();
    for _ in 0..8 {
        caches.push(cache(server, "reports", CallOptions::default()).await);
    }
    caches
}

fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// Counts computations per key and the most that ever ran at once per key, through the server
/// (INCR at start, DECR at end), so that overlap across `Cache` instances is seen.
#[derive(Clone, Default)]
struct Probe {
    computes: Arc<Mutex<HashMap<String, usize>>>,
    max_overlap: Arc<AtomicUsize>,
}

impl Probe {
    async fn compute(
        &self,
        server_url: &str,
        key: &str,
        work: Duration,
    ) -> Result<String, std::io::Error> {
        let client = redis::Client::open(server_url).map_err(std::io::Error::other)?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(std::io::Error::other)?;
        let probe = format!("probe:{key}");
        let running: usize = redis::cmd("INCR")
            .arg(&probe)
            .query_async(&mut conn)
            .await
            .map_err(std::io::Error::other)?;
        self.max_overlap.fetch_max(running, Ordering::SeqCst);
        *self
            .computes
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default() += 1;
        tokio::time::sleep(work).await;
        let _: i64 = redis::cmd("DECR")
            .arg(&probe)
            .query_async(&mut conn)
            .await
            .map_err(std::io::Error::other)?;
        Ok(format!("report {key}"))
    }

    fn total(&self) -> usize {
        self.computes.lock().unwrap().values().sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_callers_over_eight_caches_compute_once() {
    let server = RedisServer::start();
    let url = server.url();
    let caches = eight_caches(&server).await;
    let probe = Probe::default();
    let mut callers = Vec::new();
    for i in 0..200 {
        let (cache, probe, url) = (caches[i % 8].clone(), probe.clone(), url.clone());
        callers.push(tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", TTL, move || async move {
                    probe
                        .compute(&url, "2019-05", Duration::from_millis(200))
                        .await
                })
                .await
        }));
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "report 2019-05");
    }
    assert_eq!(probe.total(), 1, "exactly one computation in the fleet");
    assert_eq!(probe.max_overlap.load(Ordering::SeqCst), 1);
    for cache in &caches {
        assert_eq!(cache.in_flight(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_months_by_a_hundred_callers_compute_twelve_times() {
    let server = RedisServer::start();
    let url = server.url();
    let caches = eight_caches(&server).await;
    let probe = Probe::default();
    let mut callers = Vec::new();
    for i in 0..100 {
        let (cache, probe, url) = (caches[i % 8].clone(), probe.clone(), url.clone());
        callers.push(tokio::spawn(async move {
            let mut months: Vec<String> = (0..12).map(month).collect();
            months.shuffle(&mut rand::rng());
            for m in months {
                let value =
                    cache
                        .get_or_compute(&m, TTL, {
                            let (probe, url, m) = (probe.clone(), url.clone(), m.clone());
                            move || async move {
                                probe.compute(&url, &m, Duration::from_millis(50)).await
                            }
                        })
                        .await
                        .unwrap();
                assert_eq!(value, format!("report {m}"));
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    let computes = probe.computes.lock().unwrap().clone();
    assert_eq!(computes.len(), 12);
    assert!(computes.values().all(|&n| n == 1), "{computes:?}");
    assert_eq!(probe.max_overlap.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_is_one_round_trip_and_a_won_miss_three() {
    let server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    // Warm up: connect, and load the scripts (a server's first EVALSHA answers NOSCRIPT).
    let _: u32 = cache
        .get_or_compute("warm-up", TTL, move || async move { Ok::<_, String>(0) })
        .await
        .unwrap();

    // And learn the namespace's epoch, after its first answer, so that hits read one key.
    let held = support::until_a_hit_reads_alone(&server, "reports:{warm-up}", || async {
        let _: u32 = cache
            .get_or_compute("warm-up", TTL, move || async move { Ok::<_, String>(0) })
            .await
            .unwrap();
    })
    .await;

    // A read of one key: `GET` with the epoch held (not on a managed-like server, which
    // refuses tracking), else `MGET` of it and the value.
    let read = if held { "GET" } else { "MGET" };
    let monitor = support::Monitor::start(&server);
    let v: u32 = cache
        .get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(7) })
        .await
        .unwrap();
    assert_eq!(v, 7);
    let won_miss = monitor.commands_until_now(&server);
    assert_eq!(
        won_miss,
        [read, "EVALSHA", "EVALSHA"],
        "won miss: the value (with the namespace's epoch unless held), read-or-lock (with the \
         namespace's clock, the value's birth, when the lock is granted), store-and-unlock"
    );

    let monitor = support::Monitor::start(&server);
    let v: u32 = cache
        .get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(8) })
        .await
        .unwrap();
    assert_eq!(v, 7, "served from the cache");
    assert_eq!(
        monitor.commands_until_now(&server),
        [read],
        "a hit is one read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_computation_frees_the_lock_and_caches_nothing() {
    let server = RedisServer::start();
    let cache = cache(
        &server,
        "reports",
        CallOptions::default().lease(Duration::from_secs(60)),
    )
    .await;
    let failed = cache
        .get_or_compute(
            "2019-05",
            TTL,
            move || async move { Err::<u32, _>("db down") },
        )
        .await;
    assert!(
        matches!(&failed, Err(e) if e.compute_error::<&str>().is_some_and(|e| *e == "db down")),
        "{failed:?}"
    );
    let mut admin = server.conn();
    let lock_exists: bool = admin.exists("reports:{2019-05}_lock").unwrap();
    let value_exists: bool = admin.exists("reports:{2019-05}").unwrap();
    assert!(
        !lock_exists,
        "the lock is freed before the error is returned"
    );
    assert!(!value_exists, "errors are not cached");
    assert_eq!(cache.in_flight(), 0);
    let v = cache
        .get_or_compute("2019-05", TTL, move || async move { Ok::<u32, String>(1) })
        .await
        .unwrap();
    assert_eq!(v, 1, "the next caller computes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reaches_every_waiting_caller_in_the_process() {
    let server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for _ in 0..20 {
        let (cache, computes) = (cache.clone(), computes.clone());
        callers.push(tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", TTL, move || async move {
                    computes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Err::<u32, _>("db down".to_string())
                })
                .await
        }));
    }
    for caller in callers {
        let result = caller.await.unwrap();
        assert!(
            matches!(&result, Err(e) if e.compute_error::<String>().is_some_and(|e| e == "db down")),
            "{result:?}"
        );
    }
    assert_eq!(
        computes.load(Ordering::SeqCst),
        1,
        "one computation, its error shared"
    );
}

/// Starts a holder on `holder` that computes until told to panic or is aborted, and a waiter on
/// another cache instance. Returns the holder's task once the lock is taken.
async fn holder_with_waiter(
    server: &RedisServer,
    panic_after: Option<Duration>,
) -> (
    tokio::task::JoinHandle<Result<String, Error>>,
    tokio::task::JoinHandle<Result<String, Error>>,
    Cache,
) {
    // A lease far longer than the test: only an explicit release lets the waiter in.
    let options = CallOptions::default()
        .lease(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(20));
    let holder = cache(server, "reports", options.clone()).await;
    let other = cache(server, "reports", options).await;
    let holder_task = {
        let holder = holder.clone();
        tokio::spawn(async move {
            holder
                .get_or_compute("2019-05", TTL, move || async move {
                    match panic_after {
                        Some(after) => {
                            tokio::time::sleep(after).await;
                            panic!("the computation panics");
                        }
                        None => std::future::pending::<Result<String, String>>().await,
                    }
                })
                .await
        })
    };
    let mut admin = server.conn();
    assert!(eventually(Duration::from_secs(10), || admin
        .exists::<_, bool>("reports:{2019-05}_lock")
        .unwrap()));
    let waiter = tokio::spawn(async move {
        other
            .get_or_compute("2019-05", TTL, move || async move {
                Ok::<_, String>("from the waiter".to_string())
            })
            .await
    });
    (holder_task, waiter, holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_computation_frees_the_lock_and_the_waiter_takes_over() {
    let server = RedisServer::start();
    let (holder_task, waiter, holder) =
        holder_with_waiter(&server, Some(Duration::from_millis(300))).await;
    let joined = holder_task.await;
    assert!(
        joined.is_err_and(|e| e.is_panic()),
        "the panic reaches the holder's caller"
    );
    assert_eq!(waiter.await.unwrap().unwrap(), "from the waiter");
    assert_eq!(holder.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_computation_frees_the_lock_and_the_waiter_takes_over() {
    let server = RedisServer::start();
    let (holder_task, waiter, holder) = holder_with_waiter(&server, None).await;
    holder_task.abort();
    assert!(holder_task.await.is_err_and(|e| e.is_cancelled()));
    let mut admin = server.conn();
    // The lease is 60 s: only the release from Drop can free it this soon.
    assert!(eventually(Duration::from_secs(5), || !admin
        .exists::<_, bool>("reports:{2019-05}_lock")
        .unwrap()));
    assert_eq!(holder.in_flight(), 0);
    assert_eq!(waiter.await.unwrap().unwrap(), "from the waiter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_followers_take_over_from_an_aborted_leader() {
    let server = RedisServer::start();
    let cache = cache(
        &server,
        "reports",
        CallOptions::default().lease(Duration::from_secs(60)),
    )
    .await;
    let leader = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", TTL, std::future::pending::<Result<u32, String>>)
                .await
        })
    };
    assert!(eventually(Duration::from_secs(10), || cache.in_flight() == 1));
    let follower = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", TTL, move || async move { Ok::<u32, String>(2) })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    leader.abort();
    assert_eq!(follower.await.unwrap().unwrap(), 2);
    assert_eq!(cache.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidation_during_a_computation_refuses_its_write() {
    let server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let computing = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", TTL, move || async move {
                    let _ = started_tx.send(());
                    let _ = go_rx.await;
                    Ok::<_, String>("computed before the invalidation".to_string())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let _ = cache.invalidate("2019-05").await.unwrap();
    go_tx.send(()).unwrap();
    assert_eq!(
        computing.await.unwrap().unwrap(),
        "computed before the invalidation",
        "the caller still gets what it computed"
    );
    assert_eq!(
        cache.get::<String>("2019-05").await.unwrap(),
        None,
        "but it is not cached"
    );
    let mut admin = server.conn();
    assert!(!admin.exists::<_, bool>("reports:{2019-05}_lock").unwrap());
    let fresh = cache
        .get_or_compute("2019-05", TTL, move || async move {
            Ok::<_, String>("fresh".to_string())
        })
        .await
        .unwrap();
    assert_eq!(fresh, "fresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_lost_its_lease_does_not_overwrite_the_new_owner() {
    let server = RedisServer::start();
    let short = CallOptions::default()
        .lease(Duration::from_millis(300))
        .renew(false);
    let slow = cache(&server, "reports", short.clone()).await;
    let fast = cache(&server, "reports", short).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let slow_task = tokio::spawn(async move {
        slow.get_or_compute_with_lease("2019-05", TTL, move |lease| async move {
            let _ = started_tx.send(());
            lease.lost().await;
            let _ = go_rx.await;
            Ok::<_, String>(("slow".to_string(), lease.is_lost()))
        })
        .await
    });
    started_rx.await.unwrap();
    // The slow holder's lease runs out (no renewal); the next caller takes over.
    let fast_value = fast
        .get_or_compute("2019-05", TTL, move || async move {
            Ok::<_, String>(("fast".to_string(), false))
        })
        .await
        .unwrap();
    assert_eq!(fast_value.0, "fast");
    go_tx.send(()).unwrap();
    let (slow_value, slow_saw_loss) = slow_task.await.unwrap().unwrap();
    assert_eq!(slow_value, "slow", "the slow caller gets its own result");
    assert!(slow_saw_loss, "the computation observed the loss");
    let stored = fast.get::<(String, bool)>("2019-05").await.unwrap();
    assert_eq!(
        stored.map(|v| v.0).as_deref(),
        Some("fast"),
        "not overwritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_the_notification_not_the_backoff() {
    let server = RedisServer::start();
    // Backoff and lease so long that only a wake-up can end the wait within the bound.
    let options = CallOptions::default()
        .lease(Duration::from_secs(60))
        .backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
        .wait_timeout(Duration::from_secs(10));
    let holder = cache(&server, "reports", options.clone()).await;
    let waiters: Vec<Cache> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(cache(&server, "reports", options.clone()).await);
        }
        v
    };
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder_task = tokio::spawn(async move {
        holder
            .get_or_compute("2019-05", TTL, move || async move {
                let _ = started_tx.send(());
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, String>(42u32)
            })
            .await
    });
    started_rx.await.unwrap();
    let mut tasks = Vec::new();
    for w in waiters {
        tasks.push(tokio::spawn(async move {
            w.get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(0u32) })
                .await
        }));
    }
    assert_eq!(holder_task.await.unwrap().unwrap(), 42);
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap(),
            42,
            "woken and served the holder's value"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_the_bound_is_a_typed_timeout() {
    let server = RedisServer::start();
    let options = CallOptions::default()
        .lease(Duration::from_secs(60))
        .wait_timeout(Duration::from_millis(300));
    let holder = cache(&server, "reports", options.clone()).await;
    let waiter = cache(&server, "reports", options).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder_task = tokio::spawn(async move {
        holder
            .get_or_compute("2019-05", TTL, move || async move {
                let _ = started_tx.send(());
                std::future::pending::<Result<u32, String>>().await
            })
            .await
    });
    started_rx.await.unwrap();
    let result = waiter
        .get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(0u32) })
        .await;
    assert!(
        matches!(&result, Err(Error::WaitTimeout { key, .. }) if key == "2019-05"),
        "{result:?}"
    );
    holder_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_bytes_and_foreign_types_are_a_miss_and_get_replaced() {
    let server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    let mut admin = server.conn();
    let value_key = "reports:{2019-05}";

    // Bytes written by someone else (redis-cli, another library).
    let _: () = admin.set(value_key, "written with redis-cli").unwrap();
    assert_eq!(cache.get::<String>("2019-05").await.unwrap(), None);
    let v = cache
        .get_or_compute("2019-05", TTL, move || async move {
            Ok::<_, String>("ours".to_string())
        })
        .await
        .unwrap();
    assert_eq!(v, "ours");
    assert_eq!(
        cache.get::<String>("2019-05").await.unwrap().as_deref(),
        Some("ours")
    );

    // A truncated envelope of our own.
    let ours: Vec<u8> = admin.get(value_key).unwrap();
    let _: () = admin.set(value_key, &ours[..ours.len() - 2]).unwrap();
    assert_eq!(cache.get::<String>("2019-05").await.unwrap(), None);
    let v = cache
        .get_or_compute("2019-05", TTL, move || async move {
            Ok::<_, String>("again".to_string())
        })
        .await
        .unwrap();
    assert_eq!(v, "again");

    // A value written by another codec.
    let mut foreign = ours.clone();
    foreign[3] = 99;
    let _: () = admin.set(value_key, foreign).unwrap();
    assert_eq!(cache.get::<String>("2019-05").await.unwrap(), None);

    // Another Redis type under the key.
    let _: () = admin.del(value_key).unwrap();
    let _: () = admin.rpush(value_key, "a list").unwrap();
    assert_eq!(cache.get::<String>("2019-05").await.unwrap(), None);
    let v = cache
        .get_or_compute("2019-05", TTL, move || async move {
            Ok::<_, String>("replaced".to_string())
        })
        .await
        .unwrap();
    assert_eq!(v, "replaced");
    let kind: String = redis::cmd("TYPE").arg(value_key).query(&mut admin).unwrap();
    assert_eq!(kind, "string");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_stay_apart_and_keep_one_hash_tag() {
    let server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    let keys = [
        "a{b}",
        "a%7Bb%7D",
        "line\nbreak",
        "zürich",
        "with space",
        "}{",
        "x_lock",
    ];
    for (i, key) in keys.iter().enumerate() {
        let v = cache
            .get_or_compute(key, TTL, move || async move { Ok::<_, String>(i) })
            .await
            .unwrap();
        assert_eq!(v, i);
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(cache.get::<usize>(key).await.unwrap(), Some(i), "{key:?}");
    }
    let mut admin = server.conn();
    let stored: Vec<String> = admin.keys("*").unwrap();
    for k in &stored {
        assert!(k.starts_with("reports:{"), "{k}");
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
    }
    assert!(matches!(
        cache.get::<u8>("").await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        cache.get::<u8>(&"k".repeat(513)).await,
        Err(Error::InvalidKey { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_mebibyte_value_round_trips() {
    let server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let expected = big.clone();
    let v = cache
        .get_or_compute("big", TTL, move || async move { Ok::<_, String>(big) })
        .await
        .unwrap();
    assert_eq!(v, expected);
    assert_eq!(cache.get::<Vec<u8>>("big").await.unwrap(), Some(expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_serves_the_next_calls_without_a_new_cache() {
    let mut server = RedisServer::start();
    let cache = cache(&server, "reports", CallOptions::default()).await;
    let v = cache
        .get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(1u32) })
        .await
        .unwrap();
    assert_eq!(v, 1);
    server.restart(); // empty: nothing is persisted

    // The first call after the restart may see the dropped connection; a later one reconnects.
    let mut recovered = None;
    for _ in 0..50 {
        match cache
            .get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(2u32) })
            .await
        {
            Ok(v) => {
                recovered = Some(v);
                break;
            }
            Err(e) => {
                assert!(
                    e.is_backend(),
                    "only backend errors while reconnecting: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(
        recovered,
        Some(2),
        "recomputed on the restarted, empty server"
    );

    // Wake-ups work again too (the subscription connection reconnects and resubscribes).
    let options = CallOptions::default()
        .lease(Duration::from_secs(60))
        .backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
        .wait_timeout(Duration::from_secs(10));
    let holder = cache.with_options(options.clone());
    let other = support::cache(&server, "reports", options).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder_task = tokio::spawn(async move {
        holder
            .get_or_compute("2019-06", TTL, move || async move {
                let _ = started_tx.send(());
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, String>(6u32)
            })
            .await
    });
    started_rx.await.unwrap();
    let waited = other
        .get_or_compute("2019-06", TTL, move || async move { Ok::<_, String>(0u32) })
        .await
        .unwrap();
    assert_eq!(waited, 6);
    assert_eq!(holder_task.await.unwrap().unwrap(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_a_typed_error_or_the_configured_fallback() {
    let mut server = RedisServer::start();
    let failing = cache(&server, "reports", CallOptions::default()).await;
    let computing = failing
        .with_options(CallOptions::default().on_backend_error(OnBackendError::ComputeUncached));
    server.kill();

    let result = failing
        .get_or_compute("2019-05", TTL, move || async move { Ok::<_, String>(1u32) })
        .await;
    assert!(
        matches!(&result, Err(Error::Backend { op: "get", .. })),
        "{result:?}"
    );
    assert!(failing
        .get::<u32>("2019-05")
        .await
        .unwrap_err()
        .is_backend());
    assert!(failing
        .invalidate("2019-05")
        .await
        .unwrap_err()
        .is_backend());

    let computes = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for _ in 0..10 {
        let (cache, computes) = (computing.clone(), computes.clone());
        callers.push(tokio::spawn(async move {
            cache
                .get_or_compute("2019-05", TTL, move || async move {
                    computes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, String>(3u32)
                })
                .await
        }));
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), 3);
    }
    assert_eq!(
        computes.load(Ordering::SeqCst),
        1,
        "still one computation per process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_with_other_namespaces_do_not_share() {
    let server = RedisServer::start();
    let a = cache(&server, "reports", CallOptions::default()).await;
    let b = cache(&server, "other", CallOptions::default()).await;
    let _ = a.set("k", &1u8, TTL).await.unwrap();
    assert_eq!(b.get::<u8>("k").await.unwrap(), None);
}
