//! Concurrent single-key reads of one cache go out as one `MGET` while another is out
//! (`ConnectionOptions::coalesce_reads`, on by default), against a real redis-server: fewer
//! commands than reads under concurrency, one command per read when alone, each read its own
//! answer, a sender dropped while its `MGET` is out stalls no one, and reads queued behind one
//! that the server leaves unanswered fail with it.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod commandstats;
    pub mod monitor;
    pub mod server;
    pub mod signal;
    pub use {commandstats::*, monitor::*, server::*, signal::*};
}

use std::collections::BTreeMap;
use std::time::Duration;

use stampede_guard::{Cache, ConnectionOptions, Source};
use support::{commands_since_reset, reads, reset_command_stats, signal, Monitor, RedisServer};

const TTL: Duration = Duration::from_secs(600);

async fn cache(server: &RedisServer, connection: ConnectionOptions) -> Cache {
    Cache::builder()
        .redis_url(server.url())
        .namespace("coalesce")
        .connection(connection)
        .build()
        .await
        .expect("a cache on the test server")
}

/// How many `MGET`s and `GET`s the server ran since the last reset.
fn reads_run(server: &RedisServer) -> BTreeMap<String, u64> {
    let mut calls = commands_since_reset(server);
    calls.retain(|name, _| name == "mget" || name == "get");
    calls
}

/// Waits until the store has read the namespace's epoch under tracking (`CLIENT CACHING yes`
/// and its `GET`, sent together once the first read asked for it): after that its reads carry
/// no epoch and it sends no `GET`.
async fn until_epoch_held(server: &RedisServer) {
    for _ in 0..500 {
        let calls = commands_since_reset(server);
        if calls.contains_key("client|caching") && calls.contains_key("get") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store never read the namespace's epoch under tracking");
}

/// A cache over `server` with `connection`, `n` keys written (`k0`, `k1`, ...), its connection
/// warmed (its first answer starts the eviction-policy check) and the namespace's epoch held
/// (one `GET` in the background): then the command counts are reset.
async fn warm(
    server: &RedisServer,
    connection: ConnectionOptions,
    n: usize,
) -> (Cache, Vec<String>) {
    let cache = cache(server, connection).await;
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    fill(&cache, &keys).await;
    read_all(&cache, &keys[..1]).await;
    until_epoch_held(server).await;
    reset_command_stats(server);
    (cache, keys)
}

/// Writes `keys` values `key -> "v-<key>"`.
async fn fill(cache: &Cache, keys: &[String]) {
    for key in keys {
        let _ = cache.set(key, &format!("v-{key}"), TTL).await.unwrap();
    }
}

/// Reads every key at once, on this task (so the reads are polled together), and checks each
/// got its own value as a hit.
async fn read_all(cache: &Cache, keys: &[String]) {
    let reads = keys.iter().map(|key| async move {
        let fetched = cache
            .fetch(key, TTL, |_lease| async {
                Ok::<_, std::io::Error>(stampede_guard::Computed::new("computed".to_owned()))
            })
            .await
            .unwrap();
        (key, fetched)
    });
    for (key, fetched) in futures_like_join(reads.collect()).await {
        assert_eq!(fetched.value, format!("v-{key}"));
        assert_eq!(fetched.source, Source::Hit);
    }
}

/// Polls every future on the current task until all are done (so reads made together are
/// in flight together), their outputs in order.
async fn futures_like_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(out) => *output = Some(out),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_hits_share_mgets_and_each_gets_its_own_value() {
    let server = RedisServer::start();
    let (cache, keys) = warm(&server, ConnectionOptions::default(), 64).await;
    read_all(&cache, &keys).await;
    let reads = reads_run(&server);
    // The first read goes out alone (a `GET`: the namespace's epoch is held), the 63 that
    // queued behind it in one more `MGET`.
    assert_eq!(reads.get("get"), Some(&1), "{reads:?}");
    let mgets = reads.get("mget").copied().unwrap_or(0);
    assert!((1..=4).contains(&mgets), "64 hits cost {mgets} MGETs");
}

/// Callers that read again as soon as they are answered (a busy service's request loops) go out
/// together round after round: one `MGET` per round, not a read alone (the first caller woken)
/// and a batch of the rest behind it, which is two round trips per round with the client idle
/// during the first.
#[tokio::test(flavor = "current_thread")]
async fn callers_that_read_again_at_once_go_out_together_each_round() {
    const ROUNDS: u64 = 50;
    let server = RedisServer::start();
    let (cache, keys) = warm(&server, ConnectionOptions::default(), 64).await;
    let callers: Vec<_> = keys
        .iter()
        .map(|key| {
            let (cache, key) = (cache.clone(), key.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    read_all(&cache, std::slice::from_ref(&key)).await;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("a caller");
    }
    let reads = reads_run(&server);
    let sent: u64 = reads.values().sum();
    assert!(
        sent <= ROUNDS + ROUNDS / 5,
        "{} hits in {ROUNDS} rounds sent {reads:?}",
        64 * ROUNDS
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_lone_read_goes_out_by_itself_each_time() {
    let server = RedisServer::start();
    let (cache, keys) = warm(&server, ConnectionOptions::default(), 10).await;
    for key in &keys {
        read_all(&cache, std::slice::from_ref(key)).await;
    }
    // Each alone: a `GET` of its value (the namespace's epoch is held).
    let reads = reads_run(&server);
    assert_eq!(reads, BTreeMap::from([("get".to_owned(), 10)]));
}

#[tokio::test(flavor = "current_thread")]
async fn switched_off_every_read_is_its_own_command() {
    let server = RedisServer::start();
    let (cache, keys) = warm(
        &server,
        ConnectionOptions::default().coalesce_reads(false),
        64,
    )
    .await;
    read_all(&cache, &keys).await;
    let reads = reads_run(&server);
    assert_eq!(reads, BTreeMap::from([("get".to_owned(), 64)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_dropped_while_its_mget_is_out_stalls_no_one() {
    let server = RedisServer::start_with(&["--enable-debug-command".into(), "local".into()], "");
    let cache = cache(&server, ConnectionOptions::default()).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    fill(&cache, &keys).await;
    read_all(&cache, &keys[..1]).await;
    // The server sleeps: the next `MGET` stays out.
    let mut sleeper = server.cli();
    let sleeping = std::thread::spawn(move || sleeper.args(["DEBUG", "SLEEP", "0.5"]).output());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sender = tokio::spawn({
        let cache = cache.clone();
        let key = keys[0].clone();
        async move { cache.get::<String>(&key).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // These queue behind the sender's `MGET`; then the sender goes away with it.
    let waiting: Vec<_> = keys[1..]
        .iter()
        .map(|key| {
            let (cache, key) = (cache.clone(), key.clone());
            tokio::spawn(async move { (cache.get::<String>(&key).await, key) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    sender.abort();
    for read in waiting {
        let (value, key) = tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("no read stalls")
            .unwrap();
        assert_eq!(value.unwrap(), Some(format!("v-{key}")));
    }
    let _ = sleeping.join();
}

/// Reads queued while one is out on a server that leaves it unanswered fail with it when it
/// times out, never sent: sent after it, each would wait out a second time-out, and callers out
/// together would fail apart (a fallback's single flight would run once for the first and
/// again for the rest; seen in `outage_processes` with a killed server too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_queued_behind_a_timed_out_read_fail_with_it_unsent() {
    let server = RedisServer::start();
    let connection = ConnectionOptions::default().response_timeout(Duration::from_millis(500));
    let cache = cache(&server, connection).await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    fill(&cache, &keys).await;
    let monitor = Monitor::start(&server);
    // Frozen, the server takes the requests into its socket's buffer and answers none; they run
    // once it goes on, so the monitor sees every read that was sent.
    let pid = server.pid().expect("the test's own server");
    signal(pid, "STOP");
    let answers =
        futures_like_join(keys.iter().map(|key| cache.get::<String>(key)).collect()).await;
    signal(pid, "CONT");
    for (key, answer) in keys.iter().zip(&answers) {
        assert!(
            answer.as_ref().is_err_and(|e| e.is_unreachable()),
            "{key}: a frozen server's read is an error: {answer:?}"
        );
    }
    let sent = reads(&monitor.lines_until_now(&server));
    assert_eq!(
        sent.len(),
        1,
        "the first read went out alone and timed out; the three queued behind it failed with \
         it: {sent:?}"
    );
}
