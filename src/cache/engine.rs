//! The engine behind the [`Cache`](crate::Cache) handle: what every call of a cache shares
//! ([`Core`]: the store, the codec, the in-process flights and refreshes, the tiers, the
//! counters, the recovery queue) and a handle's own options and tags ([`Engine`]). The handle
//! holds an `Engine` and nothing else; the machinery is written against this type.

use std::sync::Arc;

use crate::cache::near::NearTier;
use crate::cache::recovery::Recovery;
use crate::cache::refreshes::Refreshes;
use crate::cache::tags::{TagMemory, Tagging};
use crate::cache::tiers::Tiers;
use crate::stats::Counters;
use crate::store::breaker::Breaker;
use crate::store::{LockStore, Probed, Store, StoreError};
use crate::wait::flight::Flights;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{CallOptions, Error, Fetched, Lock, Stats};

/// One handle's view of the engine: the shared [`Core`], and the options and tags its calls use
/// (per handle, so that `Cache::with_options` is free and does not touch other handles).
pub(crate) struct Engine<C> {
    pub(crate) core: Arc<Core<C>>,
    pub(crate) options: CallOptions,
    /// The epochs this handle's reads ask for, from its namespace and its options' tags.
    pub(crate) tagging: Tagging,
}

/// What every handle of one cache shares.
pub(crate) struct Core<C> {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) codec: C,
    pub(crate) namespace: String,
    /// In-process single flight of computations.
    pub(crate) flights: Flights,
    /// Background refreshes running in this process, so a key is refreshed once at a time.
    pub(crate) refreshes: Arc<Refreshes>,
    /// The tags of values read before (asked for with the next read of their keys), and the
    /// highest epoch this process has read or raised.
    pub(crate) tags: TagMemory,
    /// What the cache did, for `Cache::stats` and the `metrics` facade.
    pub(crate) counters: Arc<Counters>,
    /// The near tier and the embedded store, as the builder made them. The near tier's feed
    /// task holds it weakly, so dropping the last handle stops the feed.
    /// `None`: neither a near tier nor the embedded store.
    pub(crate) tiers: Option<Tiers>,
    /// The circuit breaker the builder put in front of Redis, for the health report.
    pub(crate) breaker: Option<Arc<Breaker>>,
    /// The auto-recovery queue, if the builder was given one. It is the drop guard of its
    /// background task: dropping the last handle stops it.
    pub(crate) recovery: Option<Recovery>,
    /// What the Redis server allows, as last probed; `None` for the embedded store and a
    /// cluster (see `store::redis::capabilities`).
    pub(crate) capabilities: Option<Arc<Probed>>,
}

/// The parts the builder chose, from which an engine is made.
pub(crate) struct Parts<C> {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) codec: C,
    pub(crate) namespace: String,
    pub(crate) options: CallOptions,
    /// `None`: neither a near tier nor the embedded store.
    pub(crate) tiers: Option<Tiers>,
    pub(crate) breaker: Option<Arc<Breaker>>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) recovery: Option<Recovery>,
    pub(crate) capabilities: Option<Arc<Probed>>,
}

impl<C> Core<C> {
    /// The near tier, if the cache has one.
    pub(crate) fn near(&self) -> Option<&NearTier> {
        self.tiers.as_ref()?.near()
    }

    /// This instance wrote the entry of `keys` (or tried: a failed write may have been
    /// applied): its own near copy goes now, without waiting for the announcement to come back
    /// (read-your-writes within the instance), and a flight of the key that began before the
    /// write is not joined by the calls after it (see `Flights::detach`).
    pub(crate) fn wrote(&self, keys: &EntryKeys) {
        if let Some(tiers) = &self.tiers {
            tiers.forget(keys);
        }
        self.flights.detach(&keys.value);
    }
}

impl<C> Clone for Engine<C> {
    fn clone(&self) -> Self {
        Engine {
            core: Arc::clone(&self.core),
            options: self.options.clone(),
            tagging: self.tagging.clone(),
        }
    }
}

impl<C> Engine<C> {
    pub(crate) fn new(parts: Parts<C>) -> Self {
        let Parts {
            store,
            codec,
            namespace,
            options,
            tiers,
            breaker,
            counters,
            recovery,
            capabilities,
        } = parts;
        Engine {
            tagging: Tagging::new(&namespace, &options),
            core: Arc::new(Core {
                store,
                codec,
                namespace,
                flights: Flights::default(),
                refreshes: Arc::default(),
                tags: TagMemory::default(),
                counters,
                tiers,
                breaker,
                recovery,
                capabilities,
            }),
            options,
        }
    }

    /// The same engine, for calls that use `options`.
    pub(crate) fn with_options(&self, options: CallOptions) -> Self {
        Engine {
            tagging: Tagging::new(&self.core.namespace, &options),
            core: Arc::clone(&self.core),
            options,
        }
    }
}

impl<C: Codec> Engine<C> {
    /// What the cache has done, with the near tier's tracking mode.
    pub(crate) fn stats(&self) -> Stats {
        let mut stats = self.core.counters.snapshot();
        if let Some(near) = self.core.near() {
            stats.near_tracking = near.tracking();
        }
        stats
    }

    /// The distributed lock `name` of this namespace, on the cache's store and options.
    pub(crate) fn lock(&self, name: &str) -> Result<Lock, Error> {
        let keys = EntryKeys::new(&self.core.namespace, name)?;
        Ok(Lock::from_parts(
            Arc::clone(&self.core.store) as Arc<dyn LockStore>,
            keys,
            self.options.clone(),
        ))
    }
}

/// The tiers, as a call of this handle uses them: with its XFetch setting, its fail-safe
/// window and its tags, and the store's clock.
impl<C: Codec> Engine<C> {
    /// The tiers this handle's reads may be answered from: none when it skips the near tier
    /// ([`CallOptions::skip_near_cache`]). Every read asks here before it takes a copy (the
    /// quick hit, a near copy, a held copy, `get`'s near read), so the option holds on every
    /// path; fills and forgets go to `core.tiers` either way, keeping the copies current.
    pub(crate) fn read_tiers(&self) -> Option<&Tiers> {
        // Without a near tier the tiers hold the embedded store's decoded values, current by
        // construction; skipping them too only sends those hits the long way.
        (self.core.tiers.as_ref()).filter(|_| !self.options.skip_near_cache)
    }

    /// A near copy held while the backend is down, for a read that failed with `error`.
    pub(crate) fn held_copy<T: Clone + 'static>(
        &self,
        key: &str,
        error: &StoreError,
    ) -> Option<Fetched<T>> {
        self.read_tiers()?
            .held_copy(key, error, self.options.fail_safe_for)
    }
}
