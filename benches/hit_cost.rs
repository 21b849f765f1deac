//! The instructions of one Redis hit (`get_or_compute` on a warm key), for `valgrind
//! --tool=callgrind`: on a machine shared with other builds, wall-clock time is noise, and an
//! instruction count is not. Runs `STAMPEDE_HITS` hits (default 10,000) on a current-thread
//! runtime after a warm-up, with no subscriber, or with a `tracing-opentelemetry` layer over the
//! SDK (a no-op exporter) when the first filter is `otel` (feature `opentelemetry`).
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
    pub mod server;
    pub use {bench::*, cache::*, load::*, server::*};
}

use std::time::Duration;

use stampede_guard::{Cache, CallOptions};
use support::{value, RedisServer};

const KEY: &str = "2019-05";
const TTL: Duration = Duration::from_secs(3600);

fn main() {
    let hits: u64 = std::env::var("STAMPEDE_HITS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let traced = support::bench_filters().iter().any(|f| f == "otel");
    let _tracing = traced.then(install_layer);
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let cache = support::cache(&server, "bench", CallOptions::default()).await;
        let _ = cache.set(KEY, &value(), TTL).await.expect("warm the key");
        for _ in 0..100 {
            hit(&cache).await;
        }
        for _ in 0..hits {
            hit(&cache).await;
        }
    });
    println!(
        "{hits} hits ({})",
        if traced {
            "otel layer"
        } else {
            "no subscriber"
        }
    );
}

async fn hit(cache: &Cache) {
    let v: String = cache
        .get_or_compute(KEY, TTL, || async { Ok::<_, String>(String::new()) })
        .await
        .expect("a hit");
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
