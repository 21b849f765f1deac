//! The health report ([`Cache::health`]): what a readiness probe or a status page needs to know
//! about the cache's backend, in one call.
//!
//! Explained in the guide: `docs/outages.md` (Health).

use std::time::Duration;

use crate::cache::engine::Engine;
use crate::stats::{BreakerState, TrackingState};
use crate::store::StoreExt;
use crate::wire::codec::Codec;

/// How long [`Cache::health`] waits for the backend's answer: a readiness probe must not hang
/// on a black-holed connection for the whole response time-out.
pub(crate) const HEALTH_PING_TIMEOUT: Duration = Duration::from_secs(1);

/// What [`Cache::health`](crate::Cache::health) found. Serialized (for a status page) under its
/// field names, with `failing_for` as `failing_for_seconds` (a number, or null).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let health = stampede_guard::Cache::in_memory().health().await;
/// assert!(health.reachable);
/// let json = serde_json::to_value(&health).unwrap();
/// assert_eq!(json["breaker"], "closed");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
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
    /// copy of a value changed by another program (`DEL`, `SET`, an expiry or eviction) may be
    /// served until its own fresh-until.
    pub near_tracking: Option<TrackingState>,
    /// Writes waiting in the auto-recovery queue for the backend
    /// ([`CacheBuilder::auto_recovery`](crate::CacheBuilder::auto_recovery)); 0 without it.
    pub recovery_queued: usize,
}

impl Health {
    /// Whether this instance can serve through its backend now: reachable, the breaker closed.
    /// A readiness probe that takes an instance out of rotation on `false` should keep in mind
    /// that every instance shares the backend: with values held in process
    /// ([`serve_while_down`](crate::NearCacheOptions::serve_while_down)) or
    /// [`ComputeUncached`](crate::OnBackendError::ComputeUncached), an instance still serves
    /// without it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// assert!(stampede_guard::Cache::in_memory().health().await.is_ready());
    /// # }
    /// ```
    pub fn is_ready(&self) -> bool {
        self.reachable && self.breaker == BreakerState::Closed
    }
}

impl serde::Serialize for Health {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Health", 7)?;
        s.serialize_field("reachable", &self.reachable)?;
        s.serialize_field("ready", &self.is_ready())?;
        s.serialize_field("breaker", &self.breaker)?;
        s.serialize_field(
            "failing_for_seconds",
            &self.failing_for.map(|d| d.as_secs_f64()),
        )?;
        s.serialize_field("near_feed_proven", &self.near_feed_proven)?;
        s.serialize_field("near_tracking", &self.near_tracking)?;
        s.serialize_field("recovery_queued", &self.recovery_queued)?;
        s.end()
    }
}

impl<C: Codec> Engine<C> {
    /// The health report behind [`Cache::health`].
    pub(crate) async fn health_report(&self) -> Health {
        let store = &self.core.store;
        let reachable = matches!(
            tokio::time::timeout(HEALTH_PING_TIMEOUT, store.ping()).await,
            Ok(Ok(()))
        );
        let breaker = self.core.breaker.as_deref();
        Health {
            reachable,
            breaker: breaker.map_or(BreakerState::Closed, |b| b.state()),
            failing_for: breaker.and_then(|b| b.failing_for()),
            near_feed_proven: self.core.tiers.near().map(|near| near.proven()),
            near_tracking: self.core.tiers.near().map(|near| near.tracking()),
            recovery_queued: self.core.recovery.as_ref().map_or(0, |r| r.len()),
        }
    }
}
