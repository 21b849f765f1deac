//! The hit path's glue to the tiers in this process: the near tier's copies, and the embedded
//! store's decoded values (a hit there skips decoding). A copy is never a fail-safe fallback.

use std::borrow::Cow;

use crate::cache::entry::StoredEntry;
use crate::cache::near::Ticket;
use crate::cache::tags::Epochs;
use crate::error::BackendErrorKind;
use crate::stats::Event;
use crate::store::StoreExt;
use crate::store::{Blob, StoreError};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Cache, Fetched, Source};

impl<C: Codec> Cache<C> {
    /// A near hit, or a hit of a value the embedded store holds decoded, counted: it needs no
    /// span, no timing and none of the machinery of [`fetch_beyond_quick_hit`].
    ///
    /// [`fetch_beyond_quick_hit`]: Self::fetch_beyond_quick_hit
    pub(crate) fn quick_hit<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        // A near hit counts itself (as a hit and a near hit, in one count).
        if let Some(value) = self.near_hit::<T>(key) {
            return Some(value);
        }
        let value = self.memory_hit::<T>(key)?;
        self.inner.counters.record(Event::Hit);
        Some(value)
    }

    /// The backend failed with `error`: if that is an outage (unreachable or busy, or the
    /// circuit breaker failing fast) and the near tier holds a copy it may serve while the
    /// backend is down ([`serve_while_down`](crate::NearCacheOptions::serve_while_down)), that copy,
    /// as [`Source::Held`].
    pub(crate) fn held<T: Clone + 'static>(
        &self,
        key: &str,
        error: &StoreError,
    ) -> Option<Fetched<T>> {
        if !matches!(
            error.kind(),
            BackendErrorKind::Unreachable | BackendErrorKind::Busy
        ) {
            return None;
        }
        let near = self.inner.near.as_ref()?;
        let value = near.held::<T>(key, self.options.fail_safe_for)?;
        Some(Fetched {
            value,
            source: Source::Held,
        })
    }

    /// A read of `keys` reached the backend: what the near tier held for it from before an
    /// outage goes (see `NearTier::reached`).
    pub(crate) fn reached_backend(&self, keys: &EntryKeys) {
        if let Some(near) = &self.inner.near {
            near.reached(&keys.user);
        }
    }

    /// This instance changed the entry: its own near copy goes now, without waiting for the
    /// announcement to come back (read-your-writes within the instance).
    pub(crate) fn forget_near(&self, keys: &EntryKeys) {
        if let Some(near) = &self.inner.near {
            near.forget(&keys.user);
        }
    }

    /// Puts what a read found into the near tier, if there is one: never a fail-safe copy,
    /// which is a fallback only (a value past its fresh-until the tier refuses by itself).
    /// The epochs the read found go in with it: the copy is served only while the tier holds
    /// them.
    pub(crate) fn remember_near<T: Clone + Send + Sync + 'static>(
        &self,
        ticket: Option<Ticket>,
        keys: &EntryKeys,
        entry: &StoredEntry<T>,
        len: usize,
        epochs: &Epochs,
    ) {
        if let (Some(near), Some(ticket), Ok(value), false) =
            (&self.inner.near, ticket, &entry.value, entry.throttled)
        {
            let Some(tag_epochs) = self.tag_epoch_names(&entry.tags) else {
                return;
            };
            near.hold_epochs(ticket, epochs);
            near.insert(
                ticket,
                &keys.user,
                value,
                entry.fence,
                entry.fresh_until_ms,
                entry.compute_ms,
                len,
                self.inner.store.now_ms(),
                (entry.born, tag_epochs.into()),
            );
        }
    }

    /// A fresh near copy of `key` as a `T`, if there is a near tier and it may serve. Its clock
    /// is calibrated before any copy goes in, so an uncalibrated one means no copy.
    pub(crate) fn near_copy<T: Clone + 'static>(&self, key: &str) -> Option<StoredEntry<T>> {
        let near = self.inner.near.as_ref()?;
        let store = &self.inner.store;
        if !store.clock_synced() {
            return None;
        }
        near.get::<T>(key)
    }

    /// The value of a fresh near copy of `key`, when a hit needs nothing more: no XFetch
    /// draw (then the copy, fresh, is simply served). A hit is counted, as the call's hit and
    /// a near hit.
    pub(crate) fn near_hit<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        if self.options.early_refresh_beta > 0.0 {
            return None;
        }
        // No clock check: the tier holds no copy before the store's clock is calibrated.
        self.inner.near.as_ref()?.value::<T>(key)
    }

    /// The value of `key` if the embedded store holds it fresh and decoded as a `T`, when a hit
    /// needs nothing more: no XFetch draw.
    pub(crate) fn memory_hit<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        if self.options.early_refresh_beta > 0.0 {
            return None;
        }
        let memory = self.inner.store.as_memory()?;
        memory.fresh::<T>(&self.inner.namespace, key)
    }

    /// The embedded store keeps a fresh value it handed out decoded, for [`memory_hit`]
    /// (so only when that path is taken: no XFetch).
    ///
    /// [`memory_hit`]: Self::memory_hit
    pub(crate) fn keep_decoded<T: Clone + Send + Sync + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &Blob,
        entry: &StoredEntry<T>,
    ) {
        let (Some(memory), Blob::Shared(shared), Ok(value)) =
            (self.inner.store.as_memory(), bytes, &entry.value)
        else {
            return;
        };
        // A throttled copy is a fallback, never a hit: it is not kept for the hit path.
        if self.options.early_refresh_beta == 0.0
            && !entry.throttled
            && entry.fresh_until_ms > memory.now_ms()
        {
            let Some(epochs) = self.epoch_names(&entry.tags) else {
                return;
            };
            let epochs = epochs.into_iter().map(Cow::into_owned).collect();
            let born = entry.born;
            memory.keep_decoded(keys, shared, value, entry.fresh_until_ms, born, epochs);
        }
    }
}
