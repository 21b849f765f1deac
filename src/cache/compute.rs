//! The machinery behind the `get_or_compute` family: the hit path, the in-process single flight,
//! read-or-lock and waiting, computing under the lock, and encoding what is stored.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use crate::cache::freshness::{judge, unit_draw, Verdict};
use crate::cache::near::Ticket;
use crate::lock::lease::Renewal;
use crate::lock::lease::{Acquiring, HeldLock};
use crate::options::add;
use crate::stats::Event;
use crate::store::{LockStore, ReadOrLock, Stored, Write};
use crate::wait::flight::Role;
use crate::wait::waiting::{Waiter, Wake};
use crate::wire::codec::Codec;
use crate::wire::envelope::Envelope;
use crate::wire::key::EntryKeys;
use crate::wire::shape;
use crate::{Cache, Computed, Error, Fallback, Fetched, Lease, Source, MAX_VALUE_BYTES};

/// What a computation that fails does with the lock and the value it was to replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// Remember the failure for the negative TTL if one is set; else let the lock go.
    Remember,
    /// Let the lock go; the current value stays (a failed refresh that serves stale on error).
    Release,
    /// Delete the current value, fenced, and let the lock go, in one step: only if nobody wrote,
    /// set or invalidated since the lock was taken, so a newer value is never deleted.
    Delete,
}

/// A stored entry, decoded: a value, or a remembered failure's message.
pub(crate) struct StoredEntry<T> {
    pub value: Result<T, String>,
    pub fresh_until_ms: u64,
    pub compute_ms: u32,
    /// The fencing token of the write, to tell whether it was replaced since it was read.
    pub fence: u64,
}

impl<C: Codec> Cache<C> {
    pub(crate) async fn fetch_entry<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        // The near tier with XFetch on: a fresh copy is served through `serve`, which draws as
        // for a Redis hit (without XFetch, `fetch` answered near hits before coming here).
        if self.options.early_refresh_beta > 0.0 {
            if let Some(entry) = self.near_copy::<T>(key) {
                let keys = EntryKeys::new(&self.inner.namespace, key)?;
                return self.serve(entry, keys, ttl, f, Source::Hit);
            }
        }

        let keys = EntryKeys::new(&self.inner.namespace, key)?;
        self.clock_ready().await;

        // Otherwise a ticket is taken before the read, for its answer to go into the near tier.
        let ticket = self
            .inner
            .near
            .as_ref()
            .and_then(|near| near.ticket(&keys.value));

        // The hit path: one GET, no script, no in-process bookkeeping.
        match self.inner.store.get(&keys).await {
            Ok(Some(bytes)) => {
                if let Some(entry) = self.read_stored::<T>(&keys, &bytes) {
                    self.keep_near(ticket, &keys, &entry, bytes.len());
                    return self.serve(entry, keys, ttl, f, Source::Hit);
                }
            }
            Ok(None) => {}
            Err(e) if self.options.on_backend_error == Fallback::Fail => {
                return Err(Error::backend("get", e));
            }
            // The fallback applies in `load`, under the single flight.
            Err(_) => {}
        }

        let started = Instant::now();
        let keys = Arc::new(keys);
        let leader = loop {
            match self.inner.flights.join::<Fetched<T>, E>(&keys.value) {
                Role::Lead(leader) => break Some(leader),
                Role::Alone => break None,
                Role::Follow(follower) => {
                    let remaining = self.options.wait_timeout.saturating_sub(started.elapsed());
                    match tokio::time::timeout(remaining, follower.outcome()).await {
                        Ok(Some(outcome)) => return outcome.map(waited),
                        // The leader was cancelled or panicked: try to lead.
                        Ok(None) => continue,
                        Err(_) => {
                            return Err(Error::WaitTimeout {
                                key: keys.user.clone(),
                                waited: started.elapsed(),
                            })
                        }
                    }
                }
            }
        };
        let outcome = self.load(&keys, ttl, started, f).await;
        if let Some(leader) = leader {
            leader.finish(&outcome);
        }
        outcome
    }

    /// A fresh near copy of `key` as a `T`, if there is a near tier and it may serve. Its clock
    /// is calibrated before any copy goes in, so an uncalibrated one means no copy.
    pub(crate) fn near_copy<T: Clone + 'static>(&self, key: &str) -> Option<StoredEntry<T>> {
        let near = self.inner.near.as_ref()?;
        let store = &self.inner.store;
        if !store.clock_synced() {
            return None;
        }
        near.get_by_user_key::<T>(&self.inner.namespace, key, store.now_ms())
    }

    /// Puts a value read from the store into the near tier, if there is one and `ticket` (taken
    /// before the read was sent) proves no announcement of the key came since.
    pub(crate) fn keep_near<T: Clone + Send + Sync + 'static>(
        &self,
        ticket: Option<Ticket>,
        keys: &EntryKeys,
        entry: &StoredEntry<T>,
        size: usize,
    ) {
        if let (Some(near), Some(ticket), Ok(value)) = (&self.inner.near, ticket, &entry.value) {
            near.insert(
                ticket,
                &keys.value,
                value,
                entry.fence,
                entry.fresh_until_ms,
                entry.compute_ms,
                size,
                self.inner.store.now_ms(),
            );
        }
    }

    /// The value of a fresh near copy of `key`, when a hit needs nothing more: no XFetch
    /// draw (then the copy, fresh, is simply served).
    pub(crate) fn near_hit<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        if self.inner.near.is_none() || self.options.early_refresh_beta > 0.0 {
            return None;
        }
        self.near_copy::<T>(key).and_then(|entry| entry.value.ok())
    }

    /// Serves a stored entry: a remembered failure as its error; a value, starting a background
    /// refresh when it is stale or XFetch says so.
    pub(crate) fn serve<T, E, F, Fut>(
        &self,
        entry: StoredEntry<T>,
        keys: EntryKeys,
        ttl: Duration,
        f: F,
        fresh: Source,
    ) -> Result<Fetched<T>, Error>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        let value = match entry.value {
            Ok(value) => value,
            Err(message) => {
                return Err(Error::RecentFailure {
                    key: keys.user,
                    message,
                })
            }
        };
        let beta = self.options.early_refresh_beta;
        // Draw only when XFetch is on: the hit path stays free of the random number generator.
        let draw = if beta > 0.0 { unit_draw() } else { 1.0 };
        let verdict = judge(
            self.inner.store.now_ms(),
            entry.fresh_until_ms,
            entry.compute_ms,
            beta,
            draw,
        );
        let source = match verdict {
            Verdict::Fresh => fresh,
            Verdict::RefreshEarly => {
                self.refresh_in_background(keys, ttl, f, entry.fence);
                fresh
            }
            Verdict::Stale => {
                self.refresh_in_background(keys, ttl, f, entry.fence);
                Source::Stale
            }
        };
        Ok(Fetched { value, source })
    }

    /// The distributed part: read the value or take the lock; compute under it, or wait for the
    /// holder and read again.
    async fn load<T, E, F, Fut>(
        &self,
        keys: &Arc<EntryKeys>,
        ttl: Duration,
        started: Instant,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        let store = &self.inner.store;
        let options = &self.options;
        let mut acquiring = Acquiring::new(
            Arc::clone(store) as Arc<dyn LockStore>,
            Arc::clone(keys),
            self.renewal(),
        );
        let token = acquiring.token();
        let mut waiter = Waiter::new(store.as_ref(), keys, options, started);
        let mut found = Source::Hit;
        // Cleared after bytes that do not decode: then the lock is taken over them, to replace them.
        let mut read_value = true;
        // After a wait, a plain GET looks first: the value has usually landed, and a GET is cheaper
        // for the server than the read-or-lock script.
        let mut look_first = false;
        loop {
            if look_first {
                if let Some(entry) = self.look(keys).await {
                    return self.serve(entry, (**keys).clone(), ttl, f, found);
                }
            }
            let asked = acquiring.sending();
            let answer = match store
                .read_or_lock(keys, &token, options.lease, read_value)
                .await
            {
                Ok(answer) => answer,
                Err(e) => {
                    // The request may have been granted anyway: free it before computing uncached.
                    acquiring.failed(&e);
                    drop(acquiring);
                    return self.without_cache("read-or-lock", e, keys, f).await;
                }
            };
            if !matches!(answer, ReadOrLock::Acquired { .. }) {
                acquiring.refused();
            }
            match answer {
                ReadOrLock::Value(bytes) => match self.read_stored::<T>(keys, &bytes) {
                    Some(entry) => return self.serve(entry, (**keys).clone(), ttl, f, found),
                    None => {
                        read_value = false;
                        look_first = false;
                    }
                },
                ReadOrLock::Acquired { fence } => {
                    let held = acquiring.granted(fence, asked);
                    let value = self
                        .compute_and_store(held, keys, ttl, f, OnFailure::Remember)
                        .await?;
                    return Ok(Fetched {
                        value,
                        source: Source::Computed,
                    });
                }
                ReadOrLock::Held { expires_in } => {
                    read_value = true;
                    found = Source::Waited;
                    if waiter.wait(expires_in).await? == Wake::Subscribed {
                        // Listening now: a value that landed before is read here, a later one
                        // wakes us. The lock was just seen held, so wait rather than retry it.
                        if let Some(entry) = self.look(keys).await {
                            return self.serve(entry, (**keys).clone(), ttl, f, found);
                        }
                        waiter.wait(expires_in).await?;
                    }
                    look_first = true;
                }
            }
        }
    }

    /// A plain read of the value; errors and unreadable bytes count as nothing found (the
    /// read-or-lock that follows reports the former and replaces the latter).
    pub(crate) async fn look<T: DeserializeOwned + 'static>(
        &self,
        keys: &EntryKeys,
    ) -> Option<StoredEntry<T>> {
        match self.inner.store.get(keys).await {
            Ok(Some(bytes)) => self.read_stored(keys, &bytes),
            Ok(None) | Err(_) => None,
        }
    }

    /// Runs `f` under `held`, writes its value if the fencing token is still current, and lets
    /// the lock go; a failure is handled as `on_failure` says (also fenced).
    pub(crate) async fn compute_and_store<T, E, F, Fut>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        ttl: Duration,
        f: F,
        on_failure: OnFailure,
    ) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<Computed<T>, E>>,
    {
        let computing = Instant::now();
        self.inner.counters.record(Event::Compute);
        match f(held.lease()).await {
            Ok(computed) => {
                self.store_computed(held, keys, ttl, computed, computing.elapsed())
                    .await
            }
            Err(e) => {
                self.after_failure::<T, E>(held, keys, &e, on_failure).await;
                Err(Error::compute(e))
            }
        }
    }

    /// The success half of [`compute_and_store`](Self::compute_and_store), per key (a batch
    /// calls it for each key its computation returned): writes the value if the fencing token
    /// is still current and lets the lock go; the value is returned either way.
    pub(crate) async fn store_computed<T>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        ttl: Duration,
        computed: Computed<T>,
        took: Duration,
    ) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let ttl = computed.ttl.unwrap_or(ttl);
        let bytes = match self.encode_value(&computed.value, ttl, took, held.fence()) {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = held.release().await;
                return Err(e);
            }
        };
        let write = Write::Value {
            bytes,
            ttl: add(ttl, self.options.stale_for),
        };
        match held
            .store_and_unlock(self.inner.store.as_ref(), write)
            .await
        {
            Ok(Stored { written: true, .. }) => {}
            Ok(Stored { written: false, .. }) => tracing::info!(key = %keys.user,
                "computed value not written: the key was invalidated, set, or taken over since the lock was acquired"),
            Err(e) => tracing::warn!(key = %keys.user, error = %e,
                "computed value not written: the backend failed; returning it uncached"),
        }
        Ok(computed.value)
    }

    /// The failure half of [`compute_and_store`](Self::compute_and_store), per key (a batch
    /// calls it for each key of a failed computation): remembers the failure, deletes the value
    /// or just lets the lock go, as `on_failure` says, fenced.
    pub(crate) async fn after_failure<T, E>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        error: &E,
        on_failure: OnFailure,
    ) where
        T: DeserializeOwned + 'static,
        E: Display,
    {
        let store = self.inner.store.as_ref();
        let released = match (on_failure, self.options.negative_ttl) {
            (OnFailure::Remember, Some(negative_ttl)) => {
                let bytes = self.encode_failure::<T, E>(error, negative_ttl, held.fence());
                let write = Write::Value {
                    bytes,
                    ttl: negative_ttl,
                };
                held.store_and_unlock(store, write).await.map(|_| true)
            }
            (OnFailure::Delete, _) => held
                .store_and_unlock(store, Write::Delete)
                .await
                .map(|stored| stored.released),
            (OnFailure::Remember | OnFailure::Release, _) => held.release().await,
        };
        if let Err(err) = released {
            tracing::warn!(key = %keys.user, error = %err,
                "could not free the lock after a failed computation; it frees itself when its lease runs out");
        }
    }

    /// Freshness is stamped and judged by the store's clock: calibrate it before the first use
    /// (once per cache; after that, an atomic load).
    pub(crate) async fn clock_ready(&self) {
        let store = &self.inner.store;
        if !store.clock_synced() {
            store.sync_clock().await;
        }
    }

    /// How this cache's locks are renewed: the handle's options, counted in its stats.
    pub(crate) fn renewal(&self) -> Renewal {
        Renewal {
            counters: Some(Arc::clone(&self.inner.counters)),
            ..self.options.renewal()
        }
    }

    /// The backend failed during `op`: fail, or compute without the cache, as configured.
    async fn without_cache<T, E, F, Fut>(
        &self,
        op: &'static str,
        error: crate::store::StoreError,
        keys: &EntryKeys,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<Computed<T>, E>>,
    {
        match self.options.on_backend_error {
            Fallback::Fail => Err(Error::backend(op, error)),
            Fallback::ComputeUncached => {
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

    /// The stored bytes of a value fresh for `ttl` from now, marked with the shape of `T`.
    pub(crate) fn encode_value<T: Serialize + DeserializeOwned + 'static>(
        &self,
        value: &T,
        ttl: Duration,
        compute: Duration,
        fence: u64,
    ) -> Result<Vec<u8>, Error> {
        let codec = &self.inner.codec;
        let payload = codec
            .encode(value)
            .map_err(|e| Error::Encode(Arc::from(e)))?;
        if payload.len() > MAX_VALUE_BYTES {
            return Err(Error::ValueTooLarge {
                size: payload.len(),
                limit: MAX_VALUE_BYTES,
            });
        }
        Ok(Envelope {
            codec: codec.id(),
            negative: false,
            fresh_until_ms: self.fresh_until(ttl),
            compute_ms: u32::try_from(compute.as_millis()).unwrap_or(u32::MAX),
            fence,
            shape: shape::fingerprint::<T>(),
            payload: &payload,
        }
        .encode())
    }

    /// The stored bytes of a remembered failure: its message, for `ttl`. It is marked with the
    /// shape of `T` like a value, so that a caller of another type recomputes rather than
    /// take another type's failure for its own.
    fn encode_failure<T: DeserializeOwned + 'static, E: Display>(
        &self,
        error: &E,
        ttl: Duration,
        fence: u64,
    ) -> Vec<u8> {
        let message = error.to_string();
        Envelope {
            codec: self.inner.codec.id(),
            negative: true,
            fresh_until_ms: self.fresh_until(ttl),
            compute_ms: 0,
            fence,
            shape: shape::fingerprint::<T>(),
            payload: message.as_bytes(),
        }
        .encode()
    }

    fn fresh_until(&self, ttl: Duration) -> u64 {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.inner.store.now_ms().saturating_add(ttl_ms)
    }

    /// Bytes that are not ours are a miss: logged, then recomputed and overwritten. So is a
    /// value written for another shape of `T` (another deploy's version of the type): decoding
    /// it could succeed and give garbage (bincode is positional).
    pub(crate) fn read_stored<T: DeserializeOwned + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &[u8],
    ) -> Option<StoredEntry<T>> {
        let codec = &self.inner.codec;
        let envelope = match Envelope::decode(bytes, codec.id()) {
            Ok(envelope) => envelope,
            Err(foreign) => {
                tracing::warn!(key = %keys.user, reason = %foreign, "unreadable bytes under the key; treating as a miss");
                return None;
            }
        };
        // A compare of two numbers: the shape of `T` was traced on its first use, not here.
        if envelope.shape != shape::fingerprint::<T>() {
            tracing::warn!(key = %keys.user, r#type = std::any::type_name::<T>(),
                "value written for another shape of the type (fields or variants renamed, reordered, added, removed or retyped: another deploy?); treating as a miss");
            return None;
        }
        let value = if envelope.negative {
            Err(String::from_utf8_lossy(envelope.payload).into_owned())
        } else {
            match codec.decode(envelope.payload) {
                Ok(value) => Ok(value),
                Err(e) => {
                    tracing::warn!(key = %keys.user, error = %e, "value does not decode as the requested type; treating as a miss");
                    return None;
                }
            }
        };
        Some(StoredEntry {
            value,
            fresh_until_ms: envelope.fresh_until_ms,
            compute_ms: envelope.compute_ms,
            fence: envelope.fence,
        })
    }
}

/// What an in-process follower reports: the leader's computation is, for it, a wait.
pub(crate) fn waited<T>(fetched: Fetched<T>) -> Fetched<T> {
    let source = match fetched.source {
        Source::Computed => Source::Waited,
        other => other,
    };
    Fetched { source, ..fetched }
}
