//! The batch path behind [`Cache::fetch_many`]: many keys in one call, each key keeping every
//! rule of the single-key path (its own lock, lease, heartbeat and fencing token, its own
//! in-process flight, its own outcome).
//!
//! The steps, and what each costs:
//! 1. the near tier answers the keys it holds (no request);
//! 2. one `MGET` reads the others (on a cluster, one per slot, sent concurrently);
//! 3. each key still missing joins this process's flight of that key: one a single-key call or
//!    another batch is computing is followed, not computed again;
//! 4. one read-or-lock script call (per slot on a cluster) takes the lock of every key led here
//!    that is free; `f` runs once with exactly the keys locked, and each of its values is stored
//!    by the same fenced write as a single key's;
//! 5. keys whose lock another process holds go through the single-key path's own wait-or-lock
//!    loop ([`Cache::claim`]: wake-ups, backoff, the wait bound, the fail-safe's budgets); if the
//!    holder goes away without a value, this call takes the lock and computes that key itself,
//!    with a call of `f` for it alone.
//!
//! The fail-safe, per key: the key's lock is taken over a value read past its stale window
//! (not read again), and once locked, what the key holds past its window is its fallback. If `f` fails or hits its hard timeout,
//! each key with a fallback answers with it and a throttled copy is written under its lock; the
//! others get the error. With a soft timeout and a fallback for every key it computes, the call
//! answers with the fallbacks at the soft timeout while `f` goes on and lands.
//!
//! Invariants, as on the single-key path: a key's flight is finished with its outcome as soon as
//! the step that settles it ends (not when the whole batch is done); every lock taken is held by
//! a guard from before its request is sent, so dropping the call (or a panic in `f`) frees every
//! lock at once and hands every led key to the next caller. The futures of one call run on its
//! task and go with it; the one exception is a computation that outlives its caller's soft
//! timeout, which runs in a task of its own that is aborted if the call is dropped before.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use crate::cache::claim::{Claim, Start};
use crate::cache::compute::{Detachable, OnFailure};
use crate::cache::entry::StoredEntry;
use crate::cache::failsafe::{Kept, Sorted};
use crate::cache::serve::Judged;
use crate::lock::lease::{Acquiring, HeldLock};
use crate::stats::Event;
use crate::store::{Blob, BoxFuture, ReadOrLock};
use crate::time::later_by;
use crate::wait::flight::{Follower, Leader, Role};
use crate::join::join_all;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Cache, Computed, Error, Fallback, Fetched, Lease, Source};

type Outcome<T> = Result<Fetched<T>, Error>;

/// The user's batch computation, type-erased once at the edge: the keys to compute in, each
/// with the lease it is computed under, their values out (keyed, so that the order and the
/// completeness of the answer are checked here).
pub(crate) type BatchFn<T, E> = Arc<
    dyn Fn(Vec<(String, Lease)>) -> BoxFuture<'static, Result<HashMap<String, Computed<T>>, E>>
        + Send
        + Sync,
>;

/// What a batch step hands back: the outcome of each key it settled, by its place among the
/// call's distinct keys.
type Settled<T> = Vec<(usize, Outcome<T>)>;

type Step<'s, T> = Pin<Box<dyn Future<Output = Settled<T>> + Send + 's>>;

/// A key this call leads in the process, until its outcome is known.
struct Led<'a, T: Send + Sync + 'static, E: Send + Sync + 'static> {
    slot: usize,
    keys: Arc<EntryKeys>,
    /// `None` when the key is in flight here with other value or error types (no sharing).
    leader: Option<Leader<'a, Fetched<T>, E>>,
    /// What the key holds must be replaced (a value past its stale window, or unreadable bytes):
    /// its lock is taken over it, without reading it again.
    replace: bool,
    /// The fail-safe's fallback for this key, once its lock is taken: what the key holds then,
    /// past its stale window.
    kept: Option<Kept<T>>,
}

impl<'a, T, E> Led<'a, T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    fn new(slot: usize, keys: Arc<EntryKeys>, leader: Option<Leader<'a, Fetched<T>, E>>) -> Self {
        Led {
            slot,
            keys,
            leader,
            replace: false,
            kept: None,
        }
    }

    /// The key's outcome is known: its in-process followers get it now. A key the computation
    /// left out is no answer for them (a single-key caller, or another batch, has a computation
    /// of its own): the flight is let go, as when a leader goes away, and one of them computes.
    fn settle(self, outcome: Outcome<T>) -> (usize, Outcome<T>) {
        if let Some(leader) = self.leader {
            if !matches!(outcome, Err(Error::MissingFromBatch { .. })) {
                leader.finish(&outcome);
            }
        }
        (self.slot, outcome)
    }
}

/// A key locked for a batch computation: its lock, and what a failure does with the value the
/// computation was to replace. Owned, so that the computation can go on in a task of its own.
struct Locked {
    keys: Arc<EntryKeys>,
    held: HeldLock,
    on_failure: OnFailure,
}

/// One batch call: the cache, the call's TTL and start, and its computation.
struct Batch<'a, C, T, E> {
    cache: &'a Cache<C>,
    ttl: Duration,
    started: Instant,
    f: BatchFn<T, E>,
}

impl<C: Codec> Cache<C> {
    /// The distinct keys of `asked` fetched as one batch; one outcome per asked key, in order
    /// (a key asked twice gets the same outcome twice). `ttl` is saturated by the caller.
    pub(crate) async fn fetch_many_entries<T, E>(
        &self,
        asked: Vec<String>,
        ttl: Duration,
        f: BatchFn<T, E>,
    ) -> Vec<Outcome<T>>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        E: Display + Debug + Send + Sync + 'static,
    {
        let batch = Batch {
            cache: self,
            ttl,
            started: Instant::now(),
            f,
        };
        // Each distinct key once, in the order first asked; a bad key is its own error.
        let mut distinct: Vec<Arc<EntryKeys>> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let places: Vec<Result<usize, Error>> = asked
            .iter()
            .map(|key| {
                if let Some(&slot) = seen.get(key.as_str()) {
                    return Ok(slot);
                }
                let keys = EntryKeys::new(&self.inner.namespace, key)?;
                distinct.push(Arc::new(keys));
                seen.insert(key, distinct.len() - 1);
                Ok(distinct.len() - 1)
            })
            .collect();
        let settled = batch.run(&distinct).await;
        for outcome in &settled {
            self.count(outcome, batch.started);
        }
        // Each outcome moves to the last place that asked for it; earlier duplicates get copies.
        let mut uses = vec![0usize; settled.len()];
        for slot in places.iter().flatten() {
            uses[*slot] += 1;
        }
        let mut settled: Vec<Option<Outcome<T>>> = settled.into_iter().map(Some).collect();
        places
            .into_iter()
            .map(|place| {
                let slot = place?;
                uses[slot] -= 1;
                let outcome = if uses[slot] == 0 {
                    settled[slot].take()
                } else {
                    settled[slot].clone()
                };
                outcome.unwrap_or_else(|| Err(unsettled()))
            })
            .collect()
    }
}

impl<'a, C, T, E> Batch<'a, C, T, E>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    /// Every key's outcome, by its place in `distinct`.
    async fn run(&self, distinct: &[Arc<EntryKeys>]) -> Vec<Outcome<T>> {
        let cache = self.cache;
        let mut outcomes: Vec<Option<Outcome<T>>> = vec![None; distinct.len()];
        // Keys whose stored value must be replaced: their locks are taken over it.
        let mut replace = vec![false; distinct.len()];

        // The near tier first: no request for the keys it holds.
        for (slot, keys) in distinct.iter().enumerate() {
            if let Some(entry) = cache.near_copy::<T>(&keys.user) {
                outcomes[slot] = Some(self.serve(entry, keys, Source::Hit));
            }
        }

        // One read for all the others. Tickets are taken before it is sent, for its answers to
        // go into the near tier as a single key's read does.
        let remote: Vec<usize> = (0..distinct.len())
            .filter(|&slot| outcomes[slot].is_none())
            .collect();
        if !remote.is_empty() {
            cache.clock_ready().await;
            let tickets: Vec<_> = remote
                .iter()
                .map(|&slot| {
                    let near = cache.inner.near.as_ref()?;
                    near.ticket(&distinct[slot].user)
                })
                .collect();
            let entries: Vec<&EntryKeys> = remote.iter().map(|&slot| &*distinct[slot]).collect();
            match cache.inner.store.get_many(&entries).await {
                Ok(values) => {
                    for ((&slot, ticket), bytes) in remote.iter().zip(tickets).zip(values) {
                        let keys = &distinct[slot];
                        let Some(bytes) = bytes else { continue };
                        let entry = cache.read_stored::<T>(keys, &bytes);
                        match entry.map(|entry| cache.sort(entry)) {
                            Some(Sorted::Serve(entry)) => {
                                cache.remember_near(ticket, keys, &entry, bytes.len());
                                outcomes[slot] = Some(self.serve(entry, keys, Source::Hit));
                            }
                            // Past its stale window, or unreadable bytes.
                            Some(Sorted::Past(_)) | None => replace[slot] = true,
                        }
                    }
                }
                Err(e) if cache.options.on_backend_error == Fallback::Fail => {
                    for &slot in &remote {
                        outcomes[slot] = Some(Err(Error::backend("get", e.clone())));
                    }
                }
                // The fallback applies when locking, under the single flight, as for one key.
                Err(_) => {}
            }
        }

        // The misses: lead the keys no one in this process is computing, follow the others.
        let mut led = Vec::new();
        let mut steps: Vec<Step<'_, T>> = Vec::new();
        let missing: Vec<usize> = (0..distinct.len())
            .filter(|&slot| outcomes[slot].is_none())
            .collect();
        let roles = cache
            .inner
            .flights
            .join_many::<Fetched<T>, E>(missing.iter().map(|&slot| distinct[slot].value.as_str()));
        for (slot, role) in missing.into_iter().zip(roles) {
            let keys = Arc::clone(&distinct[slot]);
            let leader = match role {
                Role::Lead(leader) => Some(leader),
                Role::Alone => None,
                Role::Follow(follower) => {
                    steps.push(Box::pin(self.follow(slot, keys, follower)));
                    continue;
                }
            };
            led.push(Led {
                replace: replace[slot],
                ..Led::new(slot, keys, leader)
            });
        }
        if !led.is_empty() {
            steps.push(Box::pin(self.lead(led)));
        }
        for settled in join_all(steps).await {
            for (slot, outcome) in settled {
                outcomes[slot] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Err(unsettled())))
            .collect()
    }

    /// Serves a stored entry as a single key's is served: a stale value (or XFetch's early
    /// draw) starts a background refresh of that key, by a call of `f` for it alone. The
    /// refresh's closure is only built then: a fresh hit prepares nothing.
    fn serve(&self, entry: StoredEntry<T>, keys: &EntryKeys, found: Source) -> Outcome<T> {
        let (served, fence) = match self.cache.judge_entry(entry, &keys.user, found) {
            Judged::Served(outcome) => return outcome,
            Judged::Refresh(served, fence) => (served, fence),
        };
        let f = Arc::clone(&self.f);
        let key = keys.user.clone();
        let refresh = move |lease: Lease| async move {
            let mut values = f(vec![(key.clone(), lease)])
                .await
                .map_err(Refresh::Failed)?;
            values.remove(&key).ok_or(Refresh::Missing)
        };
        self.cache
            .refresh_in_background(keys.clone(), self.ttl, refresh, fence);
        Ok(served)
    }

    /// A key another task of this process computes: its outcome (or, at the soft timeout or
    /// the wait bound, the fail-safe's fallback), or, if that task goes away without one, this
    /// call's own attempt.
    async fn follow(
        &self,
        slot: usize,
        keys: Arc<EntryKeys>,
        mut follower: Follower<Fetched<T>>,
    ) -> Settled<T> {
        let cache = self.cache;
        loop {
            if let Some(outcome) = cache.follow(follower, &keys, self.started).await {
                return vec![(slot, outcome)];
            }
            // The leader was cancelled or panicked: try to lead.
            let leader = match cache.inner.flights.join::<Fetched<T>, E>(&keys.value) {
                Role::Follow(next) => {
                    follower = next;
                    continue;
                }
                Role::Lead(leader) => Some(leader),
                Role::Alone => None,
            };
            return self.lead(vec![Led::new(slot, keys, leader)]).await;
        }
    }

    /// The keys this call leads: one read-or-lock request for all of them, then, concurrently,
    /// one computation for those it locked and a wait for each held by another process.
    async fn lead(&self, led: Vec<Led<'a, T, E>>) -> Settled<T> {
        let cache = self.cache;
        let store = &cache.inner.store;
        let mut acquiring: Vec<Acquiring> = led.iter().map(|l| cache.acquiring(&l.keys)).collect();
        let tokens: Vec<Arc<str>> = acquiring.iter().map(Acquiring::token).collect();
        // Every guard is armed before the request goes out: a call dropped while it is in
        // flight frees whatever it was granted.
        let asked: Vec<Instant> = acquiring.iter_mut().map(Acquiring::sending).collect();
        let answers = {
            let requests: Vec<(&EntryKeys, &str, bool)> = led
                .iter()
                .zip(&tokens)
                .map(|(l, token)| (&*l.keys, &**token, !l.replace))
                .collect();
            store
                .read_or_lock_many(&requests, cache.options.lease)
                .await
        };

        let mut settled = Vec::new();
        let mut computing = Vec::new();
        let mut taken_over = Vec::new();
        let mut uncached = Vec::new();
        let mut steps: Vec<Step<'_, T>> = Vec::new();
        for (((l, mut acquiring), asked), answer) in
            led.into_iter().zip(acquiring).zip(asked).zip(answers)
        {
            match answer {
                Ok(ReadOrLock::Acquired { fence }) => {
                    let held = acquiring.granted(fence, asked);
                    if l.replace {
                        taken_over.push((l, held));
                    } else {
                        computing.push((l, held));
                    }
                }
                Ok(ReadOrLock::Value(bytes)) => {
                    acquiring.refused();
                    let entry = cache.read_stored::<T>(&l.keys, &bytes);
                    match entry.map(|entry| cache.sort(entry)) {
                        Some(Sorted::Serve(entry)) => {
                            let outcome = self.serve(entry, &l.keys, Source::Hit);
                            settled.push(l.settle(outcome));
                        }
                        Some(Sorted::Past(_)) | None => {
                            steps.push(Box::pin(self.hold_on(l, Start::Replace)));
                        }
                    }
                }
                Ok(ReadOrLock::Held { expires_in }) => {
                    acquiring.refused();
                    steps.push(Box::pin(self.hold_on(l, Start::Held(expires_in))));
                }
                Err(e) => {
                    // The request may have been granted anyway: the guard frees it as it goes.
                    acquiring.failed(&e);
                    drop(acquiring);
                    match cache.options.on_backend_error {
                        Fallback::Fail => {
                            settled.push(l.settle(Err(Error::backend("read-or-lock", e))));
                        }
                        Fallback::ComputeUncached => {
                            tracing::warn!(key = %l.keys.user, error = %e,
                                "backend unavailable; computing without the cache");
                            uncached.push(l);
                        }
                    }
                }
            }
        }
        if !taken_over.is_empty() {
            let (served, locked) = self.look_again(taken_over).await;
            settled.extend(served);
            computing.extend(locked);
        }
        if !computing.is_empty() {
            steps.push(Box::pin(self.compute(computing)));
        }
        if !uncached.is_empty() {
            steps.push(Box::pin(self.compute_uncached(uncached)));
        }
        for more in join_all(steps).await {
            settled.extend(more);
        }
        settled
    }

    /// Keys whose lock was taken over what they held, read again with one `MGET`, as a single
    /// key's `claim` does: a value another caller wrote between the read and the lock is served
    /// (the lock let go) instead of computing again; for the others, the fallback is what the
    /// key holds now, under the lock (a value invalidated since it was kept is none). They stay
    /// locked, to compute.
    async fn look_again(
        &self,
        taken_over: Vec<(Led<'a, T, E>, HeldLock)>,
    ) -> (Settled<T>, Vec<(Led<'a, T, E>, HeldLock)>) {
        let cache = self.cache;
        let entries: Vec<&EntryKeys> = taken_over.iter().map(|(l, _)| &*l.keys).collect();
        // A failed read finds nothing: the keys are computed, without a fallback it cannot vouch for.
        let found: Vec<Option<Blob>> = cache
            .inner
            .store
            .get_many(&entries)
            .await
            .unwrap_or_default();
        let mut found = found.into_iter();
        let mut landed = Vec::new();
        let mut releases = Vec::new();
        let mut locked = Vec::new();
        for (mut l, held) in taken_over {
            let bytes = found.next().flatten();
            let now = bytes.as_ref().and_then(|bytes| {
                let entry = cache.read_stored::<T>(&l.keys, bytes)?;
                Some((cache.sort(entry), bytes))
            });
            match now {
                Some((Sorted::Serve(entry), _)) => {
                    releases.push(held.release());
                    landed.push((l, entry));
                }
                Some((Sorted::Past(entry), bytes)) => {
                    l.kept = cache.keep(entry, bytes);
                    locked.push((l, held));
                }
                None => locked.push((l, held)),
            }
        }
        // Let go at once, all together (a failed release runs out with its lease), before
        // serving: a stale value's background refresh needs the lock.
        join_all(releases).await;
        let served = landed
            .into_iter()
            .map(|(l, entry)| {
                let outcome = self.serve(entry, &l.keys, Source::Hit);
                l.settle(outcome)
            })
            .collect();
        (served, locked)
    }

    /// A key whose lock another process holds (or whose bytes must be replaced): the single-key
    /// path's wait-or-lock loop for this key alone (wake-ups, backoff, the wait bound, the
    /// fail-safe's budgets). If the lock comes to this call, `f` computes the key alone.
    async fn hold_on(&self, led: Led<'a, T, E>, start: Start) -> Settled<T> {
        let cache = self.cache;
        let keys = Arc::clone(&led.keys);
        let outcome = match cache.claim::<T>(&keys, self.started, start).await {
            Claim::Found(entry, found) => self.serve(entry, &keys, found),
            Claim::Locked(held, kept) => {
                let led = Led { kept, ..led };
                return self.compute(vec![(led, held)]).await;
            }
            Claim::Fallback(value) => Ok(cache.serve_fallback(value)),
            Claim::Failed(e) => Err(e),
            Claim::Backend(e) => match cache.options.on_backend_error {
                Fallback::Fail => Err(Error::backend("read-or-lock", e)),
                Fallback::ComputeUncached => {
                    tracing::warn!(key = %keys.user, error = %e,
                        "backend unavailable; computing without the cache");
                    return self.compute_uncached(vec![led]).await;
                }
            },
        };
        vec![led.settle(outcome)]
    }

    /// Runs `f` once for the keys locked here and stores each value it returned by the
    /// single-key path's fenced write (see [`run_locked`]); a key with a fail-safe fallback
    /// answers with it when the computation fails or hits its hard timeout.
    ///
    /// With a soft timeout and a fallback for every key, the computation runs in a task of its
    /// own: at the soft timeout the call answers with the fallbacks while the computation goes
    /// on under its locks and heartbeats and lands as usual (aborted if the call goes away
    /// before, as a single key's). A batch with a key that has no fallback waits for it.
    async fn compute(&self, locked: Vec<(Led<'a, T, E>, HeldLock)>) -> Settled<T> {
        let cache = self.cache;
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
        let run = run_locked(cache.clone(), Arc::clone(&self.f), self.ttl, work);
        let soft = cache
            .soft_deadline(self.started)
            .filter(|_| fallbacks.iter().all(Option::is_some));
        let results = match soft {
            None => Some(run.await),
            Some(soft) => {
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
                    () = tokio::time::sleep_until(soft) => {
                        task.detach();
                        for _ in &leds {
                            cache.inner.counters.record(Event::SoftTimeout);
                        }
                        tracing::debug!(keys = leds.len(),
                            "soft timeout: serving the fail-safe values while the batch computation goes on");
                        None
                    }
                }
            }
        };
        let Some(results) = results else {
            // Every key has its fallback here.
            return leds
                .into_iter()
                .zip(fallbacks)
                .map(|(led, kept)| {
                    let outcome = kept
                        .map(|kept| cache.serve_fallback(kept.value))
                        .ok_or_else(unsettled);
                    led.settle(outcome)
                })
                .collect();
        };
        leds.into_iter()
            .zip(results)
            .zip(fallbacks)
            .map(|((led, result), kept)| {
                let outcome = result
                    .map(|value| Fetched {
                        value,
                        source: Source::Computed,
                    })
                    .or_else(|e| cache.fall_back(e, kept, &led.keys));
                led.settle(outcome)
            })
            .collect()
    }

    /// The backend failed and the fallback is to compute without the cache: one call of `f`
    /// for these keys, nothing stored.
    async fn compute_uncached(&self, leds: Vec<Led<'a, T, E>>) -> Settled<T> {
        let names: Vec<(String, Lease)> = leds
            .iter()
            .map(|l| (l.keys.user.clone(), Lease::unlocked()))
            .collect();
        match (self.f)(names).await {
            Ok(mut values) => leds
                .into_iter()
                .map(|led| {
                    let outcome = match values.remove(&led.keys.user) {
                        Some(computed) => Ok(Fetched {
                            value: computed.value,
                            source: Source::Uncached,
                        }),
                        None => Err(Error::MissingFromBatch {
                            key: led.keys.user.clone(),
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

/// Runs `f` once for the `locked` keys, each with its lease, under the hard timeout
/// ([`max_hold`](crate::CallOptions::max_hold)), then stores each value it returned by the
/// single-key path's fenced write; one result per key, in order. A key `f` left out fails alone
/// (its lock freed at once, nothing cached); an error from `f` fails all these keys, and each
/// key's failure is handled as its [`OnFailure`] says (a throttled copy of its fallback, or the
/// failure remembered when a negative TTL is set); the hard timeout is never remembered.
async fn run_locked<C, T, E>(
    cache: Cache<C>,
    f: BatchFn<T, E>,
    ttl: Duration,
    locked: Vec<Locked>,
) -> Vec<Result<T, Error>>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    let names: Vec<(String, Lease)> = locked
        .iter()
        .map(|l| (l.keys.user.clone(), l.held.lease()))
        .collect();
    for _ in &locked {
        cache.inner.counters.record(Event::Compute);
    }
    let computing = Instant::now();
    let run = f(names);
    let ran = match cache.options.max_hold {
        Some(hold) => tokio::time::timeout_at(later_by(computing, hold), run)
            .await
            .ok(),
        None => Some(run.await),
    };
    let took = computing.elapsed();
    let cache = &cache;
    match ran {
        Some(Ok(mut values)) => {
            let stores: Vec<_> = locked
                .into_iter()
                .map(|l| {
                    let computed = values.remove(&l.keys.user);
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
        Some(Err(e)) => {
            let count = locked.len();
            let failed = &e;
            let failures = locked
                .into_iter()
                .map(|l| async move {
                    cache
                        .after_failure::<T, E>(l.held, &l.keys, l.on_failure, Some(failed))
                        .await;
                })
                .collect::<Vec<_>>();
            join_all(failures).await;
            let error = Error::compute(e);
            (0..count).map(|_| Err(error.clone())).collect()
        }
        None => {
            tracing::warn!(keys = locked.len(), after = ?took,
                "hard timeout: the batch computation is cancelled and its locks freed");
            let failures = locked
                .into_iter()
                .map(|l| async move {
                    cache.inner.counters.record(Event::HardTimeout);
                    cache
                        .after_failure::<T, E>(l.held, &l.keys, l.on_failure, None)
                        .await;
                    Err(Error::ComputeTimeout {
                        key: l.keys.user.clone(),
                        after: took,
                    })
                })
                .collect::<Vec<_>>();
            join_all(failures).await
        }
    }
}

/// Every step settles each of its keys, and each outcome is handed out once per place that
/// asked for it; a gap would be a bug of this module, reported rather than panicking.
fn unsettled() -> Error {
    Error::Config("internal error: a key of a batch was left without an outcome".to_owned())
}

/// A key the computation left out: its lock goes at once (waking its waiters), nothing is
/// cached, and the key's callers get [`Error::MissingFromBatch`].
async fn missing(held: HeldLock, keys: &EntryKeys) -> Error {
    tracing::warn!(key = %keys.user, "the batch computation returned no value for this key");
    if let Err(e) = held.release().await {
        tracing::warn!(key = %keys.user, error = %e,
            "could not free the lock of a key left out; it frees itself when its lease runs out");
    }
    Error::MissingFromBatch {
        key: keys.user.clone(),
    }
}

/// Why a background refresh of one key of a batch failed (it is only logged).
#[derive(Debug)]
enum Refresh<E> {
    Failed(E),
    Missing,
}

impl<E: Display> Display for Refresh<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refresh::Failed(e) => e.fmt(f),
            Refresh::Missing => write!(f, "the batch computation returned no value for the key"),
        }
    }
}
