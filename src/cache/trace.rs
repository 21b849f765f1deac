//! The call's span and what a waiter learns of the computation it waited for.
//!
//! One `debug` span per call, `stampede_guard::fetch` (see [`CallSpan`]): `debug`, not `info`,
//! because a cache call is detail beneath an application's own request span, and because an
//! application that logs at `info` through `tracing-subscriber`'s `fmt` layer would otherwise
//! pay for a span (its fields formatted) on every call and every Redis request. A tracing
//! backend takes them with a per-layer filter (`stampede_guard=debug` on the OpenTelemetry
//! layer only). The Redis requests' client spans are in `store/redis/traced.rs`.
//!
//! With the `opentelemetry` feature, the caller that wins a key's lock stores its W3C
//! `traceparent` beside the lock (the read-or-lock script, `store/redis/scripts/
//! read_or_lock.rs`); a caller that finds the lock held reads it back with the holder's fencing
//! token and links its span to the holder's (`cache/origin.rs`), and so do the callers of this
//! process that joined its flight. Without an OpenTelemetry layer the span has no valid
//! context, and nothing is stored or read.
//!
//! Explained in the guide: `docs/observability.md` (Spans, Links across processes).

use tracing::field::Empty;
use tracing::Span;

use crate::options::SpanKeys;
use crate::{Fetched, Inspection, Source};

/// A call's span and what it records.
pub(crate) struct CallSpan;

impl CallSpan {
    /// The span of a call of `key` in `namespace`, its key shown as `keys` says: disabled
    /// (costing one level check) without a subscriber that wants it.
    pub(crate) fn open(namespace: &str, key: &str, keys: SpanKeys) -> Span {
        let span = tracing::debug_span!(
            "stampede_guard::fetch",
            key = Empty,
            namespace,
            outcome = Empty,
            source = Empty,
            tier = Empty,
            wait_ms = Empty,
            fence = Empty,
            leader_fence = Empty,
        );
        if span.is_disabled() {
            return span;
        }
        match keys {
            SpanKeys::Hashed => {
                span.record("key", Inspection::hash_of(key).as_str());
            }
            SpanKeys::Clear => {
                span.record("key", key);
            }
            SpanKeys::Redacted => {}
        }
        span
    }

    /// Records how the call ended: its outcome, its value's source, how long it waited, and
    /// the link to the computation it waited for. (The tier that answered is recorded where it
    /// answers: `KeyCall::answered_by`.)
    pub(crate) fn close<T>(
        span: &Span,
        result: &Result<Fetched<T>, crate::Error>,
        outcome: &'static str,
        waited: impl FnOnce() -> u64,
    ) {
        if span.is_disabled() {
            return;
        }
        span.record("outcome", outcome);
        let Ok(fetched) = result else {
            return;
        };
        span.record("source", source_name(fetched.source));
        if fetched.source == Source::Waited {
            span.record("wait_ms", waited());
        }
        // A computation's own origin is its span, for its followers: no link to itself.
        if fetched.source != Source::Computed {
            fetched.origin.link(span);
        }
    }

    /// A hit of this process's tiers (the near tier, or the embedded store's decoded values),
    /// as a span of its own: only when the handle asks for it
    /// ([`CallOptions::trace_near_hits`](crate::CallOptions::trace_near_hits)), since a hit
    /// costs far less than a span.
    pub(crate) fn quick_hit(namespace: &str, key: &str, keys: SpanKeys, tier: &'static str) {
        let span = Self::open(namespace, key, keys);
        if !span.is_disabled() {
            span.record("outcome", "hit");
            span.record("source", "hit");
            span.record("tier", tier);
        }
    }
}

/// A source's name in spans.
fn source_name(source: Source) -> &'static str {
    match source {
        Source::Hit => "hit",
        Source::Stale => "stale",
        Source::Computed => "computed",
        Source::Waited => "waited",
        Source::Uncached => "uncached",
        Source::FailSafe => "fail-safe",
        Source::Held => "held",
    }
}
