//! What one write costs Redis when a fleet of near tiers listens: 1, 10 and 100 instances (each
//! a `Cache` of its own, with its own connections and feed, as separate processes would have),
//! with tracking (the default: Redis reports every change of the namespace's keys) and without
//! it (the crate's own announcements only). Per write, from the server's own `INFO`: commands
//! processed, bytes sent to clients, and server CPU. The writes:
//! - `replace`: `set` of a key that holds a value (announced either way);
//! - `fill`: `get_or_compute` of a cold key (a lock, a computation, a write; never announced,
//!   but tracking reports the lock, the fencing counter and the value);
//! - `outside DEL`: another program deletes a value (seen with tracking only).
//!
//! Heartbeats run every 15 s here (`max_staleness` 60 s) so that they do not blur the counts.
//! A custom harness: `cargo bench --bench near_fanout`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod bench;
    pub mod near_ready;
    pub mod server;
    pub mod server_info;
    pub use {bench::*, near_ready::*, server::*, server_info::*};
}

use std::time::Duration;

use stampede_guard::{Cache, NearCacheOptions};
use support::{server_counters as counters, RedisServer};

const WRITES: usize = 2_000;
const TTL: Duration = Duration::from_secs(600);

async fn instance(url: &str, tracking: bool) -> Cache {
    Cache::builder()
        .redis_url(url)
        .namespace("fanout")
        .near_cache(
            NearCacheOptions::new(10_000)
                .max_staleness(Duration::from_secs(60))
                .track_outside_writes(tracking),
        )
        .build()
        .await
        .expect("a cache")
}

/// Runs `writes` and prints what they cost the server, per write.
async fn measure<F: std::future::Future<Output = ()>>(
    label: &str,
    conn: &mut redis::Connection,
    mut write: impl FnMut(usize) -> F,
) {
    // Let earlier messages drain, so that they are not counted here.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = counters(conn);
    for i in 0..WRITES {
        write(i).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = counters(conn);
    // The two INFO calls themselves count too: at most a few bytes per write over 2,000.
    let per = |a: f64, b: f64| (a - b) / WRITES as f64;
    println!(
        "{label}: {:.2} commands, {:.0} bytes sent, {:.1} µs server CPU per write",
        per(after.commands, before.commands),
        per(after.bytes_out, before.bytes_out),
        per(after.cpu_seconds, before.cpu_seconds) * 1e6,
    );
}

async fn fleet_of(server: &RedisServer, instances: usize, tracking: bool) {
    let url = server.url();
    let mut fleet = Vec::with_capacity(instances);
    for _ in 0..instances {
        fleet.push(instance(&url, tracking).await);
    }
    support::wait_for_near_feeds(&fleet, tracking).await;
    let writer = &fleet[0];
    let mut conn = server.conn();
    let mode = if tracking {
        "tracking"
    } else {
        "announcements only"
    };
    let run = format!("near_fanout ({instances} instances, {mode})");

    for i in 0..WRITES {
        let _ = writer
            .set(&format!("r{i}"), &"first".to_owned(), TTL)
            .await
            .expect("set");
    }
    measure(&format!("{run}, replace"), &mut conn, |i| async move {
        let _ = writer
            .set(&format!("r{i}"), &"second".to_owned(), TTL)
            .await
            .expect("set");
    })
    .await;
    measure(&format!("{run}, fill"), &mut conn, |i| async move {
        let _ = writer
            .get_or_compute(&format!("f{i}"), TTL, || async {
                Ok::<_, std::io::Error>("computed".to_owned())
            })
            .await
            .expect("a fill");
    })
    .await;
    let mut outside = server.conn();
    let outside = &mut outside;
    measure(&format!("{run}, outside DEL"), &mut conn, |i| {
        let _: i64 = redis::cmd("DEL")
            .arg(format!("fanout:{{r{i}}}"))
            .query(outside)
            .expect("DEL");
        async {}
    })
    .await;
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    if support::bench_filtered_out("near_fanout") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    for instances in [1, 10, 100] {
        for tracking in [false, true] {
            // A server per run: nothing left over from the run before.
            let server = RedisServer::start();
            rt.block_on(fleet_of(&server, instances, tracking));
        }
    }
}
