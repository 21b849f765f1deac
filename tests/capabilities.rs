//! The capability probe (issue 36): a real server reports what it allows, the lock's renewal
//! takes the path the probe chose (`SET ... IFEQ` on Valkey 8.1, the script on Redis 7) and
//! keeps its guarantees, and a URL that answers but is not Redis (an echo, an HTTP server) is
//! refused at `build()` within the connect time-out, never a hang or a panic. Runs on the
//! server `STAMPEDE_REDIS_SERVER` names (`bash .ci/valkey --test capabilities` for Valkey).
//! The decision for servers not at hand (Redis 8.4's `DELEX`, Valkey 9's `DELIFEQ`) is
//! unit-tested in `src/store/redis/capabilities_tests.rs`.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod commandstats;
    pub mod server;
    pub use {commandstats::*, server::*};
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, ConnectionOptions, Error, LockWrite, ServerKind};
use support::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Whether the tests run on Valkey (`STAMPEDE_REDIS_SERVER` names a `valkey-server`).
fn on_valkey() -> bool {
    support::programs()
        .server
        .file_name()
        .is_some_and(|name| name.to_string_lossy().contains("valkey"))
}

async fn cache_on(server: &RedisServer, options: CallOptions) -> Cache {
    Cache::builder()
        .redis_url(server.url())
        .namespace("caps")
        .options(options)
        .build()
        .await
        .expect("a cache on the test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_says_what_it_allows_and_health_reports_it() {
    let server = RedisServer::start();
    let cache = cache_on(&server, CallOptions::default()).await;
    let caps = cache.capabilities().expect("probed at build()");
    assert!(
        caps.lua && caps.resp3 && caps.wait && caps.config_get,
        "{caps}"
    );
    assert!(caps.tracking_bcast && caps.sharded_pubsub, "{caps}");
    if on_valkey() {
        assert_eq!(caps.server, ServerKind::Valkey, "{caps}");
        assert_eq!(caps.renewal(), LockWrite::SetIfEq, "{caps}");
    } else {
        assert_eq!(caps.server, ServerKind::Redis, "{caps}");
        assert_eq!(caps.renewal(), LockWrite::Script, "{caps}");
    }
    // Neither Redis 7 nor Valkey 8.1 has DELEX or DELIFEQ: releases stay scripts.
    assert_eq!(caps.release(), LockWrite::Script, "{caps}");
    assert_eq!(cache.health().await.capabilities, Some(caps));
    assert!(Cache::in_memory().capabilities().is_none());
}

/// A computation that outlives its lease many times over is renewed on the probe's path, and
/// single flight holds across two caches meanwhile; the path shows in the server's counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lock_keeps_single_flight_on_the_chosen_path() {
    let server = RedisServer::start();
    let options = CallOptions::default()
        .lease(Duration::from_millis(300))
        .wait_timeout(Duration::from_secs(10));
    let (a, b) = (
        cache_on(&server, options.clone()).await,
        cache_on(&server, options).await,
    );
    support::reset_command_stats(&server);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |cache: Cache| {
        let runs = Arc::clone(&runs);
        async move {
            cache
                .get_or_compute("slow", Duration::from_secs(60), || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Ok::<_, std::io::Error>(7u32)
                })
                .await
        }
    };
    let (x, y) = tokio::join!(call(a.clone()), call(b));
    assert_eq!((x.unwrap(), y.unwrap()), (7, 7));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one computation across both caches"
    );
    let ran = support::commands_since_reset(&server);
    // The Lua-free renewal is one MULTI of SET IFEQ and PEXPIRE GT; the crate sends no other.
    let multi = ran.get("exec").copied().unwrap_or(0);
    match a.capabilities().map(|c| c.renewal()) {
        Some(LockWrite::SetIfEq) => assert!(multi > 0, "renewed by SET IFEQ: {ran:?}"),
        _ => assert_eq!(multi, 0, "renewed by script: {ran:?}"),
    }
}

/// A listener that answers every connection with `answer(bytes read)` until it closes.
async fn fake_server(answer: fn(&[u8]) -> Vec<u8>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&answer(&buf[..n])).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, task)
}

fn echo(bytes: &[u8]) -> Vec<u8> {
    bytes.to_vec()
}

fn http(_: &[u8]) -> Vec<u8> {
    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\nconnection: close\r\n\r\nBad Request"
        .to_vec()
}

fn silent(_: &[u8]) -> Vec<u8> {
    Vec::new()
}

async fn build_against(port: u16) -> Result<Cache, Error> {
    let connection = ConnectionOptions::default()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .reconnect_retries(0);
    let build = Cache::builder()
        .redis_url(format!("redis://127.0.0.1:{port}/0"))
        .connection(connection)
        .build();
    // Generous: the bound checked is "no hang", not a speed.
    tokio::time::timeout(Duration::from_secs(10), build)
        .await
        .expect("build() must not hang on a server that is not Redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_answers_but_is_not_redis_is_refused_at_build() {
    for (what, answer) in [("echo", echo as fn(&[u8]) -> Vec<u8>), ("http", http)] {
        let (port, task) = fake_server(answer).await;
        match build_against(port).await {
            Err(Error::Config(message)) => {
                assert!(message.contains("not as Redis does"), "{what}: {message}")
            }
            Err(other) => panic!("{what}: not a configuration error: {other:?}"),
            Ok(_) => panic!("{what}: a server that is not Redis was accepted"),
        }
        task.abort();
    }
}

/// A server that accepts and never answers is not known to be anything: building succeeds (as
/// for a server that is down), and calls fail with a backend error, within their time-outs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_builds_and_fails_calls_without_a_hang() {
    let (port, task) = fake_server(silent).await;
    let cache = build_against(port)
        .await
        .expect("a silent server is judged at its answer");
    assert!(cache.capabilities().is_none());
    let call = cache.get::<u32>("k");
    let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
    assert!(
        matches!(answer, Ok(Err(Error::Backend { .. }))),
        "{answer:?}"
    );
    task.abort();
}

/// A lost connection may come back to another server (a failover): the capabilities are
/// probed again at its first answer. Here the "other server" is the same one restarted, with
/// `CONFIG` then taken from the user before the cache's first call to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_probes_the_server_again() {
    let mut server = RedisServer::start();
    let cache = cache_on(&server, CallOptions::default()).await;
    assert!(cache.capabilities().unwrap().config_get);
    cache.get::<u32>("k").await.unwrap();
    server.kill();
    // A call while the server is down fails: the connection is lost.
    assert!(cache.get::<u32>("k").await.is_err());
    server.restart();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-config")
        .query(&mut server.conn())
        .unwrap();
    let mut config_get = true;
    for _ in 0..100 {
        // The first call that reaches the new server's answer starts the probe.
        let _ = cache.get::<u32>("k").await;
        config_get = cache.capabilities().unwrap().config_get;
        if !config_get {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !config_get,
        "the probe after the reconnection saw CONFIG refused"
    );
}
