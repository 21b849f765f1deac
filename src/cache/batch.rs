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
//! 5. keys whose lock another process holds are waited for as a single key is (wake-ups, backoff,
//!    the wait bound); if the holder goes away without a value, this call takes the lock and
//!    computes that key itself, with a call of `f` for it alone.
//!
//! Invariants, as on the single-key path: a key's flight is finished with its outcome as soon as
//! that outcome is known (not when the whole batch is done); every lock taken is held by a guard
//! from before its request is sent, so dropping the call (or a panic in `f`) frees every lock at
//! once and hands every led key to the next caller. Nothing here is spawned: the futures of one
//! call run on its task and go with it.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use crate::cache::compute::{waited, OnFailure, StoredEntry};
use crate::cache::freshness::{judge, Verdict};
use crate::lock::lease::{Acquiring, HeldLock};
use crate::stats::Event;
use crate::store::{BoxFuture, ReadOrLock};
use crate::wait::flight::{Follower, Leader, Role};
use crate::wait::join_all;
use crate::wait::waiting::{Waiter, Wake};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Cache, Computed, Error, Fallback, Fetched, Lease, Source};

type Outcome<T> = Result<Fetched<T>, Error>;

/// The user's batch computation, type-erased once at the edge: the keys to compute in, their
/// values out (keyed, so that the order and the completeness of the answer are checked here).
pub(crate) type BatchFn<T, E> = Arc<
    dyn Fn(Vec<String>) -> BoxFuture<'static, Result<HashMap<String, Computed<T>>, E>>
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
}

impl<T, E> Led<'_, T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    /// The key's outcome is known: its in-process followers get it now.
    fn settle(self, outcome: Outcome<T>) -> (usize, Outcome<T>) {
        if let Some(leader) = self.leader {
            leader.finish(&outcome);
        }
        (self.slot, outcome)
    }
}

/// Where a key waiting for another process's holder starts.
enum Start {
    /// The lock was found held, expiring in this long.
    Wait(Option<Duration>),
    /// The bytes under the key do not decode: take the lock over them at once, to replace them.
    Replace,
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
                        if let Some(entry) = cache.servable::<T>(keys, &bytes) {
                            cache.remember_near(ticket, keys, &entry, bytes.len());
                            outcomes[slot] = Some(self.serve(entry, keys, Source::Hit));
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
            match role {
                Role::Lead(leader) => led.push(Led {
                    slot,
                    keys,
                    leader: Some(leader),
                }),
                Role::Alone => led.push(Led {
                    slot,
                    keys,
                    leader: None,
                }),
                Role::Follow(follower) => {
                    steps.push(Box::pin(self.follow(slot, keys, follower)));
                }
            }
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
    /// draw) starts a background refresh of that key, by a call of `f` for it alone.
    fn serve(&self, entry: StoredEntry<T>, keys: &EntryKeys, found: Source) -> Outcome<T> {
        let cache = self.cache;
        // A fresh value without XFetch needs none of what `serve` prepares for a refresh (a copy
        // of the keys, a closure): the verdict is the same `judge`, without a draw. A throttled
        // fail-safe copy is a fallback, not a hit: the single-key `serve` says so.
        if cache.options.early_refresh_beta <= 0.0 && !entry.throttled {
            let now = cache.inner.store.now_ms();
            if judge(now, entry.fresh_until_ms, entry.compute_ms, 0.0, 1.0) == Verdict::Fresh {
                return match entry.value {
                    Ok(value) => Ok(Fetched {
                        value,
                        source: found,
                    }),
                    Err(message) => Err(Error::RecentFailure {
                        key: keys.user.clone(),
                        message,
                    }),
                };
            }
        }
        let f = Arc::clone(&self.f);
        let key = keys.user.clone();
        let refresh = move |_lease: Lease| async move {
            let mut values = f(vec![key.clone()]).await.map_err(Refresh::Failed)?;
            values.remove(&key).ok_or(Refresh::Missing)
        };
        self.cache
            .serve(entry, keys.clone(), self.ttl, refresh, found)
    }

    /// A key another task of this process computes: its outcome, or, if that task goes away
    /// without one, this call's own attempt.
    async fn follow(
        &self,
        slot: usize,
        keys: Arc<EntryKeys>,
        mut follower: Follower<Fetched<T>>,
    ) -> Settled<T> {
        let cache = self.cache;
        loop {
            let remaining = cache
                .options
                .wait_timeout
                .saturating_sub(self.started.elapsed());
            match tokio::time::timeout(remaining, follower.outcome()).await {
                Ok(Some(outcome)) => return vec![(slot, outcome.map(waited))],
                Ok(None) => {}
                Err(_) => {
                    let error = Error::WaitTimeout {
                        key: keys.user.clone(),
                        waited: self.started.elapsed(),
                    };
                    return vec![(slot, Err(error))];
                }
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
            let led = Led { slot, keys, leader };
            return self.lead(vec![led]).await;
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
                .map(|(l, token)| (&*l.keys, &**token, true))
                .collect();
            store
                .read_or_lock_many(&requests, cache.options.lease)
                .await
        };

        let mut settled = Vec::new();
        let mut computing = Vec::new();
        let mut uncached = Vec::new();
        let mut steps: Vec<Step<'_, T>> = Vec::new();
        for (((l, mut acquiring), asked), answer) in
            led.into_iter().zip(acquiring).zip(asked).zip(answers)
        {
            match answer {
                Ok(ReadOrLock::Acquired { fence }) => {
                    computing.push((l, acquiring.granted(fence, asked)));
                }
                Ok(ReadOrLock::Value(bytes)) => {
                    acquiring.refused();
                    match cache.servable::<T>(&l.keys, &bytes) {
                        Some(entry) => {
                            let outcome = self.serve(entry, &l.keys, Source::Hit);
                            settled.push(l.settle(outcome));
                        }
                        None => steps.push(Box::pin(self.hold_on(l, Start::Replace))),
                    }
                }
                Ok(ReadOrLock::Held { expires_in }) => {
                    acquiring.refused();
                    steps.push(Box::pin(self.hold_on(l, Start::Wait(expires_in))));
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

    /// A key whose lock another process holds (or whose bytes must be replaced): the loop of the
    /// single-key `load`, for this key alone. If the lock comes to this call, `f` computes the
    /// key alone.
    async fn hold_on(&self, led: Led<'a, T, E>, start: Start) -> Settled<T> {
        let cache = self.cache;
        let store = &cache.inner.store;
        let options = &cache.options;
        let keys = Arc::clone(&led.keys);
        let mut waiter = Waiter::new(store.as_ref(), &keys, options, self.started);
        let (mut wait_for, mut read_value, mut found) = match start {
            Start::Wait(expires_in) => (Some(expires_in), true, Source::Waited),
            Start::Replace => (None, false, Source::Hit),
        };
        loop {
            if let Some(expires_in) = wait_for {
                match self.wait_turn(&mut waiter, &keys, expires_in).await {
                    Ok(Some(entry)) => {
                        let outcome = self.serve(entry, &keys, found);
                        return vec![led.settle(outcome)];
                    }
                    Ok(None) => {}
                    Err(e) => return vec![led.settle(Err(e))],
                }
            }
            let mut acquiring = cache.acquiring(&keys);
            let token = acquiring.token();
            let asked = acquiring.sending();
            let answer = store
                .read_or_lock(&keys, &token, options.lease, read_value)
                .await;
            match answer {
                Ok(ReadOrLock::Acquired { fence }) => {
                    let held = acquiring.granted(fence, asked);
                    return self.compute(vec![(led, held)]).await;
                }
                Ok(ReadOrLock::Value(bytes)) => {
                    acquiring.refused();
                    match cache.servable::<T>(&keys, &bytes) {
                        Some(entry) => {
                            let outcome = self.serve(entry, &keys, found);
                            return vec![led.settle(outcome)];
                        }
                        None => {
                            read_value = false;
                            wait_for = None;
                        }
                    }
                }
                Ok(ReadOrLock::Held { expires_in }) => {
                    acquiring.refused();
                    read_value = true;
                    found = Source::Waited;
                    wait_for = Some(expires_in);
                }
                Err(e) => {
                    acquiring.failed(&e);
                    drop(acquiring);
                    return match options.on_backend_error {
                        Fallback::Fail => {
                            vec![led.settle(Err(Error::backend("read-or-lock", e)))]
                        }
                        Fallback::ComputeUncached => {
                            tracing::warn!(key = %keys.user, error = %e,
                                "backend unavailable; computing without the cache");
                            self.compute_uncached(vec![led]).await
                        }
                    };
                }
            }
        }
    }

    /// Waits for the holder of `keys`' lock as the single-key path does: listen, look, wait;
    /// then look again. A value found, or `None` when it is time to try the lock again.
    async fn wait_turn(
        &self,
        waiter: &mut Waiter<'_>,
        keys: &EntryKeys,
        expires_in: Option<Duration>,
    ) -> Result<Option<StoredEntry<T>>, Error> {
        if waiter.wait(expires_in).await? == Wake::Subscribed {
            // Listening now: a value that landed before is read here, a later one wakes us.
            if let Some(entry) = self.look(keys).await {
                return Ok(Some(entry));
            }
            waiter.wait(expires_in).await?;
        }
        // After a wait a plain GET looks first: the value has usually landed.
        Ok(self.look(keys).await)
    }

    /// A value of `keys` that may be served now, read with a plain GET.
    async fn look(&self, keys: &EntryKeys) -> Option<StoredEntry<T>> {
        let (_, bytes) = self.cache.look::<T>(keys).await?;
        self.cache.servable(keys, &bytes)
    }

    /// Runs `f` once for the keys locked here, then stores each value it returned by the
    /// single-key path's fenced write; a key it left out fails alone (its lock freed at once,
    /// nothing cached), and its error fails all and only these keys (remembered per key when a
    /// negative TTL is set).
    async fn compute(&self, locked: Vec<(Led<'a, T, E>, HeldLock)>) -> Settled<T> {
        let cache = self.cache;
        let names: Vec<String> = locked.iter().map(|(l, _)| l.keys.user.clone()).collect();
        for _ in &locked {
            cache.inner.counters.record(Event::Compute);
        }
        let computing = Instant::now();
        let answer = (self.f)(names).await;
        let took = computing.elapsed();
        match answer {
            Ok(mut values) => {
                let stores: Vec<_> = locked
                    .into_iter()
                    .map(|(led, held)| {
                        let computed = values.remove(&led.keys.user);
                        async move {
                            let outcome = match computed {
                                Some(computed) => cache
                                    .store_computed(held, &led.keys, self.ttl, computed, took)
                                    .await
                                    .map(|value| Fetched {
                                        value,
                                        source: Source::Computed,
                                    }),
                                None => Err(missing(held, &led.keys).await),
                            };
                            led.settle(outcome)
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
            Err(e) => {
                let (leds, helds): (Vec<_>, Vec<_>) = locked.into_iter().unzip();
                let failures = leds
                    .iter()
                    .zip(helds)
                    .map(|(led, held)| {
                        // With the fail-safe on, a value past its stale window may still be in
                        // the store as the single-key callers' fallback: remembering the failure
                        // would overwrite it, so the lock is only let go.
                        let on_failure = if cache.options.fail_safe() {
                            OnFailure::Release
                        } else {
                            OnFailure::Remember
                        };
                        cache.after_failure::<T, E>(held, &led.keys, on_failure, Some(&e))
                    })
                    .collect();
                join_all(failures).await;
                let error = Error::compute(e);
                leds.into_iter()
                    .map(|led| led.settle(Err(error.clone())))
                    .collect()
            }
        }
    }

    /// The backend failed and the fallback is to compute without the cache: one call of `f`
    /// for these keys, nothing stored.
    async fn compute_uncached(&self, leds: Vec<Led<'a, T, E>>) -> Settled<T> {
        let names: Vec<String> = leds.iter().map(|l| l.keys.user.clone()).collect();
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
