//! The instructions of one Redis hit (`get_or_compute` on a warm key), for `valgrind
//! --tool=callgrind`: on a machine shared with other builds, wall-clock time is noise, and an
//! instruction count is not. Runs `STAMPEDE_HITS` hits (default 10,000) on a current-thread
//! runtime after a warm-up, `STAMPEDE_IN_FLIGHT` at a time (default 1), with no subscriber, or
//! with a `tracing-opentelemetry` layer over the SDK (a no-op exporter) when a filter is `otel`
//! (feature `opentelemetry`). With the filter `raw`, the hits are `cache_ops`'s baseline instead:
//! a raw redis-rs `GET` + bincode decode of the same value on a `ConnectionManager`, so the two
//! counts compare as `hit_path`'s times do, without the noise of a shared machine.
//!
//! Per hit = (instructions at N2 - instructions at N1) / (N2 - N1): the start, the server's
//! set-up and the warm-up cancel out. The commands and figures: `docs/observability.md` (What
//! the spans cost).

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/); it uses one function
/// of `bench` and `load` each.
#[allow(dead_code)]
mod support {
    pub mod bench;
    pub mod cache;
    pub mod load;
    pub mod raw;
    pub mod server;
    pub use {bench::*, cache::*, load::*, raw::*, server::*};
}

use std::time::Duration;

use redis::aio::ConnectionManager;
use stampede_guard::{Cache, CallOptions};
use support::{value, RedisServer};

const KEY: &str = "2019-05";
const TTL: Duration = Duration::from_secs(3600);
/// What one hit is: the library's, or the raw baseline's.
#[derive(Clone)]
enum Side {
    Cache(Box<Cache>),
    Raw(ConnectionManager),
}

fn main() {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default)
    };
    let hits = number("STAMPEDE_HITS", 10_000);
    let in_flight = number("STAMPEDE_IN_FLIGHT", 1).max(1);
    let filters = support::bench_filters();
    let traced = filters.iter().any(|f| f == "otel");
    let raw = filters.iter().any(|f| f == "raw");
    let _tracing = traced.then(install_layer);
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let side = if raw {
            Side::Raw(support::raw_connection(&server, KEY).await)
        } else {
            let cache = support::cache(&server, "bench", CallOptions::default()).await;
            let _ = cache.set(KEY, &value(), TTL).await.expect("warm the key");
            Side::Cache(Box::new(cache))
        };
        run(&side, in_flight, 100).await;
        run(&side, in_flight, hits).await;
    });
    println!(
        "{hits} hits, {in_flight} in flight ({}, {})",
        if raw {
            "raw GET + decode"
        } else {
            "get_or_compute"
        },
        if traced {
            "otel layer"
        } else {
            "no subscriber"
        }
    );
}

/// `hits` hits as `in_flight` tasks, each hitting in a loop.
async fn run(side: &Side, in_flight: u64, hits: u64) {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..in_flight {
        // The first tasks take one more when `hits` does not divide: exactly `hits` in all.
        let own = hits / in_flight + u64::from(task < hits % in_flight);
        let side = side.clone();
        tasks.spawn(async move {
            for _ in 0..own {
                hit(&side).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a hitting task");
    }
}

async fn hit(side: &Side) {
    let v: String = match side {
        Side::Cache(cache) => cache
            .get_or_compute(KEY, TTL, || async { Ok::<_, String>(String::new()) })
            .await
            .expect("a hit"),
        Side::Raw(conn) => support::raw_hit(conn, KEY).await,
    };
    std::hint::black_box(v);
}

/// A `tracing-opentelemetry` layer (the crate's spans at `debug`) over the SDK with an
/// exporter that drops what it is given: what the spans cost the process, not an export.
#[cfg(feature = "opentelemetry")]
fn install_layer() -> impl Drop {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_sdk::testing::trace::NoopSpanExporter::new())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("hit_cost"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .expect("no other subscriber");
    Guard(provider)
}

#[cfg(feature = "opentelemetry")]
struct Guard(opentelemetry_sdk::trace::SdkTracerProvider);

#[cfg(feature = "opentelemetry")]
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}

#[cfg(not(feature = "opentelemetry"))]
fn install_layer() -> impl Drop {
    struct Nothing;
    impl Drop for Nothing {
        fn drop(&mut self) {}
    }
    eprintln!("`otel` needs `--features opentelemetry`: measuring with no subscriber");
    Nothing
}
