//! What a call knows of the computation its value came from ([`Origin`]), and the trace context
//! a lock holder stores beside its lock ([`Leader`]): with the `opentelemetry` feature, a span
//! context and a fencing token; without it, nothing (zero-sized, no code runs).
//!
//! Explained in the guide: `docs/observability.md` (Links across processes).

#[cfg(feature = "opentelemetry")]
pub(crate) use otel::{Leader, Origin};

#[cfg(not(feature = "opentelemetry"))]
pub(crate) use off::{Leader, Origin};

/// Without the `opentelemetry` feature: nothing is carried, stored or linked.
#[cfg(not(feature = "opentelemetry"))]
mod off {
    use tracing::Span;

    /// Who computed a value: nothing is known without the feature.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub(crate) struct Origin;

    impl Origin {
        /// Nothing known.
        pub(crate) fn none() -> Self {
            Origin
        }

        /// Nothing to link.
        pub(crate) fn link(&self, _span: &Span) {}

        /// Nothing to learn.
        pub(crate) fn of(_leader: Option<Leader>) -> Self {
            Origin
        }

        /// Nothing to say.
        pub(crate) fn this_call(_span: &Span, _fence: u64) -> Self {
            Origin
        }
    }

    /// A lock holder's trace, as read back: nothing without the feature.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Leader;

    impl Leader {
        /// Nothing is stored beside the lock without the feature.
        pub(crate) fn traceparent(_span: &Span) -> Option<String> {
            None
        }

        /// Nothing is read back without the feature.
        pub(crate) fn parse(_fence: u64, _traceparent: &[u8]) -> Option<Self> {
            None
        }
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::sync::Arc;

    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::KeyValue;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The most bytes of a `traceparent` stored or read back: a version-00 one has 55; later
    /// versions may append fields, which are ignored (W3C Trace Context, "Versioning").
    pub(crate) const MAX_TRACEPARENT: usize = 128;

    /// The computation a value came from, as far as the call knows: shared by the followers of
    /// a flight (an `Arc`, cloned per follower).
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Origin(Option<Arc<Leader>>);

    /// Equality of fetches is about their values: where they came from in a trace is not part
    /// of it.
    impl PartialEq for Origin {
        fn eq(&self, _other: &Self) -> bool {
            true
        }
    }

    impl Eq for Origin {}

    impl Origin {
        /// Nothing known.
        pub(crate) fn none() -> Self {
            Origin(None)
        }

        /// Links `span` to the computation, and records its fencing token.
        pub(crate) fn link(&self, span: &Span) {
            let Some(leader) = &self.0 else {
                return;
            };
            if span.is_disabled() {
                return;
            }
            span.record("leader_fence", leader.fence);
            let fence = i64::try_from(leader.fence).unwrap_or(i64::MAX);
            span.add_link_with_attributes(
                leader.context.clone(),
                vec![KeyValue::new("stampede_guard.leader_fence", fence)],
            );
        }

        /// The origin of a value read back from a lock holder, if one was.
        pub(crate) fn of(leader: Option<Leader>) -> Self {
            Origin(leader.map(Arc::new))
        }

        /// The origin of a value this call computed under `fence`: its own span, for the
        /// followers of its flight; nothing without an OpenTelemetry layer.
        pub(crate) fn this_call(span: &Span, fence: u64) -> Self {
            if span.is_disabled() {
                return Origin(None);
            }
            let context = span.context().span().span_context().clone();
            if !context.is_valid() {
                return Origin(None);
            }
            Origin(Some(Arc::new(Leader { context, fence })))
        }
    }

    /// A lock holder's span and fencing token, as stored beside its lock.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Leader {
        context: SpanContext,
        fence: u64,
    }

    impl Leader {
        /// The W3C `traceparent` of `span`, to store beside a lock it takes: `None` without an
        /// OpenTelemetry layer (the span has no valid context), and then nothing is stored.
        pub(crate) fn traceparent(span: &Span) -> Option<String> {
            if span.is_disabled() {
                return None;
            }
            let context = span.context();
            let context = context.span().span_context().clone();
            if !context.is_valid() {
                return None;
            }
            Some(format!(
                "00-{}-{}-{:02x}",
                context.trace_id(),
                context.span_id(),
                context.trace_flags().to_u8()
            ))
        }

        /// A holder's `traceparent` read back from Redis with its fencing token. Bytes that are
        /// not one (another program's, a corrupted key, an oversized write) are ignored, logged
        /// (throttled), never trusted further than their shape.
        pub(crate) fn parse(fence: u64, traceparent: &[u8]) -> Option<Self> {
            match parse_traceparent(traceparent) {
                Some(context) => Some(Leader { context, fence }),
                None => {
                    crate::log::throttled!(warn, bytes = traceparent.len(),
                        "a malformed traceparent is stored beside a lock; no span link is made to its holder");
                    None
                }
            }
        }
    }

    /// A W3C `traceparent` (`version-trace_id-parent_id-flags`), as a remote span context:
    /// `None` for anything else (oversized, not hex, version `ff`, an all-zero id; a version
    /// 00 one with anything after its flags).
    fn parse_traceparent(bytes: &[u8]) -> Option<SpanContext> {
        if bytes.len() > MAX_TRACEPARENT {
            return None;
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let mut parts = text.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| {
            s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) {
            return None;
        }
        if !hex(flags, 2) || (version == "00" && parts.next().is_some()) {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        let context = SpanContext::new(
            TraceId::from_hex(trace).ok()?,
            SpanId::from_hex(span).ok()?,
            TraceFlags::new(flags) & TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        context.is_valid().then_some(context)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_well_formed_traceparent_is_read_and_anything_else_is_not() {
            let good = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let context = parse_traceparent(good).expect("well formed");
            assert_eq!(
                context.trace_id(),
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
            );
            assert!(context.is_sampled() && context.is_remote());
            for bad in [
                &b""[..],
                b"garbage",
                b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                b"00-\xff\xfe-00f067aa0ba902b7-01",
            ] {
                assert!(parse_traceparent(bad).is_none(), "{bad:?}");
            }
            let long = [b'0'; MAX_TRACEPARENT + 1];
            assert!(parse_traceparent(&long).is_none());
            // A later version may carry more fields: read, the rest ignored.
            let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
            assert!(parse_traceparent(later).is_some());
        }
    }
}
