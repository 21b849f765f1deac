//! Serving a stored entry: a remembered failure as its error, a throttled fail-safe copy as the
//! fallback, a value as it is or with a background refresh (stale, or drawn early by XFetch).
//! Decided in one place so the single-key path and each key of a batch decide alike.

use std::future::Future;

use crate::cache::bounds::{CacheValue, ComputeFailure};
use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::fetch::KeyCall;
use crate::cache::freshness::{judge, unit_draw, Worth};
use crate::store::StoreExt;
use crate::wire::codec::Codec;
use crate::{Computed, Error, Fetched, Lease, Source};

/// How a stored entry is served (`Engine::judge_entry`).
pub(crate) enum Judged<T> {
    /// As it is.
    Served(Result<Fetched<T>, Error>),
    /// With a background refresh of the entry written under this fence.
    Refresh(Fetched<T>, u64),
}

impl<C, F, T, E, Fut> KeyCall<'_, C, F>
where
    C: Codec,
    T: CacheValue,
    E: ComputeFailure,
    F: FnOnce(Lease) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
{
    /// Serves `entry` to this call, found `fresh` (a hit, or a value another caller computed
    /// while this one waited): a refresh goes to the background with the call's computation.
    pub(crate) fn serve(self, entry: StoredEntry<T>, fresh: Source) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        match engine.judge_entry(entry, &self.keys.user, fresh) {
            Judged::Served(outcome) => outcome,
            Judged::Refresh(served, fence) => {
                engine.refresh_in_background(self.keys, self.ttl, self.f, fence);
                Ok(served)
            }
        }
    }
}

impl<C: Codec> Engine<C> {
    /// What serving `entry` (found as `fresh` says) takes, decided before anything is prepared
    /// for a refresh, so that every path (a single key's, each key of a batch) decides alike:
    /// a remembered failure, a throttled fail-safe copy and a value neither stale nor drawn by
    /// XFetch are served as they are; any other value is served with a background refresh.
    pub(crate) fn judge_entry<T>(
        &self,
        entry: StoredEntry<T>,
        key: &str,
        fresh: Source,
    ) -> Judged<T> {
        let value = match entry.value {
            Ok(value) => value,
            Err(message) => {
                return Judged::Served(Err(Error::RecentFailure {
                    key: key.to_owned(),
                    message,
                }))
            }
        };
        if entry.throttled {
            // Sorted for serving, so within its throttle: the source failed a moment ago.
            return Judged::Served(Ok(self.serve_fallback(value)));
        }
        let beta = self.options.early_refresh_beta;
        // Draw only when XFetch is on: the hit path stays free of the random number generator.
        let draw = if beta > 0.0 { unit_draw() } else { 1.0 };
        let worth = judge(
            self.core.store.now_ms(),
            entry.fresh_until_ms,
            entry.compute_ms,
            beta,
            draw,
        );
        let served = |source| Fetched { value, source };
        match worth {
            Worth::RefreshEarly => Judged::Refresh(served(fresh), entry.fence),
            Worth::Stale => Judged::Refresh(served(Source::Stale), entry.fence),
            // `judge` says fresh, refreshed early or stale of a served value.
            Worth::Fresh | Worth::Kept | Worth::Dead => Judged::Served(Ok(served(fresh))),
        }
    }
}
