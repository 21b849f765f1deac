//! The cache and the lock on a real Redis Cluster (3 masters, 3 replicas) started by the test.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cluster;
    pub mod cluster_cache;
    pub mod poll;
    pub mod server;
    pub mod signal;
    pub use {cluster::*, cluster_cache::*, poll::*, signal::*};
}

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::SliceRandom;
use stampede_guard::{Backoff, Cache, CallOptions, ConnectionOptions, Error, NearCacheOptions};
use support::cluster_cache;
use support::{eventually, signal, RedisCluster};

const TTL: Duration = Duration::from_secs(300);

fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// One cluster for the whole binary's tests would couple them; each test starts its own, in
/// parallel threads, which takes a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_months_on_a_cluster_compute_once_each_on_their_own_slots() {
    let cluster = RedisCluster::start();
    let mut caches = Vec::new();
    for _ in 0..4 {
        caches.push(cluster_cache(&cluster, "reports", CallOptions::default()).await);
    }
    let computes: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut callers = Vec::new();
    for i in 0..100 {
        let (cache, computes) = (caches[i % 4].clone(), computes.clone());
        callers.push(tokio::spawn(async move {
            let mut months: Vec<String> = (0..12).map(month).collect();
            months.shuffle(&mut rand::rng());
            for m in months {
                let (computes, key) = (computes.clone(), m.clone());
                let value = cache
                    .get_or_compute(&m, TTL, move || async move {
                        *computes.lock().unwrap().entry(key.clone()).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, String>(format!("report {key}"))
                    })
                    .await
                    .unwrap();
                assert_eq!(value, format!("report {m}"), "keys never collide");
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    let computes = computes.lock().unwrap().clone();
    assert_eq!(computes.len(), 12);
    assert!(computes.values().all(|&n| n == 1), "{computes:?}");
    let masters: HashSet<usize> = (0..12)
        .map(|i| cluster.master_of(&format!("reports:{{{}}}", month(i))))
        .collect();
    assert!(
        masters.len() > 1,
        "the months are spread over several masters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_cluster_are_woken_by_sharded_pubsub() {
    let cluster = RedisCluster::start();
    // Backoff and lease so long that only a wake-up can end the wait within the bound.
    let options = CallOptions::default()
        .lease(Duration::from_secs(60))
        .backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
        .wait_timeout(Duration::from_secs(10));
    let holder = cluster_cache(&cluster, "reports", options.clone()).await;
    let waiter = cluster_cache(&cluster, "reports", options).await;
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
    let waited = waiter
        .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(0u32) })
        .await
        .unwrap();
    assert_eq!(waited, 42);
    assert_eq!(holder_task.await.unwrap().unwrap(), 42);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_and_calls_recover_without_wrong_values() {
    let mut cluster = RedisCluster::failing_over();
    let options = CallOptions::default()
        .lease(Duration::from_secs(2))
        .wait_timeout(Duration::from_secs(5));
    let cache = cluster_cache(&cluster, "reports", options).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let call = |cache: Cache, computes: Arc<AtomicUsize>, m: String| async move {
        let key = m.clone();
        cache
            .get_or_compute(&m, TTL, move || async move {
                computes.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(format!("report {key}"))
            })
            .await
    };
    for i in 0..12 {
        assert_eq!(
            call(cache.clone(), computes.clone(), month(i))
                .await
                .unwrap(),
            format!("report {}", month(i))
        );
    }
    let victim = cluster.master_of("reports:{2019-05}");
    cluster.nodes[victim].kill();

    // Keep calling through the failover: every outcome is the right value or a typed error.
    let mut recovered = false;
    let mut errors = 0;
    for _ in 0..200 {
        for i in 0..12 {
            match call(cache.clone(), computes.clone(), month(i)).await {
                Ok(v) => assert_eq!(v, format!("report {}", month(i)), "never a wrong value"),
                Err(e) => {
                    assert!(
                        matches!(e, Error::Backend { .. } | Error::WaitTimeout { .. }),
                        "a typed error: {e:?}"
                    );
                    errors += 1;
                }
            }
        }
        if cluster.is_healthy()
            && call(cache.clone(), computes.clone(), "2019-05".into())
                .await
                .is_ok()
        {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "calls did not recover after the failover ({errors} errors seen)"
    );
    assert!(eventually(Duration::from_secs(10), || cluster.is_healthy()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_works_on_a_cluster() {
    let cluster = RedisCluster::start();
    let lock = stampede_guard::Lock::builder("copy-counters")
        .redis_cluster(cluster.urls())
        .namespace("jobs")
        .build()
        .await
        .unwrap();
    let first = lock.acquire().await.unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none());
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = lock.acquire().await.unwrap();
    assert!(second.fencing_token() > token);
}

/// Like a single server, a cluster is connected on first use: a cache and a lock built while
/// every node is down build fine, fail with a backend error while it stays down, and work once
/// it is back (the nodes keep their cluster configuration across the restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_and_a_lock_built_while_the_cluster_is_down_work_once_it_is_up() {
    let mut cluster = RedisCluster::failing_over();
    for node in &mut cluster.nodes {
        node.kill();
    }
    let connection = ConnectionOptions::default().connect_timeout(Duration::from_millis(300));
    let cache = Cache::builder()
        .redis_cluster(cluster.urls())
        .namespace("reports")
        .connection(connection.clone())
        .build()
        .await
        .expect("building does not wait for the cluster");
    let lock = stampede_guard::Lock::builder("copy-counters")
        .redis_cluster(cluster.urls())
        .connection(connection)
        .build()
        .await
        .expect("building does not wait for the cluster");
    let down = cache
        .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(1u8) })
        .await;
    assert!(matches!(down, Err(Error::Backend { .. })), "{down:?}");
    assert!(matches!(
        lock.try_acquire().await,
        Err(Error::Backend { .. })
    ));

    std::thread::scope(|s| {
        for node in &mut cluster.nodes {
            s.spawn(move || node.restart());
        }
    });
    assert!(
        eventually(Duration::from_secs(30), || cluster.is_healthy()),
        "the cluster came back"
    );
    let mut value = None;
    for _ in 0..100 {
        if let Ok(v) = cache
            .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(7u8) })
            .await
        {
            value = Some(v);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(value, Some(7), "calls succeed once the cluster answers");
    let guard = lock.acquire().await.expect("the lock works too");
    assert!(guard.fencing_token() > 0);
}

const MAX_STALENESS: Duration = Duration::from_millis(300);

/// Reads `key` through `cache` until the near tier answers (its feed is up on every master and
/// proven current), and returns that value.
async fn until_near_hit(cache: &Cache, key: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let before = cache.stats().near_hits;
        let value = cache
            .get_or_compute(key, TTL, || async {
                Ok::<_, String>("computed".to_owned())
            })
            .await;
        if cache.stats().near_hits > before {
            return value.expect("a near hit is a value");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no near hit for {key}: {:?}",
            cache.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn near_reader(cluster: &RedisCluster) -> Cache {
    Cache::builder()
        .redis_cluster(cluster.urls())
        .namespace("reports")
        .near_cache(NearCacheOptions::new(1_000).max_staleness(MAX_STALENESS))
        .connection(ConnectionOptions::default().response_timeout(Duration::from_secs(1)))
        .build()
        .await
        .expect("a near tier on the cluster")
}

/// The months, checked to sit on every master.
fn months_on_every_master(cluster: &RedisCluster) -> Vec<String> {
    let months: Vec<String> = (0..12).map(month).collect();
    let masters: HashSet<usize> = months
        .iter()
        .map(|m| cluster.master_of(&format!("reports:{{{m}}}")))
        .collect();
    assert_eq!(masters.len(), 3, "the months sit on every master");
    months
}

/// The near tier on a cluster listens to every master: a change of a key on any slot reaches
/// it, and a master's death switches it off until the failover is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_tier_on_a_cluster_hears_every_master_and_stops_when_one_dies() {
    let mut cluster = RedisCluster::failing_over();
    // The writer has no near tier: it announces its changes all the same.
    let writer = cluster_cache(&cluster, "reports", CallOptions::default()).await;
    let reader = near_reader(&cluster).await;
    let months = months_on_every_master(&cluster);

    for m in &months {
        let _ = writer.set(m, &format!("{m} v1"), TTL).await.unwrap();
        assert_eq!(until_near_hit(&reader, m).await, format!("{m} v1"));
    }
    for m in &months {
        let _ = writer.set(m, &format!("{m} v2"), TTL).await.unwrap();
    }
    // Once the changes are max_staleness old, no read returns what they replaced.
    tokio::time::sleep(MAX_STALENESS).await;
    for m in &months {
        assert_eq!(read_or_compute(&reader, m).await, format!("{m} v2"));
    }
    assert_eq!(reader.stats().near_switched_off, 0, "{:?}", reader.stats());

    // A master dies: the feed's connection to it drops, and the tier stops serving at once.
    let victim = cluster.master_of("reports:{2019-05}");
    cluster.nodes[victim].kill();
    assert!(
        eventually(Duration::from_secs(10), || reader.stats().near_switched_off
            > 0),
        "the near tier kept serving: {:?}",
        reader.stats()
    );
    // After the failover, the feed listens to the promoted replica: changes reach the tier
    // again, and it serves them.
    assert!(eventually(Duration::from_secs(30), || cluster.is_healthy()));
    for m in &months {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while let Err(e) = writer.set(m, &format!("{m} v3"), TTL).await {
            assert!(tokio::time::Instant::now() < deadline, "{e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for m in &months {
        assert_eq!(until_near_hit(&reader, m).await, format!("{m} v3"));
    }
}

/// Every master reports the outside changes of its own keys to the near tier (tracking per
/// master): a `DEL` sent straight to the node, or a `FLUSHALL` of one master, stops the copies
/// within `max_staleness`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_tier_on_a_cluster_sees_outside_deletes_and_flushes_on_every_master() {
    let cluster = RedisCluster::start();
    let writer = cluster_cache(&cluster, "reports", CallOptions::default()).await;
    let reader = near_reader(&cluster).await;
    let months = months_on_every_master(&cluster);

    for m in &months {
        let _ = writer.set(m, &format!("{m} v1"), TTL).await.unwrap();
        assert_eq!(until_near_hit(&reader, m).await, format!("{m} v1"));
        let value_key = format!("reports:{{{m}}}");
        let deleted: i64 = redis::cmd("DEL")
            .arg(&value_key)
            .query(&mut cluster.nodes[cluster.master_of(&value_key)].conn())
            .unwrap();
        assert_eq!(deleted, 1);
    }
    tokio::time::sleep(MAX_STALENESS).await;
    for m in &months {
        assert_eq!(
            read_or_compute(&reader, m).await,
            "computed",
            "{m}: deleted, yet served"
        );
    }

    // One master flushed: the copies of its keys go, the others' stay.
    for m in &months {
        let _ = writer.set(m, &format!("{m} v2"), TTL).await.unwrap();
        assert_eq!(until_near_hit(&reader, m).await, format!("{m} v2"));
    }
    let flushed = cluster.master_of("reports:{2019-05}");
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut cluster.nodes[flushed].conn())
        .unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    for m in &months {
        let expected = if cluster.master_of(&format!("reports:{{{m}}}")) == flushed {
            "computed".to_owned()
        } else {
            format!("{m} v2")
        };
        assert_eq!(read_or_compute(&reader, m).await, expected, "{m}");
    }
    assert_eq!(
        reader.stats().near_tracking,
        stampede_guard::TrackingState::On
    );
}

async fn read_or_compute(cache: &Cache, key: &str) -> String {
    cache
        .get_or_compute(key, TTL, || async {
            Ok::<_, String>("computed".to_owned())
        })
        .await
        .expect("a read")
}

/// Each master's connection is proven on its own: pausing any one master (not long enough for a
/// failover) stops the near tier within its bound, though the other masters answer on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_tier_on_a_cluster_stops_when_any_one_master_stops_answering() {
    let cluster = RedisCluster::start();
    // No failover while a master is paused: the feed alone must notice.
    for node in &cluster.nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-node-timeout")
            .arg(60_000)
            .query(&mut node.conn())
            .unwrap();
    }
    let reader = near_reader(&cluster).await;
    let months = months_on_every_master(&cluster);
    let mut paused: Vec<usize> = months
        .iter()
        .map(|m| cluster.master_of(&format!("reports:{{{m}}}")))
        .collect();
    paused.sort_unstable();
    paused.dedup();
    for victim in paused {
        for m in &months {
            until_near_hit(&reader, m).await;
        }
        // Read only months of the other masters while the victim is paused.
        let others: Vec<&String> = months
            .iter()
            .filter(|m| cluster.master_of(&format!("reports:{{{m}}}")) != victim)
            .collect();
        let off = reader.stats().near_switched_off;
        let pid = cluster.nodes[victim].pid().expect("a running master");
        signal(pid, "STOP");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while reader.stats().near_switched_off == off && tokio::time::Instant::now() < deadline {
            for m in &others {
                let _ = reader
                    .get_or_compute(m, TTL, || async { Ok::<_, String>("computed".to_owned()) })
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        signal(pid, "CONT");
        assert!(
            reader.stats().near_switched_off > off,
            "near copies kept being served while master {victim} was paused: {:?}",
            reader.stats()
        );
    }
}

/// Batches on a cluster: 24 months spread over all three masters, 100 callers on four
/// instances each asking for all of them in one call. Every script is per slot, so each
/// month is computed once and read back whole; `invalidate_many` reaches every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_a_cluster_lock_per_slot_and_compute_each_key_once() {
    let cluster = RedisCluster::start();
    let months: Vec<String> = (0..24).map(month).collect();
    let masters: HashSet<usize> = months
        .iter()
        .map(|m| cluster.master_of(&format!("reports:{{{m}}}")))
        .collect();
    assert_eq!(masters.len(), 3, "the months are spread over every master");
    let mut caches = Vec::new();
    for _ in 0..4 {
        caches.push(cluster_cache(&cluster, "reports", CallOptions::default()).await);
    }
    let computes: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for i in 0..100 {
        let (cache, computes, calls) = (caches[i % 4].clone(), computes.clone(), calls.clone());
        let mut asked = months.clone();
        asked.shuffle(&mut rand::rng());
        callers.push(tokio::spawn(async move {
            let got = cache
                .get_or_compute_many(&asked, TTL, move |keys: Vec<String>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let computes = computes.clone();
                    async move {
                        for key in &keys {
                            *computes.lock().unwrap().entry(key.clone()).or_default() += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, String>(
                            keys.into_iter()
                                .map(|k| (k.clone(), format!("report {k}")))
                                .collect::<Vec<_>>(),
                        )
                    }
                })
                .await;
            for (key, value) in asked.iter().zip(got) {
                assert_eq!(value.unwrap(), format!("report {key}"));
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    let computes = computes.lock().unwrap().clone();
    assert_eq!(computes.len(), 24);
    assert!(computes.values().all(|&n| n == 1), "{computes:?}");
    assert!(
        calls.load(Ordering::SeqCst) <= 4,
        "one call of f per instance at most"
    );

    // Warm: every value read back in one call (one MGET per slot, sent concurrently).
    let got = caches[0]
        .get_or_compute_many(&months, TTL, |_keys| async {
            Err::<Vec<(String, String)>, _>("must not be called".to_string())
        })
        .await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");

    let _ = caches[1].invalidate_many(&months).await.unwrap();
    for m in &months {
        assert_eq!(caches[2].get::<String>(m).await.unwrap(), None, "{m}");
    }
}
