//! Redis under memory pressure: a real server with `maxmemory 3mb` and an evicting policy, a
//! writer filling it with junk keys the whole time. What eviction may do to the protocol: take a
//! value (a recomputation), a fence key (the running computation's write is refused: safe, the
//! value just is not cached), or a lock key while it is held (a second holder gets in at once).
//! What must hold anyway: every value is right, the cache keeps filling, and two `Lock` holders
//! overlap only where the lock key was evicted (learned from keyspace notifications).
//!
//! `cargo test --test memory_pressure -- --nocapture` prints the figures.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod clock;
    pub mod poll;
    pub mod server;
    pub use {cache::*, clock::*, poll::*, server::*};
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stampede_guard::{CallOptions, Lock};
use support::cache;
use support::{eventually, now_us, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);

fn month(i: usize) -> String {
    format!("2019-{:02}", i + 1)
}

/// A server with `maxmemory 3mb`, `policy`, and eviction events published on
/// `__keyevent@0__:evicted`.
fn pressured(policy: &str) -> RedisServer {
    let args = [
        "--maxmemory",
        "3mb",
        "--maxmemory-policy",
        policy,
        "--notify-keyspace-events",
        "Ee",
    ]
    .map(String::from);
    RedisServer::start_with(&args, "")
}

fn evicted_keys(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A thread writing 1 KiB junk keys (TTL 10 min, so `volatile-*` policies can evict them too)
/// until dropped. Write errors (OOM while eviction catches up) are ignored: pressure is the point.
struct Filler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Filler {
    fn start(server: &RedisServer) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut conn = server.conn();
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let junk = vec![b'j'; 1024];
            let mut n = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                let mut pipe = redis::pipe();
                for _ in 0..50 {
                    pipe.cmd("SET")
                        .arg(format!("junk:{n}"))
                        .arg(&junk)
                        .arg("EX")
                        .arg(600)
                        .ignore();
                    n += 1;
                }
                let _: redis::RedisResult<()> = pipe.query(&mut conn);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Filler {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every key the server evicts, with the moment it was seen (µs), from keyspace notifications.
/// The reads block without a timeout (a timeout in the middle of a message would desynchronise
/// the reply parser and lose notifications); a message published on the channel stops it.
struct Evictions {
    seen: Arc<Mutex<Vec<(u64, String)>>>,
    stop: Arc<AtomicBool>,
    url: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

const EVICTED: &str = "__keyevent@0__:evicted";

impl Evictions {
    fn watch(server: &RedisServer) -> Self {
        let seen: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut conn = server.conn();
        let (sink, stopping) = (Arc::clone(&seen), Arc::clone(&stop));
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut pubsub = conn.as_pubsub();
            pubsub.subscribe(EVICTED).unwrap();
            let _ = ready_tx.send(());
            while let Ok(msg) = pubsub.get_message() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(key) = msg.get_payload::<String>() {
                    sink.lock().unwrap().push((now_us(), key));
                }
            }
        });
        ready.recv_timeout(Duration::from_secs(10)).unwrap();
        Evictions {
            seen,
            stop,
            url: server.url(),
            thread: Some(thread),
        }
    }

    fn of(&self, key: &str) -> Vec<u64> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(_, k)| k == key)
            .map(|(t, _)| *t)
            .collect()
    }
}

impl Drop for Evictions {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Ok(mut conn) =
            redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
        {
            let _: redis::RedisResult<i64> = redis::cmd("PUBLISH")
                .arg(EVICTED)
                .arg("stop")
                .query(&mut conn);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The scenario: 12 hot months (TTL 1 h) read 20 times each while a writer fills the
/// server. On a server without pressure that is 12 computations; 240 would mean nothing is
/// cached. Measured on the old code: 12 under `volatile-ttl`, 41 under `allkeys-lru`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_values_stay_right_and_cached_under_memory_pressure() {
    let mut figures = Vec::new();
    for policy in ["volatile-ttl", "allkeys-lru"] {
        let server = pressured(policy);
        let filler = Filler::start(&server);
        assert!(
            eventually(Duration::from_secs(20), || evicted_keys(&server) > 0),
            "{policy}: the filler drives the server into eviction"
        );
        let evicted_before = evicted_keys(&server);
        let cache = cache(&server, "reports", CallOptions::default()).await;
        let computes = Arc::new(AtomicUsize::new(0));
        for _round in 0..20 {
            for i in 0..12 {
                let (m, computes) = (month(i), Arc::clone(&computes));
                let value = cache
                    .get_or_compute(&month(i), HOUR, move || async move {
                        computes.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(format!("report {m}"))
                    })
                    .await
                    .expect("calls succeed under memory pressure");
                assert_eq!(value, format!("report {}", month(i)), "{policy}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let evicted = evicted_keys(&server) - evicted_before;
        drop(filler);
        let computes = computes.load(Ordering::SeqCst);
        println!(
            "memory pressure (maxmemory 3mb, {policy}): {computes} computations for 12 months \
             x 20 reads; {evicted} keys evicted meanwhile"
        );
        assert!(evicted > 0, "{policy}: evictions happened during the reads");
        figures.push((policy, computes));
    }
    for (policy, computes) in figures {
        assert!(computes >= 12, "{policy}: each month computed");
        // Well below 240 (nothing cached): at most a third of the reads recompute.
        assert!(
            computes <= 80,
            "{policy}: the cache keeps filling ({computes} computations)"
        );
    }
}

/// One section of a `Lock` holder: from the grant to the last check that found the lease valid.
#[derive(Debug, Clone)]
struct Section {
    who: usize,
    token: u64,
    start_us: u64,
    end_us: u64,
}

/// Three contenders on one lock under `volatile-ttl`, where the lock key (the shortest TTL on
/// the server) goes first: every pair of overlapping sections must have an eviction of the lock
/// key between the earlier grant and the later section; sections that do not overlap carry
/// increasing fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holders_overlap_only_where_the_lock_key_was_evicted() {
    let server = pressured("volatile-ttl");
    let evictions = Evictions::watch(&server);
    let filler = Filler::start(&server);
    assert!(eventually(Duration::from_secs(20), || evicted_keys(
        &server
    ) > 0));
    let sections: Arc<Mutex<Vec<Section>>> = Arc::default();
    let mut contenders = Vec::new();
    for who in 0..3 {
        let lock = Lock::builder("sync")
            .redis_url(server.url())
            .namespace("jobs")
            .options(
                CallOptions::default()
                    .lease(Duration::from_millis(300))
                    .wait_timeout(Duration::from_secs(20)),
            )
            .build()
            .await
            .unwrap();
        let sections = Arc::clone(&sections);
        contenders.push(tokio::spawn(async move {
            for _ in 0..25 {
                let guard = lock.acquire().await.expect("acquired under pressure");
                let start_us = now_us();
                let mut end_us = start_us;
                for _ in 0..6 {
                    // Read the clock first: the check that follows holds for that moment too.
                    let t = now_us();
                    if !guard.is_held() {
                        break;
                    }
                    end_us = t;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                sections.lock().unwrap().push(Section {
                    who,
                    token: guard.fencing_token(),
                    start_us,
                    end_us,
                });
                let _ = guard.release().await;
            }
        }));
    }
    for contender in contenders {
        contender.await.unwrap();
    }
    drop(filler);
    // Notifications travel on their own connection: allow them to arrive after the later grant.
    const SLACK_US: u64 = 250_000;
    tokio::time::sleep(Duration::from_micros(SLACK_US)).await;
    let lock_evictions = evictions.of("jobs:{sync}_lock");
    let mut sections = sections.lock().unwrap().clone();
    sections.sort_by_key(|s| s.start_us);
    let (mut excused, mut ordered) = (0, 0);
    let mut by_holder: HashMap<usize, usize> = HashMap::new();
    for (i, b) in sections.iter().enumerate() {
        *by_holder.entry(b.who).or_default() += 1;
        for a in &sections[..i] {
            if a.end_us > b.start_us {
                let evicted = lock_evictions
                    .iter()
                    .any(|t| *t >= a.start_us && *t <= b.end_us.max(b.start_us) + SLACK_US);
                assert!(
                    evicted,
                    "holders overlapped without an eviction of the lock key: {a:?} and {b:?}"
                );
                excused += 1;
            } else {
                assert!(
                    a.token < b.token,
                    "fencing tokens go up from one holder to the next: {a:?} then {b:?}"
                );
                ordered += 1;
            }
        }
    }
    println!(
        "memory pressure (maxmemory 3mb, volatile-ttl), Lock: {} sections by {by_holder:?}, \
         {} evictions of the lock key, {excused} overlapping pairs (each with an eviction), \
         {ordered} ordered pairs",
        sections.len(),
        lock_evictions.len(),
    );
    assert_eq!(sections.len(), 75);
    assert!(
        !lock_evictions.is_empty(),
        "the lock key was evicted at least once, so the rule above was exercised"
    );
}
