//! Refreshing a value in the background while callers keep getting the current one (a stale
//! window, or an early refresh chosen by XFetch).
//!
//! Invariants: at most one refresh of a key runs per process ([`Refreshes`]); across processes
//! the key's lock decides, without waiting: a process that finds it held stops trying until the
//! holder's lease would have run out, so stale reads cost one `GET` each, not a script each.
//!
//! Explained in the guide: `docs/freshness.md`.

use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use crate::cache::bounds::{ComputeFailure, ComputedFuture};
use crate::cache::compute::{Computation, OnFailure};
use crate::cache::engine::Engine;
use crate::store::ReadOrLock;
use crate::store::StoreExt;
use crate::wire::codec::Codec;
use crate::wire::envelope::Envelope;
use crate::wire::key::EntryKeys;
use crate::Lease;

/// The longest a process refrains from trying to refresh after finding the lock held.
const HOLD_OFF_MAX: Duration = Duration::from_secs(1);

impl<C: Codec> Engine<C> {
    /// Starts refreshing `keys` in a spawned task if no refresh of it runs in this process and
    /// its lock is free; returns at once either way. `seen_fence` is the fencing token of the
    /// value that prompted the refresh: if the value was rewritten since, there is nothing to do.
    pub(crate) fn refresh_in_background<T, E, F, Fut>(
        &self,
        keys: Arc<EntryKeys>,
        ttl: Duration,
        f: F,
        seen_fence: u64,
    ) where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: ComputedFuture<T, E>,
    {
        let Some(mut claim) = self.core.refreshes.claim(&keys.value) else {
            return;
        };
        let cache = self.clone();
        crate::time::spawn(async move {
            let store = &cache.core.store;
            let options = &cache.options;
            let mut acquiring = cache.acquiring(&keys);
            let token = acquiring.token();
            let asked = acquiring.sending();
            let answer = store
                .read_or_lock(&keys, &token, options.lease, false)
                .await;
            match &answer {
                Ok(ReadOrLock::Held { .. } | ReadOrLock::Value(_)) => acquiring.refused(),
                Ok(ReadOrLock::Acquired { .. }) => {}
                Err(e) => acquiring.failed(e),
            }
            match answer {
                Ok(ReadOrLock::Acquired { fence, born }) => {
                    let held = acquiring.granted(fence, asked).with_birth(born);
                    // Another process may have refreshed between our read and our lock.
                    if cache.replaced_since(&keys, seen_fence).await {
                        tracing::debug!(key = %keys.user(), "already refreshed elsewhere");
                        let _ = held.release().await;
                        return;
                    }
                    tracing::debug!(key = %keys.user(), "refreshing in the background");
                    // Without serving stale on error, the failure removes the stale value; the
                    // delete is fenced by the refresh's token, in one step with the unlock, so
                    // a value another process wrote meanwhile survives.
                    let on_failure = if options.serve_stale_on_error {
                        OnFailure::Release
                    } else {
                        OnFailure::Delete
                    };
                    let computation = Computation {
                        engine: cache.clone(),
                        keys: Arc::clone(&keys),
                        ttl,
                        f,
                    };
                    if let Err(e) = computation.compute_and_store(held, on_failure).await {
                        crate::log::throttled!(warn, key = %keys.user(), error = %e.chain(), "background refresh failed");
                    }
                }
                Ok(ReadOrLock::Held { expires_in }) => {
                    let wait = expires_in.unwrap_or(HOLD_OFF_MAX).min(HOLD_OFF_MAX);
                    claim.hold_off = Some(crate::time::now() + wait);
                }
                Ok(ReadOrLock::Value(_)) => {}
                Err(e) => {
                    crate::log::throttled!(warn, key = %keys.user(), error = %e, "background refresh could not reach the backend");
                }
            }
            drop(claim);
        });
    }

    /// Whether the stored value is no longer the one written with `seen_fence`.
    async fn replaced_since(&self, keys: &EntryKeys, seen_fence: u64) -> bool {
        match self.core.store.get(keys).await {
            Ok(Some(bytes)) => Envelope::decode(&bytes, self.core.codec.id())
                .is_ok_and(|envelope| envelope.fence != seen_fence),
            // Gone (invalidated) or unreadable: computing afresh is right.
            Ok(None) | Err(_) => false,
        }
    }
}
