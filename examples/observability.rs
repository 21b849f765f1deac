//! The cache observed end to end: its spans go through `tracing-opentelemetry` to the
//! OpenTelemetry SDK (exported over OTLP when the environment names an endpoint), and its
//! metrics (feature `metrics`) to a Prometheus scrape endpoint, while two cache instances
//! stampede on a few keys that expire every few seconds.
//!
//! ```text
//! cargo run --example observability --features metrics -- --url redis://127.0.0.1:PORT/0
//! curl -s http://127.0.0.1:9464/metrics | grep stampede_guard_calls_total
//!
//! # spans to a collector too (OTLP over HTTP; the SDK's standard variables):
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_SERVICE_NAME=reports \
//!   cargo run --example observability --features metrics -- --url redis://127.0.0.1:PORT/0
//! ```
//!
//! Flags: `--url` (required: a Redis the example may write to, under its namespace),
//! `--listen ADDR` (the scrape endpoint, default `127.0.0.1:9464`; port 0 picks a free one),
//! `--seconds N` (stop after N seconds; default: run until Ctrl-C), `--callers N` (per instance
//! per wave, default 40), `--keys N` (default 6), `--ttl-ms MS` (default 3000), `--compute-ms
//! MS` (default 150). Once the endpoint is bound it prints `metrics at http://ADDR/metrics` on
//! stdout. Without `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) spans are made and
//! linked but exported nowhere. The metric names: `docs/observability.md`; the Grafana dashboard
//! built on them: `docs/grafana-dashboard.json`.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use stampede_guard::{Cache, CallOptions, OnBackendError, RecoveryOptions};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer as _;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Histogram buckets of the `_seconds` metrics (waits and computations): 1 ms to 10 s, so
/// Prometheus's `histogram_quantile` has something to interpolate in.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
    10.0,
];

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse(std::env::args().skip(1))?;
    let provider = tracer_provider()?;
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("stampede-guard-example"))
        .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG);
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(otel).with(logs))?;
    let prometheus = prometheus()?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("metrics at http://{}/metrics", listener.local_addr()?);
    tokio::spawn(serve(listener, prometheus.clone()));

    // Two instances of one service, as two processes would be: separate caches (their own
    // connections, flights and near tiers) on the same Redis and namespace.
    // Redis down: compute without it (an `uncached` answer) rather than fail the call.
    let options = CallOptions::default()
        .stale_for(Duration::from_millis(args.ttl_ms / 2))
        .on_backend_error(OnBackendError::ComputeUncached);
    let mut instances = Vec::new();
    for _ in 0..2 {
        let cache = Cache::builder()
            .redis_url(args.url.as_str())
            .namespace("observability-example")
            .options(options.clone())
            // An invalidation made while Redis is down waits in a queue (its length is a gauge).
            .auto_recovery(RecoveryOptions::default())
            .build()
            .await?;
        instances.push(cache);
    }
    let run = stampedes(&instances, &args);
    match args.seconds {
        Some(seconds) => {
            let _ = tokio::time::timeout(Duration::from_secs(seconds), run).await;
        }
        None => {
            tokio::select! {
                _ = run => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
    }
    for cache in &instances {
        let stats = cache.stats();
        eprintln!(
            "calls by answer: {}",
            serde_json::to_string(&stats.calls).unwrap_or_default()
        );
    }
    // Spans still in the batch go out before the process ends.
    provider.shutdown()?;
    Ok(())
}

/// The SDK's tracer provider: with an OTLP/HTTP exporter (configured by the standard
/// `OTEL_EXPORTER_OTLP_*` variables) when an endpoint is named, else without an exporter.
fn tracer_provider() -> Result<SdkTracerProvider, BoxError> {
    let builder = SdkTracerProvider::builder();
    let named = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    if !named {
        eprintln!("no OTEL_EXPORTER_OTLP_ENDPOINT: spans are not exported");
        return Ok(builder.build());
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    Ok(builder.with_batch_exporter(exporter).build())
}

/// The Prometheus recorder, installed as the `metrics` facade's; its handle renders a scrape.
fn prometheus() -> Result<PrometheusHandle, BoxError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)?
        .install_recorder()?;
    // Without the exporter's own listener, its upkeep (draining histograms) is ours to run.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `GET /metrics`: the Prometheus text format.
async fn serve(listener: tokio::net::TcpListener, handle: PrometheusHandle) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("the metrics endpoint stopped: {e}");
    }
}

/// Waves of callers on both instances, each asking every key in its own order: before each
/// wave one key is invalidated (its data changed), and the keys expire every `--ttl-ms` with a
/// stale window of half that, so each wave finds some keys fresh, some stale and one gone.
async fn stampedes(instances: &[Cache], args: &Args) {
    let ttl = Duration::from_millis(args.ttl_ms);
    let compute = Duration::from_millis(args.compute_ms);
    for wave in 0u64.. {
        // The data behind one key changed: its value is dropped, and the wave stampedes on it
        // (one computation for both instances; the others join or wait).
        let changed = format!("report:{}", wave as usize % args.keys.max(1));
        if let Err(e) = instances[0].invalidate(&changed).await {
            eprintln!("invalidate failed: {e}");
        }
        let mut callers = tokio::task::JoinSet::new();
        for (instance, cache) in instances.iter().enumerate() {
            for caller in 0..args.callers {
                let cache = cache.clone();
                let keys = args.keys;
                let first = (wave as usize + caller + instance) % keys.max(1);
                callers.spawn(async move {
                    for k in 0..keys {
                        let key = format!("report:{}", (first + k) % keys);
                        let report = format!("{key} at wave {wave}");
                        let computed = cache
                            .get_or_compute(&key, ttl, move || async move {
                                tokio::time::sleep(compute).await;
                                Ok::<_, std::io::Error>(report)
                            })
                            .await;
                        if let Err(e) = computed {
                            eprintln!("call failed: {e}");
                        }
                    }
                });
            }
        }
        while callers.join_next().await.is_some() {}
        tokio::time::sleep(Duration::from_millis(args.ttl_ms / 3)).await;
    }
}

/// The command line.
struct Args {
    url: String,
    listen: SocketAddr,
    seconds: Option<u64>,
    callers: usize,
    keys: usize,
    ttl_ms: u64,
    compute_ms: u64,
}

impl Args {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, BoxError> {
        let mut parsed = Args {
            url: String::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            seconds: None,
            callers: 40,
            keys: 6,
            ttl_ms: 3000,
            compute_ms: 150,
        };
        while let Some(flag) = args.next() {
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--url" => parsed.url = value,
                "--listen" => parsed.listen = value.parse()?,
                "--seconds" => parsed.seconds = Some(value.parse()?),
                "--callers" => parsed.callers = value.parse()?,
                "--keys" => parsed.keys = value.parse()?,
                "--ttl-ms" => parsed.ttl_ms = value.parse()?,
                "--compute-ms" => parsed.compute_ms = value.parse()?,
                _ => return Err(format!("unknown flag {flag}").into()),
            }
        }
        if parsed.url.is_empty() {
            return Err("--url redis://HOST:PORT/DB is required".into());
        }
        Ok(parsed)
    }
}
