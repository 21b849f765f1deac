//! When the backend fails before a key is read or locked: serve a copy held while it is down,
//! fail, or compute without the cache
//! ([`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)), as the table
//! of `cache/fallback.rs` answers the failure's kind with what the call has at hand.

use crate::cache::bounds::{CacheValue, ComputeFailure, ComputedFuture};
use crate::cache::engine::Engine;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::cache::fetch::KeyCall;
use crate::options::OnBackendError;
use crate::stats::{Event, NotStoredReason};
use crate::store::StoreError;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Fetched, Lease, Source};

impl<C: Codec> Engine<C> {
    /// A plain call (`get`, `set`) failed on the backend: counted, then returned as an error or,
    /// where the table (`cache/fallback.rs`) computes uncached, logged and answered as what a
    /// cache may always do (`instead`: forget a value, or never have had it).
    pub(crate) fn fail_open(
        &self,
        op: &'static str,
        keys: &EntryKeys,
        error: StoreError,
        instead: &'static str,
    ) -> Result<(), Error> {
        self.core.counters.record(Event::BackendError);
        // `get` and `set` look for no held copy: only the `get_or_compute` family serves one.
        if self.on_backend_failure(&error, false) != Answer::ComputeUncached {
            return Err(Error::backend(op, error));
        }
        // Not a warning per call: an outage would log every call (the circuit breaker logs
        // when it opens and closes; `Stats::backend_errors` counts each).
        tracing::debug!(key = %keys.user(), op, kind = %error.kind(), error = %error,
            "backend unavailable; {instead}");
        Ok(())
    }

    /// The table's answer to the backend failure `error` for this handle's options, with a
    /// held near copy at hand if `held` (a step that looked for one and found it).
    pub(crate) fn on_backend_failure(&self, error: &StoreError, held: bool) -> Answer {
        let has = AtHand {
            held,
            uncached: self.options.on_backend_error == OnBackendError::ComputeUncached,
            ..AtHand::default()
        };
        decide(Failure::of_store(error), has)
    }

    /// A value computed without the cache because the backend failed with `error`: counted and
    /// logged (at most once a minute per reason) as not stored, by the failure's reason.
    pub(crate) fn not_stored_uncached(&self, key: &str, error: &StoreError) {
        self.core
            .counters
            .not_stored(NotStoredReason::of(error.kind()), key, error);
    }
}

impl<C: Codec, T: CacheValue, E: ComputeFailure, F, Fut: ComputedFuture<T, E>>
    KeyCall<'_, C, T, E, F>
where
    F: FnOnce(Lease) -> Fut + Send + 'static,
{
    /// The backend failed during `op`: serve a held copy, fail, or compute without the cache,
    /// as the table (`cache/fallback.rs`) answers the failure with what the call has at hand.
    pub(crate) async fn without_cache(
        self,
        op: &'static str,
        error: StoreError,
    ) -> Result<Fetched<T>, Error> {
        let (engine, keys) = (self.engine, &self.keys);
        let held = engine.held_copy::<T>(keys.user(), &error);
        match (engine.on_backend_failure(&error, held.is_some()), held) {
            (Answer::ServeHeld, Some(held)) => return Ok(held),
            (Answer::ComputeUncached, _) => {}
            _ => return Err(Error::backend(op, error)),
        }
        // Not a warning per call: a value computed here is counted and logged as not stored,
        // at most once a minute per reason (a full or unreachable Redis would log every miss).
        tracing::debug!(key = %keys.user(), op, kind = %error.kind(), error = %error,
            "backend unavailable; computing without the cache");
        match (self.f)(Lease::unlocked()).await {
            Ok(computed) => {
                engine.not_stored_uncached(keys.user(), &error);
                Ok(Fetched::new(computed.value, Source::Uncached))
            }
            Err(e) => Err(Error::compute(e)),
        }
    }
}
