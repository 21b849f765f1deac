//! The `opentelemetry` feature against a real redis-server, read back from the OpenTelemetry
//! SDK's in-memory exporter: a cold stampede over two instances (two `Cache` handles, each with
//! its own in-process flights, as two processes have) gives one span that computed and a link
//! to it from every other call, in either instance, each call with Redis client spans beneath;
//! and a trace context under the key that is malformed or oversized is ignored.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod cache;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use redis::Commands;
use stampede_guard::{CallOptions, Source};
use support::{cache, RedisServer};
use tokio::sync::{oneshot, Notify};
use tracing_subscriber::layer::SubscriberExt;

const TTL: Duration = Duration::from_secs(300);
/// How long a test waits for something that should happen at once (generous: a loaded machine).
const PATIENCE: Duration = Duration::from_secs(20);

/// The process's tracing: one `tracing-opentelemetry` layer over the SDK with the in-memory
/// exporter, installed once (the global default, which every runtime thread sees). Each test
/// reads back the spans of its own namespace.
fn exporter() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static TRACING: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    TRACING.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("otel_links"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
        (provider, exporter)
    })
}

/// Every span finished so far.
fn finished() -> Vec<SpanData> {
    let (provider, exporter) = exporter();
    provider.force_flush().expect("flushed");
    exporter.get_finished_spans().expect("spans")
}

/// The attribute `key` of `span`, as text.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(s) => s.as_str().to_owned(),
            other => other.to_string(),
        })
}

/// The call spans of `namespace`.
fn calls<'s>(spans: &'s [SpanData], namespace: &str) -> Vec<&'s SpanData> {
    spans
        .iter()
        .filter(|span| span.name == "stampede_guard::fetch")
        .filter(|span| attribute(span, "namespace").as_deref() == Some(namespace))
        .collect()
}

/// The Redis client spans right beneath `parent`.
fn redis_children<'s>(spans: &'s [SpanData], parent: &SpanData) -> Vec<&'s SpanData> {
    spans
        .iter()
        .filter(|span| span.parent_span_id == parent.span_context.span_id())
        .filter(|span| span.span_context.trace_id() == parent.span_context.trace_id())
        .filter(|span| attribute(span, "db.system.name").as_deref() == Some("redis"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_in_either_instance_links_to_the_one_span_that_computed() {
    exporter();
    let server = RedisServer::start();
    let options = CallOptions::default().lease(Duration::from_secs(10));
    let instances = [
        cache(&server, "otel-stampede", options.clone()).await,
        cache(&server, "otel-stampede", options).await,
    ];
    let mut callers = Vec::new();
    for i in 0..20 {
        let cache = instances[i % 2].clone();
        callers.push(tokio::spawn(async move {
            cache
                .fetch("2019-05", TTL, |_| async {
                    // Long enough for every other caller to arrive while the lock is held.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, String>(stampede_guard::Computed::new(7u32))
                })
                .await
        }));
    }
    let mut sources = Vec::new();
    for caller in callers {
        let fetched = tokio::time::timeout(PATIENCE, caller)
            .await
            .expect("every call ends")
            .unwrap()
            .expect("a value");
        assert_eq!(fetched.value, 7);
        sources.push(fetched.source);
    }
    let computed = sources.iter().filter(|s| **s == Source::Computed).count();
    assert_eq!(computed, 1, "one computation in the fleet: {sources:?}");

    let spans = finished();
    let calls = calls(&spans, "otel-stampede");
    assert_eq!(calls.len(), 20, "one span per call");
    let computing: Vec<_> = calls
        .iter()
        .filter(|span| attribute(span, "source").as_deref() == Some("computed"))
        .collect();
    assert_eq!(computing.len(), 1, "exactly one span computed");
    let leader = computing[0];
    let fence = attribute(leader, "fence").expect("the computation's fencing token");
    let leader_id = leader.span_context.span_id();
    assert_ne!(leader_id, SpanId::INVALID);
    let linked: Vec<_> = calls
        .iter()
        .filter(|span| {
            span.links.iter().any(|link| {
                link.span_context.span_id() == leader_id
                    && link.span_context.trace_id() == leader.span_context.trace_id()
            })
        })
        .collect();
    assert_eq!(
        linked.len(),
        19,
        "every other call links to the computation"
    );
    for span in &linked {
        assert_eq!(attribute(span, "source").as_deref(), Some("waited"));
        assert_eq!(
            attribute(span, "leader_fence").as_deref(),
            Some(fence.as_str())
        );
    }
    // The waiters of the instance that did not compute went through Redis for their link.
    let remote = linked
        .iter()
        .filter(|span| {
            redis_children(&spans, span)
                .iter()
                .any(|child| attribute(child, "db.operation.name").as_deref() == Some("EVALSHA"))
        })
        .count();
    assert!(remote >= 1, "a waiter of the other instance asked Redis");
    for span in &calls {
        let children = redis_children(&spans, span);
        assert!(
            !children.is_empty(),
            "each call has Redis client spans beneath: {:?}",
            attribute(span, "source")
        );
        for child in children {
            assert_eq!(child.span_kind, opentelemetry::trace::SpanKind::Client);
            assert_eq!(attribute(child, "db.namespace").as_deref(), Some("0"));
            assert_eq!(
                attribute(child, "server.address").as_deref(),
                Some("127.0.0.1")
            );
            assert!(attribute(child, "db.operation.name").is_some());
        }
    }
    // The key is hashed by default: never in clear.
    assert!(calls
        .iter()
        .all(|span| attribute(span, "key").is_some_and(|key| key != "2019-05")));
}

/// A call that waits on a lock whose trace key holds `stored` (after the fence): it gets the
/// holder's value, with no link and no panic; `logged`: the crate's throttled warning is an
/// event of its span.
async fn waits_despite(namespace: &str, stored: impl Fn(&str) -> Vec<u8>, logged: bool) {
    exporter();
    let server = RedisServer::start();
    let holder = cache(&server, namespace, CallOptions::default()).await;
    let waiter = cache(&server, namespace, CallOptions::default()).await;
    let (started, computing) = oneshot::channel();
    let release = Arc::new(Notify::new());
    let computation = {
        let release = Arc::clone(&release);
        tokio::spawn(async move {
            holder
                .get_or_compute("2019-05", TTL, move || async move {
                    let _ = started.send(());
                    release.notified().await;
                    Ok::<_, String>(7u32)
                })
                .await
        })
    };
    tokio::time::timeout(PATIENCE, computing)
        .await
        .expect("the computation starts")
        .unwrap();
    let mut conn = server.conn();
    let fence: String = conn
        .get(format!("{namespace}:{{2019-05}}_fence"))
        .expect("the fence");
    let trace_key = format!("{namespace}:{{2019-05}}_trace");
    let _: () = conn.set(&trace_key, stored(&fence)).unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .fetch("2019-05", TTL, |_| async {
                Ok::<_, String>(stampede_guard::Computed::new(0u32))
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.notify_one();
    computation.await.unwrap().unwrap();
    let fetched = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiter ends")
        .unwrap()
        .unwrap();
    assert_eq!((fetched.value, fetched.source), (7, Source::Waited));
    let spans = finished();
    let calls = calls(&spans, namespace);
    let waited: Vec<_> = calls
        .iter()
        .filter(|span| attribute(span, "source").as_deref() == Some("waited"))
        .collect();
    assert_eq!(waited.len(), 1);
    assert!(waited[0].links.is_empty(), "no link to a malformed trace");
    assert_eq!(attribute(waited[0], "leader_fence"), None);
    let warned = waited[0]
        .events
        .iter()
        .any(|event| event.name.contains("malformed traceparent"));
    assert_eq!(warned, logged, "{:?}", waited[0].events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_under_the_key_is_ignored() {
    waits_despite(
        "otel-malformed",
        |fence| format!("{fence} 00-not-a-traceparent-at-all").into_bytes(),
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_traceparent_under_the_key_is_not_even_read() {
    waits_despite(
        "otel-oversized",
        |fence| {
            let mut stored = format!("{fence} 00-").into_bytes();
            stored.resize(1 << 20, b'a');
            stored
        },
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_hashed_left_out_or_shown_as_the_handle_says() {
    exporter();
    let server = RedisServer::start();
    for (namespace, keys, shown) in [
        ("otel-redacted", stampede_guard::SpanKeys::Redacted, None),
        (
            "otel-clear",
            stampede_guard::SpanKeys::Clear,
            Some("2019-05".to_owned()),
        ),
        (
            "otel-hashed",
            stampede_guard::SpanKeys::Hashed,
            Some(stampede_guard::Inspection::hash_of("2019-05")),
        ),
    ] {
        let options = CallOptions::default().span_keys(keys);
        let cache = cache(&server, namespace, options).await;
        let _: u32 = cache
            .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(1) })
            .await
            .unwrap();
        let spans = finished();
        let calls = calls(&spans, namespace);
        assert_eq!(calls.len(), 1);
        assert_eq!(attribute(calls[0], "key"), shown, "{keys:?}");
        assert_eq!(
            attribute(calls[0], "tier"),
            None,
            "computed: no tier answered"
        );
        assert!(attribute(calls[0], "fence").is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_in_process_opens_a_span_only_when_asked() {
    exporter();
    for (namespace, traced) in [("otel-quiet-hits", false), ("otel-traced-hits", true)] {
        let options = CallOptions::default().trace_near_hits(traced);
        let cache = stampede_guard::Cache::builder()
            .namespace(namespace)
            .options(options)
            .build()
            .await
            .unwrap();
        for _ in 0..3 {
            let _: u32 = cache
                .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(1) })
                .await
                .unwrap();
        }
        assert_eq!(cache.stats().hits, 2, "counted either way");
        let spans = finished();
        let hits: Vec<_> = calls(&spans, namespace)
            .into_iter()
            .filter(|span| attribute(span, "source").as_deref() == Some("hit"))
            .collect();
        // The first hit after the computation reads the store (a call like any, with its span);
        // the next is answered by the store's decoded values, which opens a span only if asked.
        assert_eq!(hits.len(), if traced { 2 } else { 1 });
        for hit in hits {
            assert_eq!(attribute(hit, "tier").as_deref(), Some("memory"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_says_its_error_class_on_its_client_span() {
    exporter();
    // A port nothing listens on: the request fails without an answer.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let cache = cache(url.as_str(), "otel-unreachable", CallOptions::default()).await;
    let failed = cache
        .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(1u32) })
        .await;
    assert!(failed.is_err());
    let spans = finished();
    let calls = calls(&spans, "otel-unreachable");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        attribute(calls[0], "outcome").as_deref(),
        Some("backend-error")
    );
    let failed: Vec<_> = redis_children(&spans, calls[0])
        .into_iter()
        .filter(|span| attribute(span, "error.type").is_some())
        .collect();
    assert!(!failed.is_empty(), "the failed request's span");
    for span in failed {
        assert_eq!(
            attribute(span, "error.type").as_deref(),
            Some("unreachable")
        );
        assert_eq!(
            attribute(span, "stampede_guard.error_class").as_deref(),
            Some("unreachable")
        );
        assert_eq!(attribute(span, "db.response.status_code"), None);
        assert!(matches!(
            span.status,
            opentelemetry::trace::Status::Error { .. }
        ));
    }
}
