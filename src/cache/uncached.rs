//! When the backend fails before a key is read or locked: fail, or compute without the cache
//! ([`OnBackendError::ComputeUncached`]), as the call's options say.

use std::future::Future;

use crate::cache::bounds::ComputeFailure;
use crate::stats::Event;
use crate::store::StoreError;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Cache, Computed, Error, Fetched, Lease, OnBackendError, Source};

impl<C: Codec> Cache<C> {
    /// A plain call (`get`, `set`) failed on the backend: counted, then returned as an error or,
    /// with [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached), logged and answered
    /// as what a cache may always do (`instead`: forget a value, or never have had it).
    pub(crate) fn fail_open(
        &self,
        op: &'static str,
        keys: &EntryKeys,
        error: StoreError,
        instead: &'static str,
    ) -> Result<(), Error> {
        self.inner.counters.record(Event::BackendError);
        match self.options.on_backend_error {
            OnBackendError::Fail => Err(Error::backend(op, error)),
            OnBackendError::ComputeUncached => {
                tracing::warn!(key = %keys.user, op, error = %error,
                    "backend unavailable; {instead}");
                Ok(())
            }
        }
    }

    /// The backend failed during `op`: fail, or compute without the cache, as configured.
    pub(crate) async fn without_cache<T, E, F, Fut>(
        &self,
        op: &'static str,
        error: StoreError,
        keys: &EntryKeys,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<Computed<T>, E>>,
    {
        match self.options.on_backend_error {
            OnBackendError::Fail => Err(Error::backend(op, error)),
            OnBackendError::ComputeUncached => {
                tracing::warn!(key = %keys.user, op, error = %error,
                    "backend unavailable; computing without the cache");
                match f(Lease::unlocked()).await {
                    Ok(computed) => Ok(Fetched {
                        value: computed.value,
                        source: Source::Uncached,
                    }),
                    Err(e) => Err(Error::compute(e)),
                }
            }
        }
    }
}
