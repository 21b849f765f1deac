//! `Compressed` (feature `compression`) on a real redis-server: a large value is stored smaller
//! and read back; a fleet that switches codec (either way) recomputes each value once rather
//! than misread it; compressed bytes damaged under a key are a miss, never an error.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod server;
    pub use server::*;
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Bincode, Cache, Codec, Compressed};
use support::RedisServer;

const TTL: Duration = Duration::from_secs(300);
const NAMESPACE: &str = "reports";

type Report = Vec<(String, String, u64)>;

/// A report of `rows` rows, repetitive as database rows are: about 20 bytes a row in bincode.
fn report(rows: u64) -> Report {
    (0..rows)
        .map(|i| {
            (
                format!("2019-{:02}", 1 + i % 12),
                "north-east".to_owned(),
                i % 97,
            )
        })
        .collect()
}

async fn cache_with<C: Codec>(server: &RedisServer, codec: C) -> Cache<C> {
    Cache::builder()
        .redis_url(server.url())
        .namespace(NAMESPACE)
        .codec(codec)
        .build()
        .await
        .expect("a cache on the test server")
}

/// The stored bytes' length of `key` (the envelope and the payload).
fn strlen(server: &RedisServer, key: &str) -> usize {
    redis::cmd("STRLEN")
        .arg(format!("{NAMESPACE}:{{{key}}}"))
        .query(&mut server.conn())
        .expect("STRLEN")
}

/// `get_or_compute` of `report(rows)` under `key`, counting its computations in `runs`.
async fn get_or_compute<C: Codec>(
    cache: &Cache<C>,
    key: &str,
    rows: u64,
    runs: &Arc<AtomicUsize>,
) -> Report {
    let runs = Arc::clone(runs);
    cache
        .get_or_compute(key, TTL, move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(report(rows))
        })
        .await
        .expect("a value, not an error")
}

#[tokio::test]
async fn a_large_value_is_stored_compressed_and_read_back() {
    let server = RedisServer::start();
    let plain = cache_with(&server, Bincode).await;
    let compressed = cache_with(&server, Compressed::new()).await;
    let value = report(4_000);
    let _ = plain.set("plain", &value, TTL).await.unwrap();
    let _ = compressed.set("compressed", &value, TTL).await.unwrap();
    let (plain_len, compressed_len) = (strlen(&server, "plain"), strlen(&server, "compressed"));
    assert!(plain_len > 70_000, "{plain_len} bytes stored plain");
    assert!(
        compressed_len * 2 < plain_len,
        "{compressed_len} bytes stored compressed, {plain_len} plain"
    );
    assert_eq!(compressed.get("compressed").await.unwrap(), Some(value));
    // A value below the threshold is stored as it is, one byte longer.
    let small = report(10);
    let _ = plain.set("plain-small", &small, TTL).await.unwrap();
    let _ = compressed.set("small", &small, TTL).await.unwrap();
    assert_eq!(strlen(&server, "small"), strlen(&server, "plain-small") + 1);
    assert_eq!(compressed.get("small").await.unwrap(), Some(small));
}

/// Deploying `Compressed` over a namespace written with `Bincode` (and rolling it back):
/// each side reads the other's values as a miss, computes once and overwrites them.
#[tokio::test]
async fn switching_codecs_is_a_miss_once_each_way() {
    let server = RedisServer::start();
    let before = cache_with(&server, Bincode).await;
    let after = cache_with(&server, Compressed::new()).await;
    let _ = before.set("2019-05", &report(2_000), TTL).await.unwrap();
    assert_eq!(after.get::<Report>("2019-05").await.unwrap(), None);
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let value = get_or_compute(&after, "2019-05", 2_000, &runs).await;
        assert_eq!(value, report(2_000));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "computed once by the new codec, then a hit"
    );

    // Rolled back: the plain codec reads the compressed value as a miss, and computes once.
    assert_eq!(before.get::<Report>("2019-05").await.unwrap(), None);
    for _ in 0..2 {
        let value = get_or_compute(&before, "2019-05", 2_000, &runs).await;
        assert_eq!(value, report(2_000));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Damaged compressed bytes under a key (here a length the block cannot hold): the read is a
/// miss, the value is computed again and overwritten, and the next read is a hit.
#[tokio::test]
async fn damaged_compressed_bytes_are_a_miss() {
    let server = RedisServer::start();
    let cache = cache_with(&server, Compressed::new()).await;
    let _ = cache.set("2019-05", &report(2_000), TTL).await.unwrap();
    // The payload ends the stored bytes: its marker, its length, its block.
    let payload = Compressed::new().encode(&report(2_000)).unwrap();
    assert_eq!(payload[0], 1, "compressed");
    let at = strlen(&server, "2019-05") - payload.len();
    let _: usize = redis::cmd("SETRANGE")
        .arg(format!("{NAMESPACE}:{{2019-05}}"))
        .arg(at + 1)
        .arg(&u32::MAX.to_be_bytes()[..])
        .query(&mut server.conn())
        .expect("SETRANGE");

    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let value = get_or_compute(&cache, "2019-05", 2_000, &runs).await;
        assert_eq!(value, report(2_000));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "recomputed once, then a hit"
    );
}
