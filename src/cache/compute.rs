//! The machinery behind the `get_or_compute` family: the hit path, the in-process single flight,
//! read-or-lock and waiting, computing under the lock, and encoding what is stored.
//!
//! Explained in the guide: `docs/how-it-works.md` (the protocol and its round trips).

use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;
use tracing::Instrument;

use crate::cache::claim::{Claim, Start};
use crate::cache::entry::StoredEntry;
use crate::cache::failsafe::{Kept, Sorted};
use crate::cache::freshness::{judge, unit_draw, Verdict};
use crate::cache::near::Ticket;
use crate::lock::lease::HeldLock;
use crate::options::later_by;
use crate::stats::Event;
use crate::store::{Blob, Store, Stored, Write};
use crate::wait::flight::{Follower, Role};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Cache, Computed, Error, Fallback, Fetched, Lease, Source};

/// What a computation that fails does with the lock and the value it was to replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// The fail-safe: write a throttled copy of the kept value (these are its stored bytes),
    /// fenced, and let the lock go.
    Throttle(Vec<u8>),
    /// Remember the failure for the negative TTL if one is set; else let the lock go.
    Remember,
    /// Let the lock go; the current value stays (a failed refresh that serves stale on error).
    Release,
    /// Delete the current value, fenced, and let the lock go, in one step: only if nobody wrote,
    /// set or invalidated since the lock was taken, so a newer value is never deleted.
    Delete,
}

/// How a stored entry is served ([`Cache::judge_entry`]).
pub(crate) enum Judged<T> {
    /// As it is.
    Served(Result<Fetched<T>, Error>),
    /// With a background refresh of the entry written under this fence.
    Refresh(Fetched<T>, u64),
}

/// A spawned computation owned by its caller: aborted when the caller goes away (its lock is
/// then freed by the lock's own drop guard), unless detached at the caller's soft timeout, after
/// which it runs to the end (or to its hard timeout) on its own.
pub(crate) struct Detachable<R> {
    pub(crate) handle: tokio::task::JoinHandle<R>,
    detached: bool,
}

impl<R: Send + 'static> Detachable<R> {
    pub(crate) fn spawn(work: impl Future<Output = R> + Send + 'static) -> Self {
        Detachable {
            // In the caller's span, which it outlives once detached.
            handle: tokio::spawn(work.in_current_span()),
            detached: false,
        }
    }

    pub(crate) fn detach(&mut self) {
        self.detached = true;
    }
}

impl<R> Drop for Detachable<R> {
    fn drop(&mut self) {
        if !self.detached {
            self.handle.abort();
        }
    }
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
            .and_then(|near| near.ticket(&keys.user));

        // The hit path: one GET, no script, no in-process bookkeeping. A value past its stale
        // window is not a hit: it goes on to the lock, taken over it.
        let mut start = Start::Read;
        match self.inner.store.get(&keys).await {
            Ok(Some(bytes)) => {
                if let Some(entry) = self.read_stored::<T>(&keys, &bytes) {
                    match self.sort(entry) {
                        Sorted::Serve(entry) => {
                            self.remember_near(ticket, &keys, &entry, bytes.len());
                            self.keep_decoded(&keys, &bytes, &entry);
                            return self.serve(entry, keys, ttl, f, Source::Hit);
                        }
                        Sorted::Past(_) => start = Start::Replace,
                    }
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
                Role::Follow(follower) => match self.follow(follower, &keys, started).await {
                    Some(outcome) => return outcome,
                    // The leader was cancelled or panicked: try to lead.
                    None => continue,
                },
            }
        };
        let outcome = self.load(&keys, ttl, started, f, start).await;
        if let Some(leader) = leader {
            leader.finish(&outcome);
        }
        outcome
    }

    /// Puts what a read found into the near tier, if there is one: never a fail-safe copy,
    /// which is a fallback only (a value past its fresh-until the tier refuses by itself).
    pub(crate) fn remember_near<T: Clone + Send + Sync + 'static>(
        &self,
        ticket: Option<Ticket>,
        keys: &EntryKeys,
        entry: &StoredEntry<T>,
        len: usize,
    ) {
        if let (Some(near), Some(ticket), Ok(value), false) =
            (&self.inner.near, ticket, &entry.value, entry.throttled)
        {
            near.insert(
                ticket,
                &keys.user,
                value,
                entry.fence,
                entry.fresh_until_ms,
                entry.compute_ms,
                len,
                self.inner.store.now_ms(),
            );
        }
    }

    /// Waits for this process's leader of the key: its outcome, or `None` if it went away
    /// without one. Bounded by the wait bound, and with the fail-safe by the soft timeout, when
    /// the key is read again for a fallback.
    pub(crate) async fn follow<T>(
        &self,
        follower: Follower<Fetched<T>>,
        keys: &EntryKeys,
        started: Instant,
    ) -> Option<Result<Fetched<T>, Error>>
    where
        T: DeserializeOwned + Clone + Send + Sync + 'static,
    {
        let bound = later_by(started, self.options.wait_timeout);
        let outcome = follower.outcome();
        tokio::pin!(outcome);
        if let Some(soft) = self.soft_deadline(started).filter(|soft| *soft < bound) {
            if let Ok(outcome) = tokio::time::timeout_at(soft, &mut outcome).await {
                return outcome.map(|outcome| outcome.map(waited));
            }
            if let Some(Err(kept)) = self.look_again::<T>(keys).await {
                self.inner.counters.record(Event::SoftTimeout);
                return Some(Ok(self.serve_fallback(kept.value)));
            }
        }
        match tokio::time::timeout_at(bound, outcome).await {
            Ok(outcome) => outcome.map(|outcome| outcome.map(waited)),
            Err(_) => {
                let error = Error::WaitTimeout {
                    key: keys.user.clone(),
                    waited: started.elapsed(),
                };
                let kept = match self.look_again::<T>(keys).await {
                    Some(Err(kept)) => Some(kept),
                    _ => None,
                };
                Some(self.fall_back(error, kept, keys))
            }
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
    fn keep_decoded<T: Clone + Send + Sync + 'static>(
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
            memory.keep_decoded(keys, shared, value, entry.fresh_until_ms);
        }
    }

    /// Serves a stored entry: a remembered failure as its error; a throttled fail-safe copy as
    /// the fallback; a value, starting a background refresh when it is stale or XFetch says so.
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
        match self.judge_entry(entry, &keys.user, fresh) {
            Judged::Served(outcome) => outcome,
            Judged::Refresh(served, fence) => {
                self.refresh_in_background(keys, ttl, f, fence);
                Ok(served)
            }
        }
    }

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
        let verdict = judge(
            self.inner.store.now_ms(),
            entry.fresh_until_ms,
            entry.compute_ms,
            beta,
            draw,
        );
        let served = |source| Fetched { value, source };
        match verdict {
            Verdict::Fresh => Judged::Served(Ok(served(fresh))),
            Verdict::RefreshEarly => Judged::Refresh(served(fresh), entry.fence),
            Verdict::Stale => Judged::Refresh(served(Source::Stale), entry.fence),
        }
    }

    /// The distributed part: read the value or take the lock; compute under it, or wait for the
    /// holder and read again. `start` says what the call has seen already (a value past its
    /// stale window, or the lock held).
    async fn load<T, E, F, Fut>(
        &self,
        keys: &Arc<EntryKeys>,
        ttl: Duration,
        started: Instant,
        f: F,
        start: Start,
    ) -> Result<Fetched<T>, Error>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        match self.claim::<T>(keys, started, start).await {
            Claim::Found(entry, found) => self.serve(entry, (**keys).clone(), ttl, f, found),
            Claim::Locked(held, kept) => {
                self.compute_within(held, keys, ttl, f, kept, started).await
            }
            Claim::Fallback(value) => Ok(self.serve_fallback(value)),
            Claim::Failed(e) => Err(e),
            Claim::Backend(e) => self.without_cache("read-or-lock", e, keys, f).await,
        }
    }

    /// Computes under `held`, as the caller that took the lock, and answers with the value or,
    /// with the fail-safe, the fallback `kept` when the computation fails or hits its hard
    /// timeout. With a fallback and a soft timeout, the computation runs in a task of its own:
    /// at the soft timeout the caller answers with the fallback while the computation goes on
    /// under its lock and heartbeat and lands as usual. That task is aborted if the caller goes
    /// away before (a dropped call frees its lock, as an inline computation does).
    async fn compute_within<T, E, F, Fut>(
        &self,
        held: HeldLock,
        keys: &Arc<EntryKeys>,
        ttl: Duration,
        f: F,
        kept: Option<Kept<T>>,
        started: Instant,
    ) -> Result<Fetched<T>, Error>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
        E: Display + Debug + Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        let computed = |value| Fetched {
            value,
            source: Source::Computed,
        };
        let on_failure = match &kept {
            Some(kept) => OnFailure::Throttle(kept.bytes.clone()),
            None => OnFailure::Remember,
        };
        let soft = self.soft_deadline(started);
        let (kept, soft) = match (kept, soft) {
            (Some(kept), Some(soft)) => (kept, soft),
            (kept, _) => {
                let outcome = self.compute_and_store(held, keys, ttl, f, on_failure).await;
                return outcome
                    .map(computed)
                    .or_else(|e| self.fall_back(e, kept, keys));
            }
        };
        let cache = self.clone();
        let task_keys = Arc::clone(keys);
        let mut task = Detachable::spawn(async move {
            cache
                .compute_and_store(held, &task_keys, ttl, f, on_failure)
                .await
        });
        tokio::select! {
            // The value, if it is there at the soft timeout too.
            biased;
            joined = &mut task.handle => match joined {
                Ok(outcome) => outcome.map(computed).or_else(|e| self.fall_back(e, Some(kept), keys)),
                Err(e) => match e.try_into_panic() {
                    // A panic in `f` reaches its caller, as when it runs inline.
                    Ok(panic) => std::panic::resume_unwind(panic),
                    // Cancelled by the runtime shutting down.
                    Err(_) => Ok(self.serve_fallback(kept.value)),
                },
            },
            () = tokio::time::sleep_until(soft) => {
                task.detach();
                self.inner.counters.record(Event::SoftTimeout);
                tracing::debug!(key = %keys.user,
                    "soft timeout: serving the fail-safe value while the computation goes on");
                Ok(self.serve_fallback(kept.value))
            }
        }
    }

    /// Runs `f` under `held`, writes its value if the fencing token is still current, and lets
    /// the lock go; a failure is handled as `on_failure` says (also fenced). The hard timeout
    /// ([`max_hold`](crate::CallOptions::max_hold)) cancels `f` (its future is dropped) and is
    /// handled as a failure, except that it is never remembered as one.
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
        let run = f(held.lease());
        let ran = match self.options.max_hold {
            Some(hold) => tokio::time::timeout_at(later_by(computing, hold), run)
                .await
                .ok(),
            None => Some(run.await),
        };
        let computed = match ran {
            Some(Ok(computed)) => computed,
            Some(Err(e)) => {
                self.after_failure::<T, E>(held, keys, on_failure, Some(&e))
                    .await;
                return Err(Error::compute(e));
            }
            None => {
                let after = computing.elapsed();
                self.inner.counters.record(Event::HardTimeout);
                tracing::warn!(key = %keys.user, ?after,
                    "hard timeout: the computation is cancelled and its lock freed");
                self.after_failure::<T, E>(held, keys, on_failure, None)
                    .await;
                return Err(Error::ComputeTimeout {
                    key: keys.user.clone(),
                    after,
                });
            }
        };
        self.store_computed(held, keys, ttl, computed, computing.elapsed())
            .await
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
            ttl: self.options.stored_for(ttl),
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

    /// Lets the lock go after the computation under it failed with `error`, or hit its hard
    /// timeout (`None`), doing with the value it was to replace what `on_failure` says; fenced
    /// by the lock's token, in one step with the release.
    pub(crate) async fn after_failure<T: DeserializeOwned + 'static, E: Display>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        on_failure: OnFailure,
        error: Option<&E>,
    ) {
        let store = self.inner.store.as_ref();
        let released = match (on_failure, self.options.negative_ttl, error) {
            // The fail-safe: the kept value stays, as a throttled copy (this wins over negative
            // caching, which would replace the fallback with the error).
            (OnFailure::Throttle(kept), _, _) => match self.throttled_copy(&kept, held.fence()) {
                Some(write) => held
                    .store_and_unlock(store, write)
                    .await
                    .map(|stored| stored.released),
                None => held.release().await,
            },
            (OnFailure::Remember, Some(negative_ttl), Some(e)) => {
                let bytes = self.encode_failure::<T, E>(e, negative_ttl, held.fence());
                let write = Write::Value {
                    bytes,
                    ttl: negative_ttl,
                };
                held.store_and_unlock(store, write).await.map(|_| true)
            }
            (OnFailure::Delete, _, _) => held
                .store_and_unlock(store, Write::Delete)
                .await
                .map(|stored| stored.released),
            (OnFailure::Remember | OnFailure::Release, _, _) => held.release().await,
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
}

/// What an in-process follower reports: the leader's computation is, for it, a wait.
pub(crate) fn waited<T>(fetched: Fetched<T>) -> Fetched<T> {
    let source = match fetched.source {
        Source::Computed => Source::Waited,
        other => other,
    };
    Fetched { source, ..fetched }
}
