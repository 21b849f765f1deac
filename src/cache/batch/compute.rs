//! The computation of a batch: `f` runs once for the keys this call locked, under the hard
//! timeout, and each value it returned is stored by the single-key path's fenced write; a
//! failure is handled per key by the fail-safe. Also the computation without the cache, when the
//! backend failed and that is the call's fallback.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::lead::Led;
use super::{unsettled, Batch, BatchFn, Settled};
use crate::cache::compute::{Detachable, OnFailure};
use crate::cache::engine::Engine;
use crate::cache::failsafe::Kept;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::join::join_all;
use crate::lock::lease::HeldLock;
use crate::stats::Event;
use crate::time::later_by;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Computed, Error, Fetched, Lease, Source};

/// A key locked for a batch computation: its lock, and what a failure does with the value the
/// computation was to replace. Owned, so that the computation can go on in a task of its own.
struct Locked {
    keys: Arc<EntryKeys>,
    held: HeldLock,
    on_failure: OnFailure,
}

/// What a computation brings back for each of its keys, in order: the value, and whether it was
/// written (see `Engine::store_computed`).
type Results<T> = Vec<Result<(T, bool), Error>>;

/// The fail-safe's fallback of each key of a computation, in order (`None`: the key has none).
type Fallbacks<T> = Vec<Option<Kept<T>>>;

impl<'a, C, T, E> Batch<'a, C, T, E>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    /// Runs `f` once for the keys locked here and stores each value it returned by the
    /// single-key path's fenced write (see [`run_locked`]); a key with a fail-safe fallback
    /// answers with it when the computation fails or hits its hard timeout.
    ///
    /// With a soft timeout and a fallback for every key, the computation runs in a task of its
    /// own: at the soft timeout the call answers with the fallbacks while the computation goes
    /// on under its locks and heartbeats and lands as usual (aborted if the call goes away
    /// before, as a single key's). A batch with a key that has no fallback waits for it.
    pub(super) async fn compute(&self, locked: Vec<(Led<'a, T, E>, HeldLock)>) -> Settled<T> {
        let cache = self.cache;
        let (leds, fallbacks, work) = hand_over(locked);
        let run = run_locked(cache.clone(), Arc::clone(&self.f), self.ttl, work);
        // A batch returns all its keys at once: it answers at the soft timeout only if the
        // table serves every key's fallback then.
        let soft = cache.soft_deadline(self.started).filter(|_| {
            fallbacks.iter().all(|kept| {
                decide(Failure::SoftTimeout, AtHand::kept(kept.is_some())) == Answer::ServeKept
            })
        });
        let results = match soft {
            None => Some(run.await),
            Some(soft) => self.until_soft_timeout(run, soft, leds.len()).await,
        };
        match results {
            Some(results) => self.answer_computed(leds, results, fallbacks),
            // Every key has its fallback here.
            None => self.answer_with_fallbacks(leds, fallbacks),
        }
    }

    /// Runs the computation in a task of its own: its results if they are there at `soft`,
    /// else `None` and the task goes on (detached) to land its values. `keys` is how many keys
    /// it computes, each counted as a soft timeout.
    async fn until_soft_timeout(
        &self,
        run: impl Future<Output = Results<T>> + Send + 'static,
        soft: Instant,
        keys: usize,
    ) -> Option<Results<T>> {
        let mut task = Detachable::spawn(run);
        tokio::select! {
            // The values, if they are there at the soft timeout too.
            biased;
            joined = &mut task.handle => match joined {
                Ok(results) => Some(results),
                Err(e) => match e.try_into_panic() {
                    // A panic in `f` reaches its caller, as when it runs inline.
                    Ok(panic) => std::panic::resume_unwind(panic),
                    // Cancelled by the runtime shutting down.
                    Err(_) => None,
                },
            },
            () = crate::time::sleep_until(soft) => {
                task.detach();
                for _ in 0..keys {
                    self.cache.core.counters.record(Event::SoftTimeout);
                }
                tracing::debug!(keys,
                    "soft timeout: serving the fail-safe values while the batch computation goes on");
                None
            }
        }
    }

    /// Each key's outcome from the computation's result for it: its value, or, if it failed,
    /// the fail-safe's fallback or the error.
    fn answer_computed(
        &self,
        leds: Vec<Led<'a, T, E>>,
        results: Results<T>,
        fallbacks: Fallbacks<T>,
    ) -> Settled<T> {
        leds.into_iter()
            .zip(results)
            .zip(fallbacks)
            .map(|((led, result), kept)| {
                let outcome = result
                    .map(|(value, stored)| Fetched {
                        stored,
                        ..Fetched::new(value, Source::Computed)
                    })
                    .or_else(|e| self.cache.fall_back(e, kept, &led.keys));
                led.settle(outcome)
            })
            .collect()
    }

    /// Each key answers with its fallback (the computation goes on without the call).
    fn answer_with_fallbacks(
        &self,
        leds: Vec<Led<'a, T, E>>,
        fallbacks: Fallbacks<T>,
    ) -> Settled<T> {
        leds.into_iter()
            .zip(fallbacks)
            .map(|(led, kept)| {
                let outcome = kept
                    .map(|kept| self.cache.serve_fallback(kept.value))
                    .ok_or_else(unsettled);
                led.settle(outcome)
            })
            .collect()
    }

    /// The backend failed and the fallback is to compute without the cache: one call of `f`
    /// for these keys, nothing stored.
    pub(super) async fn compute_uncached(&self, leds: Vec<Led<'a, T, E>>) -> Settled<T> {
        let names: Vec<(String, Lease)> = leds
            .iter()
            .map(|l| (l.keys.user().to_owned(), Lease::unlocked()))
            .collect();
        match (self.f)(names).await {
            Ok(mut values) => leds
                .into_iter()
                .map(|led| {
                    let outcome = match values.remove(led.keys.user()) {
                        Some(computed) => Ok(Fetched::new(computed.value, Source::Uncached)),
                        None => Err(Error::MissingFromBatch {
                            key: led.keys.user().to_owned(),
                        }),
                    };
                    led.settle(outcome)
                })
                .collect(),
            Err(e) => {
                let error = Error::compute(e);
                leds.into_iter()
                    .map(|led| led.settle(Err(error.clone())))
                    .collect()
            }
        }
    }
}

/// Splits the locked keys into what stays with the call (each led key and its fallback) and
/// what goes to the computation (each key's lock, and what a failure does: a throttled copy of
/// the fallback's bytes, or the failure remembered).
fn hand_over<'a, T, E>(
    locked: Vec<(Led<'a, T, E>, HeldLock)>,
) -> (Vec<Led<'a, T, E>>, Fallbacks<T>, Vec<Locked>)
where
    T: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    let mut leds = Vec::with_capacity(locked.len());
    let mut fallbacks = Vec::with_capacity(locked.len());
    let mut work = Vec::with_capacity(locked.len());
    for (mut led, held) in locked {
        let kept = led.kept.take();
        let on_failure = match &kept {
            Some(kept) => OnFailure::Throttle(kept.bytes.clone()),
            None => OnFailure::Remember,
        };
        work.push(Locked {
            keys: Arc::clone(&led.keys),
            held,
            on_failure,
        });
        fallbacks.push(kept);
        leds.push(led);
    }
    (leds, fallbacks, work)
}

/// Runs `f` once for the `locked` keys, each with its lease, under the hard timeout
/// ([`max_hold`](crate::CallOptions::max_hold)), then stores each value it returned by the
/// single-key path's fenced write; one result per key, in order. A key `f` left out fails alone
/// (its lock freed at once, nothing cached); an error from `f` fails all these keys, and each
/// key's failure is handled as its [`OnFailure`] says (a throttled copy of its fallback, or the
/// failure remembered when a negative TTL is set); the hard timeout is never remembered.
async fn run_locked<C, T, E>(
    cache: Engine<C>,
    f: BatchFn<T, E>,
    ttl: Duration,
    locked: Vec<Locked>,
) -> Results<T>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    let names: Vec<(String, Lease)> = locked
        .iter()
        .map(|l| (l.keys.user().to_owned(), l.held.lease()))
        .collect();
    for _ in &locked {
        cache.core.counters.record(Event::Compute);
    }
    // One birth for the batch, before `f` runs (see `cache/tags.rs`): the earliest its grants
    // came with, or read now if one came without.
    let born = match locked.iter().map(|l| l.held.born()).min().flatten() {
        Some(born) => born,
        None => cache.born_now().await,
    };
    let (ran, took) = call_within_hard_timeout(&cache, &f, names).await;
    for _ in &locked {
        cache.core.counters.record(Event::ComputeTime(took));
    }
    match ran {
        Some(Ok(values)) => store_values(&cache, locked, values, ttl, (took, born)).await,
        Some(Err(e)) => fail_all(&cache, locked, e, born).await,
        None => time_out_all::<C, T, E>(&cache, locked, took, born).await,
    }
}

/// One call of `f`, cut off at the hard timeout (`None` then), and how long it ran.
async fn call_within_hard_timeout<C, T, E>(
    cache: &Engine<C>,
    f: &BatchFn<T, E>,
    names: Vec<(String, Lease)>,
) -> (Option<Result<HashMap<String, Computed<T>>, E>>, Duration) {
    let computing = crate::time::now();
    let run = f(names);
    let ran = match cache.options.max_hold {
        Some(hold) => crate::time::timeout_at(later_by(computing, hold), run)
            .await
            .ok(),
        None => Some(run.await),
    };
    (ran, crate::time::since(computing))
}

/// `f` returned `values`: each locked key's value is stored under its lock (concurrently); a
/// key left out fails alone, and keys it was not asked for are ignored.
async fn store_values<C, T>(
    cache: &Engine<C>,
    locked: Vec<Locked>,
    mut values: HashMap<String, Computed<T>>,
    ttl: Duration,
    took: (Duration, u64),
) -> Results<T>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let stores: Vec<_> = locked
        .into_iter()
        .map(|l| {
            let computed = values.remove(l.keys.user());
            async move {
                match computed {
                    Some(computed) => {
                        cache
                            .store_computed(l.held, &l.keys, ttl, computed, took)
                            .await
                    }
                    None => Err(missing(l.held, &l.keys).await),
                }
            }
        })
        .collect();
    if !values.is_empty() {
        tracing::debug!(
            extra = values.len(),
            "the batch computation returned keys it was not asked for; ignored"
        );
    }
    join_all(stores).await
}

/// `f` failed: every locked key's failure is handled as its [`OnFailure`] says, and each gets
/// the error.
async fn fail_all<C, T, E>(cache: &Engine<C>, locked: Vec<Locked>, e: E, born: u64) -> Results<T>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    let count = locked.len();
    let failed = &e;
    let failures = locked
        .into_iter()
        .map(|l| async move {
            cache
                .after_failure::<T, E>(l.held, &l.keys, l.on_failure, Some(failed), born)
                .await;
        })
        .collect::<Vec<_>>();
    join_all(failures).await;
    let error = Error::compute(e);
    (0..count).map(|_| Err(error.clone())).collect()
}

/// `f` hit the hard timeout (and was dropped): every locked key's failure is handled as its
/// [`OnFailure`] says, without remembering it, and each gets [`Error::ComputeTimeout`].
async fn time_out_all<C, T, E>(
    cache: &Engine<C>,
    locked: Vec<Locked>,
    took: Duration,
    born: u64,
) -> Results<T>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    crate::log::throttled!(warn, keys = locked.len(), after = ?took,
        "hard timeout: the batch computation is cancelled and its locks freed");
    let failures = locked
        .into_iter()
        .map(|l| async move {
            cache.core.counters.record(Event::HardTimeout);
            cache
                .after_failure::<T, E>(l.held, &l.keys, l.on_failure, None, born)
                .await;
            Err(Error::ComputeTimeout {
                key: l.keys.user().to_owned(),
                after: took,
            })
        })
        .collect::<Vec<_>>();
    join_all(failures).await
}

/// A key the computation left out: its lock goes at once (waking its waiters), nothing is
/// cached, and the key's callers get [`Error::MissingFromBatch`].
async fn missing(held: HeldLock, keys: &EntryKeys) -> Error {
    crate::log::throttled!(warn, key = %keys.user(), "the batch computation returned no value for this key");
    if let Err(e) = held.release().await {
        crate::log::throttled!(warn, key = %keys.user(), error = %e,
            "could not free the lock of a key left out; it frees itself when its lease runs out");
    }
    Error::MissingFromBatch {
        key: keys.user().to_owned(),
    }
}
