//! The batch path behind [`Cache::fetch_many`]: many keys in one call, each key keeping every
//! rule of the single-key path (its own lock, lease, heartbeat and fencing token, its own
//! in-process flight, its own outcome).
//!
//! The steps, and what each costs:
//! 1. the near tier answers the keys it holds (no request);
//! 2. one `MGET` reads the others (on Redis, one per chunk of keys, all sent at once; on a
//!    cluster the client splits each per slot);
//! 3. each key still missing joins this process's flight of that key: one a single-key call or
//!    another batch is computing is followed, not computed again;
//! 4. one read-or-lock request takes the lock of every key led here that is free (on Redis, one
//!    script call per chunk of keys, per slot on a cluster, all sent at once: the store's
//!    `CHUNK_KEYS` bounds how long one holds the server); `f` runs once with exactly the keys
//!    locked, whatever the chunks, and each of its values is stored
//!    by the same fenced write as a single key's;
//! 5. keys whose lock another process holds go through the single-key path's own wait-or-lock
//!    loop (`Engine::claim`: wake-ups, backoff, the wait bound, the fail-safe's budgets); if the
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
//!
//! The files, in the order of a call: `plan.rs` (each distinct key once, and each outcome back to
//! every place that asked for it), `read.rs` (steps 1 and 2), `flights.rs` (step 3, and
//! following another task's flight), `lead.rs` (steps 4 and 5 up to the computation: the keys led
//! here, their one read-or-lock request and where each answer sends its key), `compute.rs` (the
//! one call of `f` for the locked keys, its timeouts and its stores).

mod compute;
mod flights;
mod lead;
mod plan;
mod read;

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::fetch::Judged;
use crate::join::join_all;
use crate::store::BoxFuture;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Computed, Error, Fetched, Lease, Source};

use plan::Plan;

/// The most keys one many-key call takes
/// ([`Cache::get_or_compute_many`](crate::Cache::get_or_compute_many),
/// [`Cache::fetch_many`](crate::Cache::fetch_many),
/// [`Cache::invalidate_many`](crate::Cache::invalidate_many)): a call given more is refused with
/// [`Error::TooManyKeys`] before anything is sent, on every store, never cut short. Redis is not
/// what needs it (each request carries a bounded chunk of keys, so other clients run between
/// them); the call itself is: every key holds a lock, a lease and its heartbeat for the length of
/// one computation, and the call's requests are all pipelined at once, so the last answers come
/// after the server has worked through the whole call, which must stay well within the
/// connection's response timeout (5 s by default): a cold batch of 10,000 keys took 0.8 to 1.9 s
/// on a loaded 2-core machine (docs/batch.md), so twice that keeps its last answers within the
/// default timeout even there. A warm-up job over more keys makes several calls.
pub const MAX_BATCH_KEYS: usize = 20_000;

/// One key's answer to its callers.
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

/// A step of the call that settles some of its keys, run beside the others on the call's task.
type Step<'s, T> = Pin<Box<dyn Future<Output = Settled<T>> + Send + 's>>;

/// One batch call: the cache, the call's TTL and start, and its computation.
struct Batch<'a, C, T, E> {
    cache: &'a Engine<C>,
    ttl: Duration,
    started: Instant,
    f: BatchFn<T, E>,
}

impl<C: Codec> Engine<C> {
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
        if asked.len() > MAX_BATCH_KEYS {
            let refused = Error::TooManyKeys {
                keys: asked.len(),
                limit: MAX_BATCH_KEYS,
            };
            return vec![Err(refused); asked.len()];
        }
        // The handle's tags judge every value it reads: unusable, they fail every key.
        if let Err(e) = self.check_tags() {
            return vec![Err(e); asked.len()];
        }
        let batch = Batch {
            cache: self,
            ttl,
            started: crate::time::now(),
            f,
        };
        let plan = Plan::new(&self.core.namespace, &asked);
        let settled = batch.run(&plan.distinct).await;
        for outcome in &settled {
            self.count_outcome(outcome, batch.started);
        }
        plan.hand_out(settled)
    }
}

impl<'a, C, T, E> Batch<'a, C, T, E>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    /// Every key's outcome, by its place in `distinct`: the near tier, then one read for the
    /// others, then the misses, led or followed, all at once.
    async fn run(&self, distinct: &[Arc<EntryKeys>]) -> Vec<Outcome<T>> {
        let mut outcomes: Vec<Option<Outcome<T>>> = vec![None; distinct.len()];
        self.answer_from_near(distinct, &mut outcomes);
        let replace = self.read_remote(distinct, &mut outcomes).await;
        let steps = self.join_flights(distinct, &outcomes, &replace);
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
        let (served, fence) = match self.cache.judge_entry(entry, keys.user(), found) {
            Judged::Served(outcome) => return outcome,
            Judged::Refresh(served, fence) => (served, fence),
        };
        let f = Arc::clone(&self.f);
        let key = keys.user().to_owned();
        let refresh = move |lease: Lease| async move {
            let mut values = f(vec![(key.clone(), lease)])
                .await
                .map_err(Refresh::Failed)?;
            values.remove(&key).ok_or(Refresh::Missing)
        };
        self.cache
            .refresh_in_background(Arc::new(keys.clone()), self.ttl, refresh, fence);
        Ok(served)
    }
}

/// Every step settles each of its keys, and each outcome is handed out once per place that
/// asked for it; a gap would be a bug of this module, reported rather than panicking.
fn unsettled() -> Error {
    Error::Config("internal error: a key of a batch was left without an outcome".to_owned())
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
