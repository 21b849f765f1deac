//! The single-key path of the `get_or_compute` family below its quick hits: the first read, the
//! in-process single flight (lead, or follow this process's leader), and the distributed part
//! (`Engine::claim`, then compute or serve).
//!
//! Explained in the guide: `docs/how-it-works.md` (the protocol and its round trips).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use crate::cache::bounds::{CacheValue, ComputeFailure};
use crate::cache::claim::{Claim, Start};
use crate::cache::engine::Engine;
use crate::cache::failsafe::Sorted;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::cache::tags::Epochs;
use crate::cache::tiers::Read;
use crate::stats::Event;
use crate::store::{Blob, StoreResult};
use crate::time::{later_by, saturate};
use crate::wait::flight::{Follower, Role};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Computed, Error, Fetched, Lease, Source};

impl<C: Codec> Engine<C> {
    /// `Cache::fetch` once [`quick_hit`](Self::quick_hit) found nothing: the call's span and
    /// its outcome counted.
    pub(crate) async fn fetch_beyond_quick_hit<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        // One span per call; `outcome` and `wait_ms` are filled in when it ends.
        let span = tracing::debug_span!(
            "stampede_guard::fetch",
            key,
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty
        );
        // Taken whole, once, here: every TTL below is at most FOREVER.
        let ttl = saturate(ttl);
        // tokio's clock, like every other timing here, so paused-time tests see it move.
        let started = tokio::time::Instant::now();
        // Without a subscriber for it, the span is disabled: then no wrapper is polled, entered
        // and exited on every poll of the call.
        let result = if span.is_disabled() {
            self.fetch_entry(key, ttl, started, f).await
        } else {
            (self.fetch_entry(key, ttl, started, f))
                .instrument(span.clone())
                .await
        };
        let outcome = self.count_outcome(&result, started);
        if !span.is_disabled() {
            span.record("outcome", outcome);
            if outcome == "waited" {
                span.record("wait_ms", started.elapsed().as_millis() as u64);
            }
        }
        result
    }

    /// Counts a call's outcome (a call that `started` then) and names it for the span.
    pub(crate) fn count_outcome<T>(
        &self,
        result: &Result<Fetched<T>, Error>,
        started: tokio::time::Instant,
    ) -> &'static str {
        let counters = &self.core.counters;
        let miss = || counters.record(Event::Miss);
        match result {
            Ok(fetched) => match fetched.source {
                Source::Hit => {
                    counters.record(Event::Hit);
                    "hit"
                }
                Source::Stale => {
                    counters.record(Event::Stale);
                    "stale"
                }
                Source::Computed => {
                    miss();
                    "miss-computed"
                }
                Source::Waited => {
                    miss();
                    // Timed only here: a hit does not read the clock again.
                    counters.record(Event::Wait(started.elapsed()));
                    "waited"
                }
                Source::Uncached => {
                    miss();
                    counters.record(Event::Uncached);
                    "fallback"
                }
                Source::FailSafe => {
                    counters.record(Event::Fallback);
                    "fail-safe"
                }
                // Counted where it was served (`held_served`).
                Source::Held => "held",
            },
            Err(Error::ComputeTimeout { .. }) => {
                miss();
                "hard-timeout"
            }
            Err(Error::WaitTimeout { .. }) => {
                miss();
                counters.record(Event::WaitTimeout);
                "wait-timeout"
            }
            Err(e) if e.is_backend() => {
                counters.record(Event::BackendError);
                "backend-error"
            }
            Err(Error::RecentFailure { .. }) => "recent-failure",
            Err(_) => {
                miss();
                "error"
            }
        }
    }

    /// The single-key path after the quick hits (`fetch`'s near and memory hits): a near copy
    /// when XFetch is on, else the call's first read ([`KeyCall::read_first`]). `started`: when
    /// the call began.
    pub(crate) async fn fetch_entry<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        started: Instant,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        // The near tier with XFetch on: a fresh copy is served through `serve`, which draws as
        // for a Redis hit (without XFetch, `fetch` answered near hits before coming here).
        if self.options.early_refresh_beta > 0.0 {
            if let Some(entry) = self.near_copy::<T>(key) {
                let keys = EntryKeys::new(&self.core.namespace, key)?;
                return KeyCall::new(self, keys, ttl, started, f).serve(entry, Source::Hit);
            }
        }
        let keys = EntryKeys::new(&self.core.namespace, key)?;
        KeyCall::new(self, keys, ttl, started, f).read_first().await
    }

    /// The one read of a single key, with its epochs (`get`, and `fetch` before its flight):
    /// one `MGET` on Redis. A write of this key still queued goes first (auto-recovery;
    /// failing, it fails the read), and an answer drops what the near tier held of the key from
    /// before an outage.
    pub(crate) async fn first_read(&self, keys: &EntryKeys) -> StoreResult<(Option<Blob>, Epochs)> {
        self.replay_queued(&[keys]).await?;
        let read = self.read_with_epochs(keys).await;
        if read.is_ok() {
            self.core.tiers.reached(keys);
        }
        read
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
        let mark = follower.mark();
        let outcome = follower.outcome();
        tokio::pin!(outcome);
        if let Some(soft) = self.soft_deadline(started).filter(|soft| *soft < bound) {
            if let Ok(outcome) = tokio::time::timeout_at(soft, &mut outcome).await {
                return self.shared(outcome, keys, mark).await;
            }
            let kept = match self.look_again::<T>(keys).await {
                Some(Err(kept)) => Some(kept),
                _ => None,
            };
            let has = AtHand::kept(kept.is_some());
            if let (Answer::ServeKept, Some(kept)) = (decide(Failure::SoftTimeout, has), kept) {
                self.core.counters.record(Event::SoftTimeout);
                return Some(Ok(self.serve_fallback(kept.value)));
            }
        }
        match tokio::time::timeout_at(bound, outcome).await {
            Ok(outcome) => self.shared(outcome, keys, mark).await,
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

    /// What a follower takes of its leader's `outcome` (`None`: lead again): a value the leader
    /// computed or read from the store only if none of its tags was invalidated since the
    /// leader started, knowing the epoch mark `mark` (see `cache/tags.rs`). A leader that read
    /// the value judged it when it read it, which may be before an invalidation the follower
    /// must not miss. Fallbacks (held, uncached, fail-safe) are shared as they are.
    async fn shared<T>(
        &self,
        outcome: Option<Result<Fetched<T>, Error>>,
        keys: &EntryKeys,
        mark: u64,
    ) -> Option<Result<Fetched<T>, Error>> {
        match outcome {
            Some(Ok(fetched))
                if matches!(
                    fetched.source,
                    Source::Computed | Source::Hit | Source::Waited | Source::Stale
                ) && !self.outlives_invalidations_since(keys, mark).await =>
            {
                None
            }
            outcome => outcome.map(|outcome| outcome.map(waited)),
        }
    }
}

/// One call of the single-key path, from its first read to its outcome: the engine it runs on,
/// its keys, its TTL, when it began to wait (the in-process flight or the lock) and its
/// computation. Its steps are the methods below and those of `serve.rs`, `compute.rs` and
/// `uncached.rs`; the batch's counterpart is `Batch`.
pub(crate) struct KeyCall<'e, C, F> {
    pub(crate) engine: &'e Engine<C>,
    pub(crate) keys: Arc<EntryKeys>,
    /// Whole: every TTL below is at most FOREVER.
    pub(crate) ttl: Duration,
    /// Since when this call waits: for the wait bound and the soft timeout.
    pub(crate) started: Instant,
    pub(crate) f: F,
}

impl<'e, C, F, T, E, Fut> KeyCall<'e, C, F>
where
    C: Codec,
    T: CacheValue,
    E: ComputeFailure,
    F: FnOnce(Lease) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
{
    /// `started`: when the call began (its miss waits from when it joins the flight).
    pub(crate) fn new(
        engine: &'e Engine<C>,
        keys: EntryKeys,
        ttl: Duration,
        started: Instant,
        f: F,
    ) -> Self {
        KeyCall {
            engine,
            keys: Arc::new(keys),
            ttl,
            started,
            f,
        }
    }

    /// The call's first read: a near copy's ticket first, for the answer to go into the near
    /// tier; one GET; on a miss, the in-process single flight, then [`load`](Self::load).
    async fn read_first(self) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        let keys = &*self.keys;
        engine.clock_ready().await;
        let ticket = engine.core.tiers.ticket(keys);

        // The hit path: one MGET (the value and its epochs), no script, no in-process
        // bookkeeping. A value past its stale window is not a hit: it goes on to the lock,
        // taken over it.
        let mut start = Start::Read;
        match engine.first_read(keys).await {
            Ok((Some(bytes), mut epochs)) => {
                match engine.read_live::<T>(keys, &bytes, &mut epochs).await {
                    Some(entry) => match engine.sort(entry) {
                        Sorted::Serve(entry) => {
                            engine.remember_near(Read {
                                ticket,
                                keys,
                                entry: &entry,
                                len: bytes.len(),
                                epochs: &epochs,
                            });
                            engine.keep_decoded(keys, &bytes, &entry);
                            return self.serve(entry, Source::Hit);
                        }
                        Sorted::Past(_) => start = Start::Replace,
                    },
                    // Bytes that are not ours, or a value a tag or a clear invalidated: the
                    // lock is taken over them, to replace them.
                    None => start = Start::Replace,
                }
            }
            Ok((None, _)) => {}
            Err(e) => {
                let held = engine.held_copy::<T>(&keys.user, &e);
                match (engine.on_backend_failure(&e, held.is_some()), held) {
                    (Answer::ServeHeld, Some(held)) => return Ok(held),
                    // The fallback applies in `load`, under the single flight.
                    (Answer::ComputeUncached, _) => {}
                    _ => return Err(Error::backend("get", e)),
                }
            }
        }
        self.share_or_load(start).await
    }

    /// A miss: this process's flight of the key, followed or led (then [`load`](Self::load)).
    async fn share_or_load(mut self, start: Start) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        self.started = Instant::now();
        let leader = loop {
            match engine
                .core
                .flights
                .join::<Fetched<T>, E>(&self.keys.value, engine.core.tags.mark())
            {
                Role::Lead(leader) => break Some(leader),
                Role::Alone => break None,
                Role::Follow(follower) => {
                    match engine.follow(follower, &self.keys, self.started).await {
                        Some(outcome) => return outcome,
                        // The leader went away, or its value is one this call must not get
                        // (an invalidation since it started): try to lead.
                        None => continue,
                    }
                }
            }
        };
        let outcome = self.load(start).await;
        if let Some(leader) = leader {
            leader.finish(&outcome);
        }
        outcome
    }

    /// The distributed part: read the value or take the lock; compute under it, or wait for the
    /// holder and read again. `start` says what the call has seen already (a value past its
    /// stale window, or the lock held).
    async fn load(self, start: Start) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        // Writes of this key still queued (auto-recovery) go first, checked again here: Redis
        // may have come back since the first read failed, and must not answer this key with
        // the value the queued write replaces.
        if let Err(e) = engine.replay_queued(&[&self.keys]).await {
            return self.without_cache("replay", e).await;
        }
        match engine.claim::<T>(&self.keys, self.started, start).await {
            Claim::Found(entry, found) => self.serve(entry, found),
            Claim::Locked(held, kept) => self.compute_within(held, kept).await,
            Claim::Fallback(value) => Ok(engine.serve_fallback(value)),
            Claim::Failed(e) => Err(e),
            Claim::Backend(e) => self.without_cache("read-or-lock", e).await,
        }
    }
}

/// What an in-process follower reports: the leader's computation or read is, for it, a wait.
fn waited<T>(fetched: Fetched<T>) -> Fetched<T> {
    // A follower read nothing itself: the leader's hit was read when the leader asked, which
    // may be before this call began (a flight can last a computation, or a process pause).
    // What the value is (stale, a fallback, uncached, held) still shows.
    let source = match fetched.source {
        Source::Computed | Source::Hit => Source::Waited,
        other => other,
    };
    Fetched { source, ..fetched }
}
