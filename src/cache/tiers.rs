//! The tiers in this process, in front of the store: the near tier (copies of Redis values,
//! kept current by the feed) and the embedded store's decoded values. A hit in either needs no
//! request; a copy is never a fail-safe fallback.
//!
//! The builder knows which of them the cache has (the embedded store is the backend, or a near
//! tier sits in front of Redis) and hands them here, so no call asks the store what it is.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::entry::StoredEntry;
use crate::cache::fallback::Failure;
use crate::cache::near::{Fill, NearTier, Ticket};
use crate::cache::tags::Epochs;
use crate::stats::{Answered, Counters, Event};
use crate::store::StoreExt;
use crate::store::{Blob, MemoryStore, StoreError};
use crate::wire::key::EntryKeys;
use crate::{Fetched, Source};

/// How long a read waits for the backend, while the near tier's feed is silent past its proof,
/// before a held copy answers it: the reads under way when a server stops answering are not
/// left to wait for the circuit breaker (up to its stall bound) when the instance holds a copy
/// it would serve a moment later anyway. Short next to the feed's silence that must come first
/// (`max_staleness`), long next to a healthy round trip.
pub(crate) const HELD_AFTER: Duration = Duration::from_millis(2);

/// The near tier and the embedded store, when the cache has one of them (a cache with neither
/// holds no `Tiers`: its calls consult nothing in process).
pub(crate) struct Tiers {
    near: Option<Arc<NearTier>>,
    memory: Option<Arc<MemoryStore>>,
}

impl Tiers {
    /// The tiers of a cache with `near` and `memory`; `None` when it has neither.
    pub(crate) fn new(
        near: Option<Arc<NearTier>>,
        memory: Option<Arc<MemoryStore>>,
    ) -> Option<Self> {
        (near.is_some() || memory.is_some()).then_some(Tiers { near, memory })
    }

    /// Whether the backend is the embedded store (whose decoded values are a tier here).
    pub(crate) fn is_embedded(&self) -> bool {
        self.memory.is_some()
    }

    /// The near tier, if there is one.
    pub(crate) fn near(&self) -> Option<&NearTier> {
        self.near.as_deref()
    }

    /// A near hit, or a hit of a value the embedded store holds decoded, counted (a near hit
    /// counts itself, as a hit and a near hit in one count). Only for a call that needs nothing
    /// more than the value: no XFetch draw.
    pub(crate) fn quick_hit<T: Clone + 'static>(
        &self,
        namespace: &str,
        key: &str,
        counters: &Counters,
    ) -> Option<T> {
        // No clock check: the near tier holds no copy before the store's clock is calibrated.
        if let Some(value) = self.near.as_ref().and_then(|near| near.value::<T>(key)) {
            return Some(value);
        }
        let value = self.memory.as_ref()?.fresh::<T>(namespace, key)?;
        counters.record(Event::Answered(Answered::Hit));
        Some(value)
    }

    /// The value of a fresh near copy of `key`, for a plain read (`Cache::get`): counted as a
    /// near hit, not as a hit of the `get_or_compute` family. `T` need not be `Clone`.
    pub(crate) fn near_read<T: 'static>(&self, key: &str) -> Option<T> {
        self.near.as_ref()?.read::<T>(key)
    }

    /// A fresh near copy of `key` as a `T`, if there is a near tier and it may serve. Its clock
    /// is calibrated before any copy goes in, so an uncalibrated one (`clock_synced` false)
    /// means no copy.
    pub(crate) fn near_copy<T: Clone + 'static>(
        &self,
        key: &str,
        clock_synced: bool,
    ) -> Option<StoredEntry<T>> {
        let near = self.near.as_ref()?;
        if !clock_synced {
            return None;
        }
        near.get::<T>(key)
    }

    /// The backend failed with `error`: if a held copy answers that failure (an outage:
    /// unreachable or busy, or the circuit breaker failing fast, by the table of
    /// `cache/fallback.rs`) and the near tier holds a copy it may serve while the
    /// backend is down ([`serve_while_down`](crate::NearCacheOptions::serve_while_down)), that
    /// copy, as [`Source::Held`], at most `past_fresh` (the call's fail-safe window) past its
    /// fresh-until.
    pub(crate) fn held_copy<T: Clone + 'static>(
        &self,
        key: &str,
        error: &StoreError,
        past_fresh: Duration,
    ) -> Option<Fetched<T>> {
        if !Failure::of_store(error).serves_held() {
            return None;
        }
        let value = self.near.as_ref()?.held_copy::<T>(key, past_fresh)?;
        Some(Fetched::new(value, Source::Held))
    }

    /// Whether a read of the backend may be answered by a held copy if it stays unanswered:
    /// the near tier holds copies for an outage and its feed has gone silent past its proof.
    pub(crate) fn silent(&self) -> bool {
        self.near.as_ref().is_some_and(|near| near.silent())
    }

    /// A held copy of `key` for a read the backend left unanswered for [`HELD_AFTER`] while the
    /// feed is silent: two signs that the server stopped answering, the same bound as after a
    /// failure (`serve_while_down` past the last proof, `past_fresh` past fresh-until). A
    /// server merely slow answers the read later, in the background, and that answer drops the
    /// copy (`reached`): once per key at most, while it answers.
    pub(crate) fn held_unanswered<T: Clone + 'static>(
        &self,
        key: &str,
        past_fresh: Duration,
    ) -> Option<Fetched<T>> {
        let near = self.near.as_ref().filter(|near| near.silent())?;
        let value = near.held_copy::<T>(key, past_fresh)?;
        Some(Fetched::new(value, Source::Held))
    }

    /// A ticket for a read of `keys` whose answer may go into the near tier.
    pub(crate) fn ticket(&self, keys: &EntryKeys) -> Option<Ticket> {
        self.near.as_ref()?.ticket(keys.user())
    }

    /// A read of `keys` reached the backend: what the near tier held for it from before an
    /// outage goes (see `NearTier::reached`).
    pub(crate) fn reached(&self, keys: &EntryKeys) {
        if let Some(near) = &self.near {
            near.reached(keys.user());
        }
    }

    /// This instance changed the entry: its own near copy goes now, without waiting for the
    /// announcement to come back (read-your-writes within the instance).
    pub(crate) fn forget(&self, keys: &EntryKeys) {
        if let Some(near) = &self.near {
            near.forget(keys.user());
        }
    }

    /// Puts what a read found into the near tier, if there is one: never a fail-safe copy,
    /// which is a fallback only (a value past its fresh-until the tier refuses by itself).
    /// The epochs the read found go in with it: the copy is served only while the tier holds
    /// them. `tag_epochs` names the epochs of the entry's tags (`None`: they cannot be named,
    /// and the copy does not go in); `now_ms` is the store's clock.
    pub(crate) fn remember<T: Clone + Send + Sync + 'static>(
        &self,
        read: Read<'_, T>,
        tag_epochs: impl FnOnce() -> Option<Vec<String>>,
        now_ms: u64,
    ) {
        let Read {
            ticket,
            keys,
            entry,
            len,
            epochs,
        } = read;
        let (Some(near), Some(ticket), Ok(value), false) =
            (&self.near, ticket, &entry.value, entry.throttled)
        else {
            return;
        };
        let Some(tag_epochs) = tag_epochs() else {
            return;
        };
        near.hold_epochs(ticket, epochs);
        let fill = Fill {
            key: keys.user(),
            value,
            fence: entry.fence,
            fresh_until_ms: entry.fresh_until_ms,
            compute_ms: entry.compute_ms,
            bytes: len,
            born: entry.born,
            tag_epochs: tag_epochs.into(),
        };
        near.insert(ticket, fill, now_ms);
    }

    /// The embedded store keeps a fresh value it handed out decoded, for the quick hit (so
    /// only for a call without XFetch, which the caller checks). `epochs` names the epochs
    /// that judge it (`None`: they cannot be named, and it is not kept).
    pub(crate) fn keep_decoded<'e, T: Clone + Send + Sync + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &Blob,
        entry: &StoredEntry<T>,
        epochs: impl FnOnce() -> Option<Vec<Cow<'e, str>>>,
    ) {
        let (Some(memory), Blob::Shared(shared), Ok(value)) = (&self.memory, bytes, &entry.value)
        else {
            return;
        };
        // A throttled copy is a fallback, never a hit: it is not kept for the hit path.
        if entry.throttled || entry.fresh_until_ms <= memory.now_ms() {
            return;
        }
        let Some(epochs) = epochs() else {
            return;
        };
        let epochs = epochs.into_iter().map(Cow::into_owned).collect();
        memory.keep_decoded(
            keys,
            shared,
            value,
            entry.fresh_until_ms,
            entry.born,
            epochs,
        );
    }
}

/// What one read of a key found, for the near tier: the ticket taken before it, the entry
/// decoded, its encoded length and the epochs read with it.
pub(crate) struct Read<'r, T> {
    pub(crate) ticket: Option<Ticket>,
    pub(crate) keys: &'r EntryKeys,
    pub(crate) entry: &'r StoredEntry<T>,
    pub(crate) len: usize,
    pub(crate) epochs: &'r Epochs,
}
