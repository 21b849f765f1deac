//! A miss of the single-key path: this process's flight of the key, followed or led, then the
//! distributed part (`Engine::claim`: read the value or take the lock; compute under it, or
//! wait for the holder and read again). The hit before it is `fetch.rs`.
//!
//! Explained in the guide: `docs/how-it-works.md` (the protocol and its round trips).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::cache::bounds::{CacheValue, ComputeFailure, ComputedFuture};
use crate::cache::claim::Claim;
use crate::cache::engine::Engine;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::cache::fetch::KeyCall;
use crate::cache::fetch::Start;
use crate::cache::freshness::Via;
use crate::cache::recovery::Held;
use crate::stats::Event;
use crate::store::StoreError;
use crate::time::later_by;
use crate::wait::flight::{Follower, Role};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Fetched, Lease, Source};

impl<C: Codec, T: CacheValue, E: ComputeFailure, F, Fut: ComputedFuture<T, E>>
    KeyCall<'_, C, T, E, F>
where
    F: FnOnce(Lease) -> Fut + Send + 'static,
{
    /// A miss: this process's flight of the key, followed or led (then [`load`](Self::load)).
    pub(crate) async fn share_or_load(mut self, start: Start) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        self.started = crate::time::now();
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
                        Some(outcome) => {
                            self.answered_by("flight");
                            return outcome;
                        }
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
            return self.while_queued(e).await;
        }
        let (claim, origin) = engine
            .claim_traced::<T>(&self.keys, self.started, start, &self.span)
            .await;
        match claim {
            Claim::Found(entry, found) => {
                self.answered_by(engine.store_tier());
                // Found after a wait: the holder's computation, for this call's span and its
                // followers'.
                self.serve(entry, found)
                    .map(|fetched| Fetched { origin, ..fetched })
            }
            Claim::Locked(held, kept) => self.compute_within(held, kept).await,
            Claim::Fallback(value) => {
                self.answered_by(engine.store_tier());
                Ok(engine.serve_fallback(value))
            }
            Claim::Failed(e) => Err(e),
            Claim::Backend(e) => self.without_cache("read-or-lock", e).await,
        }
    }

    /// A write of this key waits for the backend, which still fails with `error`: the value
    /// this process computed for the key since that write was queued, if there is one (as
    /// `Source::Held`); else the fallback of any backend failure, and a value it computes
    /// without the cache is held until the replay. So a key with a queued write costs its
    /// source one computation per instance per outage, not one per request (this call runs
    /// under the in-process flight: its followers share it).
    async fn while_queued(self, error: StoreError) -> Result<Fetched<T>, Error> {
        let Some(recovery) = &self.engine.core.recovery else {
            return self.without_cache("replay", error).await;
        };
        let seq = match recovery.held::<T>(&self.keys) {
            // A held copy, as the table of `fallback.rs` serves one for this failure.
            Held::Value(value)
                if self.engine.on_backend_failure(&error, true) == Answer::ServeHeld =>
            {
                self.engine.core.counters.record(Event::HeldServed);
                self.answered_by("process");
                // Computed without the cache: nothing stored stands behind it.
                let source = Source::Held;
                return Ok(Fetched {
                    stored: false,
                    ..Fetched::new(value, source)
                });
            }
            Held::Value(_) => return self.without_cache("replay", error).await,
            Held::Computing(seq) => seq,
            // Replayed meanwhile: the next call reads Redis again.
            Held::NotQueued => return self.without_cache("replay", error).await,
        };
        let keys = Arc::clone(&self.keys);
        let outcome = self.without_cache("replay", error).await;
        if let Ok(Fetched {
            value,
            source: Source::Uncached,
            ..
        }) = &outcome
        {
            recovery.hold(&keys, seq, value.clone());
        }
        outcome
    }
}

impl<C: Codec> Engine<C> {
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
            if let Ok(outcome) = crate::time::timeout_at(soft, &mut outcome).await {
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
        match crate::time::timeout_at(bound, outcome).await {
            Ok(outcome) => self.shared(outcome, keys, mark).await,
            Err(_) => {
                let error = Error::WaitTimeout {
                    key: keys.user().to_owned(),
                    waited: crate::time::since(started),
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
            // The leader's own error (`NotShared`): this call computes for itself.
            Some(Err(Error::Compute(e))) if e.is_not_shared() => None,
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

/// What an in-process follower reports: the leader's computation or read is, for it, a wait
/// (counted as a call that joined the flight).
fn waited<T>(fetched: Fetched<T>) -> Fetched<T> {
    // A follower read nothing itself: the leader's hit was read when the leader asked, which
    // may be before this call began (a flight can last a computation, or a process pause).
    // What the value is (stale, a fallback, uncached, held) still shows.
    let source = match fetched.source {
        Source::Computed | Source::Hit => Source::Waited,
        other => other,
    };
    Fetched {
        source,
        via: Via::Flight,
        ..fetched
    }
}
