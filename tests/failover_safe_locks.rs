//! Failover-safe locks (`ConnectionOptions::wait_for_replicas`) on real replicas: a master with
//! one replica, and the 3+3 cluster. With the option on, a granted lock is on a replica when
//! the acquisition returns; with the replica stopped (SIGSTOP) the acquisition fails with
//! `BackendErrorKind::TooFewReplicas` within the timeout and leaves no lock behind; with the
//! option off nothing waits.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod cluster;
    pub mod commandstats;
    pub mod poll;
    pub mod replica;
    pub mod replicated;
    pub mod server;
    pub mod signal;
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{
    BackendErrorKind, BreakerOptions, BreakerState, Cache, CallOptions, ConnectionOptions, Error,
    Lock, LockGuard,
};
use support::cluster::RedisCluster;
use support::commandstats::{commands_since_reset, reset_command_stats};
use support::replica::{get_on_replica, replica_of};
use support::replicated::Replicated;
use support::server::RedisServer;
use support::signal::signal;

/// The longest a replica may take to acknowledge, in the tests that stop it. Well above a
/// running replica's answer on a loaded 2-core machine (at 200 ms a test's first acquisition,
/// replica up, once failed with `TooFewReplicas` during the whole suite), below the breaker's
/// stall bound (1 s).
const WAIT: Duration = Duration::from_millis(800);
/// A bound that only a hang would reach: the failing calls must end well within it.
const NO_HANG: Duration = Duration::from_secs(10);

fn waiting() -> ConnectionOptions {
    ConnectionOptions::default().wait_for_replicas(1, WAIT)
}

/// A replica stopped with SIGSTOP, resumed (SIGCONT) when dropped, so a failed assertion does
/// not leave it stopped until the test's servers are killed.
struct Stopped(u32);

impl Stopped {
    fn stop(server: &RedisServer) -> Self {
        let pid = server.pid().expect("the replica runs");
        signal(pid, "STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

async fn lock_on(urls: Target<'_>, name: &str, connection: ConnectionOptions) -> Lock {
    let builder = Lock::builder(name).namespace("failover");
    let builder = match urls {
        Target::Server(server) => builder.redis_url(server.url()),
        Target::Cluster(cluster) => builder.redis_cluster(cluster.urls()),
    };
    builder
        .connection(connection)
        .build()
        .await
        .expect("a lock")
}

/// A cache on `master` whose lock writes wait for one replica.
async fn waiting_cache(master: &RedisServer) -> Cache {
    Cache::builder()
        .redis_url(master.url())
        .namespace("failover")
        .connection(waiting())
        .build()
        .await
        .expect("a cache")
}

#[derive(Clone, Copy)]
enum Target<'a> {
    Server(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

/// Acquires `lock` while `replica` is stopped, resuming it from another thread a moment later:
/// the acquisition must not return before the resume (it waits for the replica's
/// acknowledgement), and then the lock is on the replica.
async fn acquire_across_a_pause(lock: &Lock, replica: &RedisServer) -> LockGuard {
    let resumed = Arc::new(AtomicBool::new(false));
    let stopped = Stopped::stop(replica);
    let resume = std::thread::spawn({
        let resumed = Arc::clone(&resumed);
        move || {
            std::thread::sleep(Duration::from_millis(300));
            resumed.store(true, Ordering::SeqCst);
            drop(stopped);
        }
    });
    let guard = lock.try_acquire().await.expect("acquired").expect("free");
    assert!(
        resumed.load(Ordering::SeqCst),
        "the acquisition returned while the replica was stopped: it did not wait for it"
    );
    resume.join().expect("the resuming thread");
    guard
}

fn expect_too_few_replicas(result: Result<impl std::fmt::Debug, Error>) {
    match result {
        Err(e) => assert_eq!(
            e.backend_kind(),
            Some(BackendErrorKind::TooFewReplicas),
            "{e}"
        ),
        Ok(held) => panic!("acquired without the replica's acknowledgement: {held:?}"),
    }
}

/// Resumes the replica and waits until it has caught up with the master (a write of this
/// connection acknowledged), so the next waiting write is judged on a replica in sync, not on
/// one still replaying its backlog on a loaded machine.
fn resume_and_catch_up(stopped: Stopped, master: &RedisServer) {
    drop(stopped);
    let mut conn = master.conn();
    redis::cmd("SET")
        .arg("failover:caught-up")
        .arg(1)
        .exec(&mut conn)
        .expect("SET");
    for _ in 0..100 {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(100)
            .query(&mut conn)
            .expect("WAIT");
        if acked >= 1 {
            return;
        }
    }
    panic!("the resumed replica did not catch up within 10 s");
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut server.conn())
        .expect("EXISTS")
        == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_replicated_server_a_granted_lock_is_on_the_replica_when_acquire_returns() {
    let servers = Replicated::start();
    let timeout = ConnectionOptions::default().wait_for_replicas(1, Duration::from_secs(5));
    let lock = lock_on(Target::Server(&servers.master), "report", timeout).await;
    let guard = acquire_across_a_pause(&lock, &servers.replica).await;
    let token = get_on_replica(&servers.replica, "failover:{report}_lock");
    assert!(token.is_some(), "the lock key is on the replica");
    let fence = get_on_replica(&servers.replica, "failover:{report}_fence");
    assert_eq!(fence, Some(guard.fencing_token().to_string()));
    guard.release().await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_stopped_an_acquisition_fails_and_leaves_no_lock() {
    let servers = Replicated::start();
    let lock = lock_on(Target::Server(&servers.master), "report", waiting()).await;
    let stopped = Stopped::stop(&servers.replica);
    let attempt = tokio::time::timeout(NO_HANG, lock.try_acquire()).await;
    expect_too_few_replicas(attempt.expect("the acquisition ends within its timeout"));
    assert!(
        !exists(&servers.master, "failover:{report}_lock"),
        "the unacknowledged lock was released"
    );
    resume_and_catch_up(stopped, &servers.master);
    // The replica back, the same lock is granted.
    let guard = lock.try_acquire().await.expect("acquired").expect("free");
    guard.release().await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_stopped_a_renewal_fails_and_the_lock_stays() {
    let servers = Replicated::start();
    let lock = lock_on(Target::Server(&servers.master), "report", waiting()).await;
    let guard = lock.try_acquire().await.expect("acquired").expect("free");
    let stopped = Stopped::stop(&servers.replica);
    let renewal = tokio::time::timeout(NO_HANG, guard.extend()).await;
    expect_too_few_replicas(renewal.expect("the renewal ends within its timeout"));
    // Not given up: the lock is still ours, with the lease it had.
    assert!(exists(&servers.master, "failover:{report}_lock"));
    resume_and_catch_up(stopped, &servers.master);
    assert!(guard
        .extend()
        .await
        .expect("renewed once the replica is back"));
    guard.release().await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_whose_replica_is_stopped_fails_a_miss_by_its_backend_policy() {
    let servers = Replicated::start();
    let cache = waiting_cache(&servers.master).await;
    let computed = Arc::new(AtomicBool::new(false));
    let stopped = Stopped::stop(&servers.replica);
    let call = cache.get_or_compute("2019-05", Duration::from_secs(60), {
        let computed = Arc::clone(&computed);
        move || async move {
            computed.store(true, Ordering::SeqCst);
            Ok::<_, String>(1u64)
        }
    });
    expect_too_few_replicas(tokio::time::timeout(NO_HANG, call).await.expect("ends"));
    assert!(
        !computed.load(Ordering::SeqCst),
        "computed without the lock"
    );
    assert!(!exists(&servers.master, "failover:{2019-05}_lock"));
    resume_and_catch_up(stopped, &servers.master);
    let value: u64 = cache
        .get_or_compute("2019-05", Duration::from_secs(60), || async {
            Ok::<_, String>(2)
        })
        .await
        .expect("computed under the lock once the replica is back");
    assert_eq!(value, 2);
}

/// Misses that wait for the replica meet a fresh server's `NOSCRIPT` together, as any script
/// call does: each script is loaded once for all of them, not once per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_that_wait_for_the_replica_load_each_script_once() {
    let servers = Replicated::start();
    let cache = waiting_cache(&servers.master).await;
    reset_command_stats(&servers.master);
    let misses = (0..20).map(|i| {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute(
                    &format!("k{i}"),
                    Duration::from_secs(60),
                    move || async move { Ok::<_, String>(i) },
                )
                .await
        })
    });
    for miss in misses.collect::<Vec<_>>() {
        miss.await.expect("a miss").expect("computed");
    }
    let calls = commands_since_reset(&servers.master);
    let loads = calls.get("script|load").copied().unwrap_or(0);
    assert!(loads <= 3, "20 misses on a fresh server: {calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_option_off_nothing_waits() {
    let servers = Replicated::start();
    let lock = lock_on(
        Target::Server(&servers.master),
        "report",
        ConnectionOptions::default(),
    )
    .await;
    let _stopped = Stopped::stop(&servers.replica);
    reset_command_stats(&servers.master);
    let guard = lock.try_acquire().await.expect("acquired").expect("free");
    assert!(guard.extend().await.expect("renewed"));
    guard.release().await.expect("released");
    let commands = commands_since_reset(&servers.master);
    assert!(commands.contains_key("evalsha"), "{commands:?}");
    assert!(!commands.contains_key("wait"), "{commands:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_wait_goes_to_the_slot_master_and_its_replica_has_the_lock() {
    let cluster = RedisCluster::start();
    let master = cluster.master_of("failover:{report}");
    let replica = replica_of(&cluster.nodes, master);
    let timeout = ConnectionOptions::default().wait_for_replicas(1, Duration::from_secs(5));
    let lock = lock_on(Target::Cluster(&cluster), "report", timeout).await;
    let guard = acquire_across_a_pause(&lock, &cluster.nodes[replica]).await;
    let token = get_on_replica(&cluster.nodes[replica], "failover:{report}_lock");
    assert!(
        token.is_some(),
        "the lock key is on the slot master's replica"
    );
    guard.release().await.expect("released");

    // The replica stopped: the acquisition fails and leaves no lock on the master.
    let waiting = lock_on(Target::Cluster(&cluster), "report", waiting()).await;
    let stopped = Stopped::stop(&cluster.nodes[replica]);
    let attempt = tokio::time::timeout(NO_HANG, waiting.try_acquire()).await;
    expect_too_few_replicas(attempt.expect("the acquisition ends within its timeout"));
    assert!(!exists(&cluster.nodes[master], "failover:{report}_lock"));
    drop(stopped);
}

/// Bug A: a release must not overtake the acquisition it undoes. While the first acquisition's
/// `WAIT` blocks (replica stopped), the second's script sits unread behind it; both callers
/// give up. Their releases queue behind the scripts (same connection), so when the replica
/// comes back the second's script and then both releases run, in that order, and no lock is
/// left to a token nobody holds. Sent on another connection, the releases ran at once, the
/// second found nothing to free, and its script then took the lock for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_an_abandoned_acquisition_does_not_overtake_it() {
    let servers = Replicated::start();
    // A lease far above the poll's bound: a lock left behind is seen, not expired.
    let lock = Lock::builder("report")
        .namespace("failover")
        .redis_url(servers.master.url())
        .options(CallOptions::default().lease(Duration::from_secs(60)))
        .connection(ConnectionOptions::default().wait_for_replicas(1, Duration::from_secs(5)))
        .build()
        .await
        .expect("a lock");
    let stopped = Stopped::stop(&servers.replica);
    let give_up = Duration::from_millis(300);
    let (first, second) = tokio::join!(
        tokio::time::timeout(give_up, lock.try_acquire()),
        tokio::time::timeout(give_up, lock.try_acquire()),
    );
    assert!(
        first.is_err() && second.is_err(),
        "both acquisitions still waited for the stopped replica when given up"
    );
    // Time for the abandoned acquisitions' releases to be sent (from background tasks) before
    // the replica comes back; not an assertion.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stopped);
    let key = "failover:{report}_lock";
    assert!(
        support::poll::eventually(Duration::from_secs(10), || !exists(&servers.master, key)),
        "a lock is left behind: {:?}",
        get_on_replica(&servers.master, key)
    );
    // And the lock is free for the next caller.
    let guard = lock.try_acquire().await.expect("acquired").expect("free");
    guard.release().await.expect("released");
}

/// Bug B: a `WAIT` that runs its course is answered slowly by design, not a dead server. With
/// the `WAIT` timeout above the breaker's stall bound and the replica down, a miss fails with
/// `TooFewReplicas` (not as unreachable), and the breaker stays closed: a hit right after it
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_stall_bound_does_not_open_the_breaker() {
    let servers = Replicated::start();
    let cache = Cache::builder()
        .redis_url(servers.master.url())
        .namespace("failover")
        .connection(ConnectionOptions::default().wait_for_replicas(1, Duration::from_millis(1500)))
        .breaker(BreakerOptions::default().stall(Duration::from_secs(1)))
        .build()
        .await
        .expect("a cache");
    let ttl = Duration::from_secs(60);
    let warm: u64 = cache
        .get_or_compute("warm", ttl, || async { Ok::<_, String>(7) })
        .await
        .expect("computed with the replica up");
    assert_eq!(warm, 7);
    let stopped = Stopped::stop(&servers.replica);
    let miss = cache.get_or_compute("cold", ttl, || async { Ok::<_, String>(1u64) });
    expect_too_few_replicas(tokio::time::timeout(NO_HANG, miss).await.expect("ends"));
    let hit: u64 = cache
        .get_or_compute("warm", ttl, || async { Ok::<_, String>(8) })
        .await
        .expect("a hit, the breaker closed");
    assert_eq!(hit, 7, "served from the cache");
    assert_eq!(cache.health().await.breaker, BreakerState::Closed);
    drop(stopped);
}
