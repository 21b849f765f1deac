//! Computing under the lock: the caller that took a key's lock runs the computation (inline, or
//! in a task it can leave at its soft timeout), writes the value fenced by its token and lets the
//! lock go; a failure or a hard timeout is handled as the call's [`OnFailure`] says.
//!
//! Explained in the guide: `docs/how-it-works.md` (the protocol and its round trips).

use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tracing::Instrument;

use crate::cache::bounds::{CacheValue, ComputeFailure, ComputedFuture};
use crate::cache::engine::Engine;
use crate::cache::failsafe::Kept;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::cache::fetch::KeyCall;
use crate::cache::origin::Origin;
use crate::error::marked_not_shared;
use crate::lock::lease::HeldLock;
use crate::stats::{Event, NotStoredReason};
use crate::store::{Stored, Write};
use crate::time::later_by;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Computed, Error, Fetched, Lease, Source};

/// What a computation that fails does with the lock and the value it was to replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// A fail-safe value is kept (these are its stored bytes): the table (`cache/fallback.rs`)
    /// serves it, and a throttled copy of it is written, fenced, as the lock goes.
    Throttle(Vec<u8>),
    /// No fallback is kept: the failure is remembered for the negative TTL where the table says
    /// so (a failure of `f` with negative caching on); else the lock just goes.
    Remember,
    /// Let the lock go; the current value stays (a failed refresh that serves stale on error).
    Release,
    /// Delete the current value, fenced, and let the lock go, in one step: only if nobody wrote,
    /// set or invalidated since the lock was taken, so a newer value is never deleted.
    Delete,
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
            handle: crate::time::spawn(work.in_current_span()),
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

impl<C: Codec, T: CacheValue, E: ComputeFailure, F, Fut: ComputedFuture<T, E>>
    KeyCall<'_, C, T, E, F>
where
    F: FnOnce(Lease) -> Fut + Send + 'static,
{
    /// Computes under `held`, as the caller that took the lock, and answers with the value or,
    /// with the fail-safe, the fallback `kept` when the computation fails or hits its hard
    /// timeout. With a fallback and a soft timeout, the computation runs in a task of its own:
    /// at the soft timeout the caller answers with the fallback while the computation goes on
    /// under its lock and heartbeat and lands as usual. That task is aborted if the caller goes
    /// away before (a dropped call frees its lock, as an inline computation does).
    pub(crate) async fn compute_within(
        self,
        held: HeldLock,
        kept: Option<Kept<T>>,
    ) -> Result<Fetched<T>, Error> {
        let KeyCall {
            engine,
            keys,
            ttl,
            started,
            f,
            span,
            types: _,
        } = self;
        // The fence this call computes under, on its span; the followers of its flight link to
        // its span (`cache/trace.rs`).
        let fence = held.fence();
        if !span.is_disabled() {
            span.record("fence", fence);
        }
        let origin = Origin::this_call(&span, fence);
        let computed = |(value, stored)| Fetched {
            stored,
            origin,
            ..Fetched::new(value, Source::Computed)
        };
        let on_failure = match &kept {
            Some(kept) => OnFailure::Throttle(kept.bytes.clone()),
            None => OnFailure::Remember,
        };
        let soft = engine.soft_deadline(started);
        let computation = Computation {
            engine: engine.clone(),
            keys: Arc::clone(&keys),
            ttl,
            f,
        };
        // The table serves the kept value at the soft timeout; without one, the call goes on.
        let at_soft = decide(Failure::SoftTimeout, AtHand::kept(kept.is_some()));
        let (kept, soft) = match (kept, soft) {
            (Some(kept), Some(soft)) if at_soft == Answer::ServeKept => (kept, soft),
            (kept, _) => {
                let outcome = computation.compute_and_store(held, on_failure).await;
                return outcome
                    .map(computed)
                    .or_else(|e| engine.fall_back(e, kept, &keys));
            }
        };
        let mut task =
            Detachable::spawn(async move { computation.compute_and_store(held, on_failure).await });
        tokio::select! {
            // The value, if it is there at the soft timeout too.
            biased;
            joined = &mut task.handle => match joined {
                Ok(outcome) => outcome.map(computed).or_else(|e| engine.fall_back(e, Some(kept), &keys)),
                Err(e) => match e.try_into_panic() {
                    // A panic in `f` reaches its caller, as when it runs inline.
                    Ok(panic) => std::panic::resume_unwind(panic),
                    // Cancelled by the runtime shutting down.
                    Err(_) => Ok(engine.serve_fallback(kept.value)),
                },
            },
            () = crate::time::sleep_until(soft) => {
                task.detach();
                engine.core.counters.record(Event::SoftTimeout);
                tracing::debug!(key = %keys.user(),
                    "soft timeout: serving the fail-safe value while the computation goes on");
                Ok(engine.serve_fallback(kept.value))
            }
        }
    }
}

/// One key's computation under its lock, owned (its engine too), so that it can run in a task
/// of its own: past a caller's soft timeout, or as a background refresh.
pub(crate) struct Computation<C, F> {
    pub(crate) engine: Engine<C>,
    pub(crate) keys: Arc<EntryKeys>,
    pub(crate) ttl: Duration,
    pub(crate) f: F,
}

impl<C, F, T, E, Fut> Computation<C, F>
where
    C: Codec,
    T: Serialize + DeserializeOwned + 'static,
    E: ComputeFailure,
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<Computed<T>, E>>,
{
    /// Runs `f` under `held`, writes its value if the fencing token is still current, and lets
    /// the lock go; a failure is handled as `on_failure` says (also fenced). The hard timeout
    /// ([`max_hold`](crate::CallOptions::max_hold)) cancels `f` (its future is dropped) and is
    /// handled as a failure, except that it is never remembered as one.
    pub(crate) async fn compute_and_store(
        self,
        held: HeldLock,
        on_failure: OnFailure,
    ) -> Result<(T, bool), Error> {
        let Computation {
            engine,
            keys,
            ttl,
            f,
        } = self;
        // Born before `f` runs, when or after the lock was granted: an invalidation of its tags
        // that returned before then is older than the value (see `cache/tags.rs`). One server
        // reads the clock in the grant's own script; elsewhere it is a request of its own.
        let born = match held.born() {
            Some(born) => born,
            None => engine.born_now().await,
        };
        let computing = crate::time::now();
        engine.core.counters.record(Event::Compute);
        let run = f(held.lease());
        let ran = match engine.options.max_hold {
            Some(hold) => crate::time::timeout_at(later_by(computing, hold), run)
                .await
                .ok(),
            None => Some(run.await),
        };
        (engine.core.counters).record(Event::ComputeTime(crate::time::since(computing)));
        let computed = match ran {
            Some(Ok(computed)) => computed,
            Some(Err(e)) => {
                engine
                    .after_failure::<T, E>(held, &keys, on_failure, Some(&e), born)
                    .await;
                return Err(Error::compute(e));
            }
            None => {
                let after = crate::time::since(computing);
                engine.core.counters.record(Event::HardTimeout);
                crate::log::throttled!(warn, key = %keys.user(), ?after,
                    "hard timeout: the computation is cancelled and its lock freed");
                engine
                    .after_failure::<T, E>(held, &keys, on_failure, None, born)
                    .await;
                return Err(Error::ComputeTimeout {
                    key: keys.user().to_owned(),
                    after,
                });
            }
        };
        let took = (crate::time::since(computing), born);
        (engine.store_computed(held, &keys, ttl, computed, took)).await
    }
}

impl<C: Codec> Engine<C> {
    /// The success half of [`compute_and_store`](Self::compute_and_store), per key (a batch
    /// calls it for each key its computation returned): writes the value if the fencing token
    /// is still current and lets the lock go; the value is returned either way (with whether it
    /// was written), unless its tags
    /// are refused. `took` is how long the computation ran, `born` when it started.
    pub(crate) async fn store_computed<T>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        ttl: Duration,
        computed: Computed<T>,
        (took, born): (Duration, u64),
    ) -> Result<(T, bool), Error>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let ttl = computed.ttl.unwrap_or(ttl);
        let encoded = self
            .value_tags(keys.user(), &computed.tags)
            .and_then(|tags| {
                self.saw_tags(keys, &tags);
                self.encode_value(&computed.value, ttl, took, held.fence(), (born, &tags))
            });
        let bytes = match encoded {
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
        let written = match held.store_and_unlock(self.core.store.as_ref(), write).await {
            Ok(Stored { written: true, .. }) => true,
            // Counted and logged once a minute per reason, not per call: a full Redis would
            // otherwise log on every miss.
            Ok(Stored { written: false, .. }) => {
                let why = &"the fencing token is no longer current";
                let counters = &self.core.counters;
                counters.not_stored(NotStoredReason::FenceLost, keys.user(), why);
                false
            }
            Err(e) => {
                let counters = &self.core.counters;
                counters.not_stored(NotStoredReason::of(e.kind()), keys.user(), &e);
                false
            }
        };
        Ok((computed.value, written))
    }

    /// Lets the lock go after the computation under it failed with `error`, or hit its hard
    /// timeout (`None`), doing with the value it was to replace what `on_failure` says; fenced
    /// by the lock's token, in one step with the release.
    pub(crate) async fn after_failure<T: DeserializeOwned + 'static, E: Display + 'static>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        on_failure: OnFailure,
        error: Option<&E>,
        born: u64,
    ) {
        let store = self.core.store.as_ref();
        let failure = match error {
            Some(_) => Failure::SourceFailed,
            None => Failure::HardTimeout,
        };
        let negative_ttl = self.options.negative_ttl;
        // An error marked as its caller's alone is never remembered for the others.
        let shared = !error.is_some_and(|e| marked_not_shared(e));
        let has = AtHand {
            kept: matches!(on_failure, OnFailure::Throttle(_)),
            negative: negative_ttl.is_some() && shared,
            ..AtHand::default()
        };
        let released = match (on_failure, decide(failure, has), negative_ttl, error) {
            // The fail-safe: the kept value stays, as a throttled copy (the table puts it before
            // negative caching, which would replace the fallback with the error).
            (OnFailure::Throttle(kept), Answer::ServeKept, _, _) => {
                match self.throttled_copy(&kept, held.fence()) {
                    Some(write) => held
                        .store_and_unlock(store, write)
                        .await
                        .map(|stored| stored.released),
                    None => held.release().await,
                }
            }
            (OnFailure::Remember, Answer::Remember, Some(negative_ttl), Some(e)) => {
                let tags = self.options.get_tags();
                let bytes =
                    self.encode_failure::<T, E>(e, negative_ttl, held.fence(), (born, tags));
                let write = Write::Value {
                    bytes,
                    ttl: negative_ttl,
                };
                held.store_and_unlock(store, write).await.map(|_| true)
            }
            (OnFailure::Delete, ..) => held
                .store_and_unlock(store, Write::Delete)
                .await
                .map(|stored| stored.released),
            _ => held.release().await,
        };
        if let Err(err) = released {
            crate::log::throttled!(warn, key = %keys.user(), error = %err,
                "could not free the lock after a failed computation; it frees itself when its lease runs out");
        }
    }
}
