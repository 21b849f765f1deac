//! The health report ([`Cache::health`]): what a readiness probe or a status page needs to know
//! about the cache's backend, in one call.
//!
//! Explained in the guide: `docs/outages.md` (Health).

use std::time::Duration;

use crate::cache::engine::Engine;
use crate::stats::{BreakerState, TrackingState};
use crate::store::StoreExt;
use crate::wire::codec::Codec;
use crate::{Capabilities, OnBackendError};

/// How long [`Cache::health`] waits for the backend's answer: a readiness probe must not hang
/// on a black-holed connection for the whole response time-out.
pub(crate) const HEALTH_PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether this instance serves, as a load balancer needs to know it.
///
/// A Redis outage is shared by every instance of a fleet: taking them all out of rotation at
/// once turns it into a full outage. So an instance that still answers without its backend
/// (held copies, uncached computation) is [`Degraded`](Self::Degraded), and ready; only one
/// that cannot answer is [`Unavailable`](Self::Unavailable). Serialized as `healthy`,
/// `degraded` or `unavailable`.
///
/// ```
/// use stampede_guard::HealthState;
/// assert_eq!(HealthState::Degraded.as_str(), "degraded");
/// assert!(HealthState::Degraded.is_serving());
/// assert!(!HealthState::Unavailable.is_serving());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HealthState {
    /// The backend answers and the circuit breaker is closed: every call goes through the cache.
    Healthy,
    /// The backend is unreachable or the breaker is not closed, but this instance still serves:
    /// from copies its near tier holds
    /// ([`serve_while_down`](crate::NearCacheOptions::serve_while_down)) and by computing
    /// without the cache ([`ComputeUncached`](crate::OnBackendError::ComputeUncached)).
    /// [`Health::reasons`] says which.
    Degraded,
    /// The backend is unreachable or the breaker is not closed, and nothing answers in its
    /// place: every cached call fails until it is back.
    Unavailable,
}

impl HealthState {
    /// The state's name: `healthy`, `degraded` or `unavailable`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::HealthState::Healthy.as_str(), "healthy");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Unavailable => "unavailable",
        }
    }

    /// Whether an instance in this state serves requests: `Healthy` or `Degraded`.
    ///
    /// ```
    /// assert!(stampede_guard::HealthState::Healthy.is_serving());
    /// ```
    pub fn is_serving(self) -> bool {
        self != HealthState::Unavailable
    }
}

crate::stats::text_is_as_str!(HealthState);

/// Why a [`Health`] is not [`Healthy`](HealthState::Healthy), and what answers meanwhile.
/// Serialized as its [`as_str`](Self::as_str) name.
///
/// ```
/// use stampede_guard::HealthReason;
/// assert_eq!(HealthReason::ServingHeldCopies.as_str(), "serving_held_copies");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HealthReason {
    /// The backend did not answer a `PING` within a second.
    BackendUnreachable,
    /// The circuit breaker is open or half-open: calls skip the backend.
    BreakerOpen,
    /// The near tier serves the copies it holds
    /// ([`serve_while_down`](crate::NearCacheOptions::serve_while_down)): its feed was proven
    /// at least once, and the bound past the last proof has not run out.
    ServingHeldCopies,
    /// Computations run without the cache
    /// ([`ComputeUncached`](crate::OnBackendError::ComputeUncached)); its `get` reads a miss and
    /// its `set` is skipped.
    ComputingUncached,
    /// Writes (`set`, `invalidate`) wait in the auto-recovery queue for the backend
    /// ([`CacheBuilder::auto_recovery`](crate::CacheBuilder::auto_recovery)). Writes are not
    /// reads: this alone does not make an instance serve.
    QueueingWrites,
    /// Neither held copies nor uncached computation are configured: every cached read fails
    /// while the backend is down.
    NoFallback,
}

impl HealthReason {
    /// The reason's name: `backend_unreachable`, `breaker_open`, `serving_held_copies`,
    /// `computing_uncached`, `queueing_writes` or `no_fallback`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::HealthReason::NoFallback.as_str(), "no_fallback");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            HealthReason::BackendUnreachable => "backend_unreachable",
            HealthReason::BreakerOpen => "breaker_open",
            HealthReason::ServingHeldCopies => "serving_held_copies",
            HealthReason::ComputingUncached => "computing_uncached",
            HealthReason::QueueingWrites => "queueing_writes",
            HealthReason::NoFallback => "no_fallback",
        }
    }
}

crate::stats::text_is_as_str!(HealthReason);

/// What [`Cache::health`](crate::Cache::health) found. Serialized (for a status page) under its
/// field names, with `failing_for` as `failing_for_seconds` (a number, or null), plus `ready`
/// ([`is_ready`](Self::is_ready)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use stampede_guard::HealthState;
///
/// let health = stampede_guard::Cache::in_memory().health().await;
/// assert!(health.reachable);
/// assert_eq!(health.state, HealthState::Healthy);
/// let json = serde_json::to_value(&health).unwrap();
/// assert_eq!(json["breaker"], "closed");
/// assert_eq!(json["state"], "healthy");
/// assert_eq!(json["reasons"], serde_json::json!([]));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Whether this instance serves: [`Healthy`](HealthState::Healthy),
    /// [`Degraded`](HealthState::Degraded) (the backend is down, something answers in its
    /// place) or [`Unavailable`](HealthState::Unavailable).
    pub state: HealthState,
    /// Why the state is not `Healthy`, and what answers meanwhile; empty when it is. With the
    /// options of the handle `health` was asked through (its
    /// [`on_backend_error`](crate::CallOptions::on_backend_error)).
    pub reasons: Vec<HealthReason>,
    /// Whether the backend answered a `PING` just now, within a second (the embedded store
    /// always does). Not asked while the circuit breaker is open: then it is `false` at once.
    pub reachable: bool,
    /// The circuit breaker in front of the backend ([`BreakerState::Closed`] without one).
    pub breaker: BreakerState,
    /// How long the backend has been failing, if its last answer was a failure.
    pub failing_for: Option<Duration>,
    /// With a near tier: whether its invalidation feed is proven current within
    /// `max_staleness`, so that its copies are served. `None` without a near tier.
    pub near_feed_proven: Option<bool>,
    /// With a near tier: whether Redis tells it of changes made outside the crate
    /// ([`TrackingState`]); `None` without a near tier. [`TrackingState::Refused`] means a
    /// change by another program (`DEL`, `SET`, an expiry or eviction) is caught by reading
    /// each copy again once it is `max_staleness` old, one read per hot key per window.
    pub near_tracking: Option<TrackingState>,
    /// Writes waiting in the auto-recovery queue for the backend
    /// ([`CacheBuilder::auto_recovery`](crate::CacheBuilder::auto_recovery)); 0 without it.
    pub recovery_queued: usize,
    /// What the Redis server allows and the fallbacks chosen
    /// ([`Cache::capabilities`](crate::Cache::capabilities)); `None` for the embedded store, a
    /// cluster, or before the first probe answered.
    pub capabilities: Option<Capabilities>,
}

impl Health {
    /// Whether this instance should receive traffic: true while it serves
    /// ([`Healthy`](HealthState::Healthy) or [`Degraded`](HealthState::Degraded)), false when
    /// it is [`Unavailable`](HealthState::Unavailable). A Redis outage with held copies or
    /// uncached computation configured leaves every instance ready: the backend is shared, so
    /// taking one out would take them all out. Whether the backend itself answers is
    /// [`reachable`](Self::reachable).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// assert!(stampede_guard::Cache::in_memory().health().await.is_ready());
    /// # }
    /// ```
    pub fn is_ready(&self) -> bool {
        self.state.is_serving()
    }
}

/// What answers in the backend's place, found by [`judge`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fallbacks {
    /// The near tier serves its held copies.
    pub(crate) held_copies: bool,
    /// Computations run without the cache.
    pub(crate) uncached: bool,
    /// Writes are queued for the backend.
    pub(crate) queued_writes: bool,
}

/// The state and reasons for a backend `reachable` behind a breaker in `breaker`, with
/// `fallbacks`. The fail-safe is not a fallback here: its kept values live in the backend, and
/// it answers a failed computation, not a failed backend.
pub(crate) fn judge(
    reachable: bool,
    breaker: BreakerState,
    fallbacks: Fallbacks,
) -> (HealthState, Vec<HealthReason>) {
    if reachable && breaker == BreakerState::Closed {
        return (HealthState::Healthy, Vec::new());
    }
    let mut reasons = Vec::new();
    if !reachable {
        reasons.push(HealthReason::BackendUnreachable);
    }
    if breaker != BreakerState::Closed {
        reasons.push(HealthReason::BreakerOpen);
    }
    if fallbacks.held_copies {
        reasons.push(HealthReason::ServingHeldCopies);
    }
    if fallbacks.uncached {
        reasons.push(HealthReason::ComputingUncached);
    }
    if fallbacks.queued_writes {
        reasons.push(HealthReason::QueueingWrites);
    }
    let state = if fallbacks.held_copies || fallbacks.uncached {
        HealthState::Degraded
    } else {
        reasons.push(HealthReason::NoFallback);
        HealthState::Unavailable
    };
    (state, reasons)
}

impl serde::Serialize for Health {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Health", 10)?;
        s.serialize_field("state", &self.state)?;
        s.serialize_field("ready", &self.is_ready())?;
        s.serialize_field("reasons", &self.reasons)?;
        s.serialize_field("reachable", &self.reachable)?;
        s.serialize_field("breaker", &self.breaker)?;
        s.serialize_field(
            "failing_for_seconds",
            &self.failing_for.map(|d| d.as_secs_f64()),
        )?;
        s.serialize_field("near_feed_proven", &self.near_feed_proven)?;
        s.serialize_field("near_tracking", &self.near_tracking)?;
        s.serialize_field("recovery_queued", &self.recovery_queued)?;
        s.serialize_field("capabilities", &self.capabilities)?;
        s.end()
    }
}

impl<C: Codec> Engine<C> {
    /// The health report behind [`Cache::health`].
    pub(crate) async fn health_report(&self) -> Health {
        let store = &self.core.store;
        let reachable = matches!(
            crate::time::timeout(HEALTH_PING_TIMEOUT, store.ping()).await,
            Ok(Ok(()))
        );
        let breaker = self.core.breaker.as_deref();
        let breaker_state = breaker.map_or(BreakerState::Closed, |b| b.state());
        let fallbacks = Fallbacks {
            held_copies: self.core.near().is_some_and(|near| near.serves_held()),
            uncached: self.options.on_backend_error == OnBackendError::ComputeUncached,
            queued_writes: self.core.recovery.is_some(),
        };
        let (state, reasons) = judge(reachable, breaker_state, fallbacks);
        Health {
            state,
            reasons,
            reachable,
            breaker: breaker_state,
            failing_for: breaker.and_then(|b| b.failing_for()),
            near_feed_proven: self.core.near().map(|near| near.proven()),
            near_tracking: self.core.near().map(|near| near.tracking()),
            recovery_queued: self.core.recovery.as_ref().map_or(0, |r| r.len()),
            capabilities: self.core.capabilities.as_ref().and_then(|p| p.get()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOWN: [(bool, BreakerState); 3] = [
        (false, BreakerState::Closed),
        (false, BreakerState::Open),
        (true, BreakerState::HalfOpen),
    ];

    /// A reachable backend behind a closed breaker is healthy whatever is configured.
    #[test]
    fn a_backend_that_answers_is_healthy() {
        let all = Fallbacks {
            held_copies: true,
            uncached: true,
            queued_writes: true,
        };
        for fallbacks in [Fallbacks::default(), all] {
            let (state, reasons) = judge(true, BreakerState::Closed, fallbacks);
            assert_eq!(state, HealthState::Healthy);
            assert!(reasons.is_empty());
        }
    }

    /// Down with nothing in its place, or only queued writes (writes are not reads), the
    /// instance cannot serve: unavailable, and it says why.
    #[test]
    fn down_without_a_read_fallback_is_unavailable() {
        for (reachable, breaker) in DOWN {
            for queued_writes in [false, true] {
                let fallbacks = Fallbacks {
                    queued_writes,
                    ..Fallbacks::default()
                };
                let (state, reasons) = judge(reachable, breaker, fallbacks);
                assert_eq!(state, HealthState::Unavailable, "{reachable} {breaker:?}");
                assert_eq!(reasons.last(), Some(&HealthReason::NoFallback));
                assert_eq!(
                    reasons.contains(&HealthReason::QueueingWrites),
                    queued_writes
                );
            }
        }
    }

    /// Held copies or uncached computation, either alone, keep the instance serving.
    #[test]
    fn down_with_held_copies_or_uncached_computation_is_degraded() {
        for (reachable, breaker) in DOWN {
            for (held_copies, uncached) in [(true, false), (false, true), (true, true)] {
                let fallbacks = Fallbacks {
                    held_copies,
                    uncached,
                    queued_writes: false,
                };
                let (state, reasons) = judge(reachable, breaker, fallbacks);
                assert_eq!(state, HealthState::Degraded);
                assert!(state.is_serving());
                assert_eq!(
                    reasons.contains(&HealthReason::ServingHeldCopies),
                    held_copies
                );
                assert_eq!(reasons.contains(&HealthReason::ComputingUncached), uncached);
                assert_eq!(
                    reasons.contains(&HealthReason::BackendUnreachable),
                    !reachable
                );
                assert_eq!(
                    reasons.contains(&HealthReason::BreakerOpen),
                    breaker != BreakerState::Closed
                );
                assert!(!reasons.contains(&HealthReason::NoFallback));
            }
        }
    }
}
