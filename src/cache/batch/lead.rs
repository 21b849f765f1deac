//! Steps 4 and 5 of a batch, up to the computation: the keys this call leads in the process,
//! their one read-or-lock request, and where each answer sends its key (served, computed here,
//! read again because its lock was taken over a value, or handed to the single-key path's
//! wait-or-lock loop because another process holds it).

use std::fmt::{Debug, Display};
use std::sync::Arc;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::{Batch, Outcome, Settled, Step};
use crate::cache::claim::Claim;
use crate::cache::failsafe::Kept;
use crate::cache::fallback::Answer;
use crate::cache::fetch::{Sorted, Start};
use crate::cache::tags::Epochs;
use crate::join::join_all;
use crate::lock::lease::{Acquiring, HeldLock};
use crate::store::StoreExt;
use crate::store::{Blob, ReadOrLock, StoreResult};
use crate::wait::flight::Leader;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Fetched, Source};

/// A key this call leads in the process, until its outcome is known.
pub(super) struct Led<'a, T: Send + Sync + 'static, E: Send + Sync + 'static> {
    slot: usize,
    pub(super) keys: Arc<EntryKeys>,
    /// `None` when the key is in flight here with other value or error types (no sharing).
    leader: Option<Leader<'a, Fetched<T>, E>>,
    /// What the key holds must be replaced (a value past its stale window, or unreadable bytes):
    /// its lock is taken over it, without reading it again.
    pub(super) replace: bool,
    /// The fail-safe's fallback for this key, once its lock is taken: what the key holds then,
    /// past its stale window.
    pub(super) kept: Option<Kept<T>>,
}

impl<'a, T, E> Led<'a, T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    /// The key in `slot`, led by this call (`leader`), with nothing to replace and no fallback yet.
    pub(super) fn new(
        slot: usize,
        keys: Arc<EntryKeys>,
        leader: Option<Leader<'a, Fetched<T>, E>>,
    ) -> Self {
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
    pub(super) fn settle(self, outcome: Outcome<T>) -> (usize, Outcome<T>) {
        if let Some(leader) = self.leader {
            if !matches!(outcome, Err(Error::MissingFromBatch { .. })) {
                leader.finish(&outcome);
            }
        }
        (self.slot, outcome)
    }
}

/// Where the read-or-lock request's answers sent the led keys.
struct Answered<'s, 'a, T: Send + Sync + 'static, E: Send + Sync + 'static> {
    /// Keys whose outcome is known already (a value served, or a backend error).
    settled: Settled<T>,
    /// Keys locked here, to compute.
    computing: Vec<(Led<'a, T, E>, HeldLock)>,
    /// Keys locked over a value that must be replaced: read again before computing.
    taken_over: Vec<(Led<'a, T, E>, HeldLock)>,
    /// Keys to compute without the cache (the backend failed, and that is the fallback).
    uncached: Vec<Led<'a, T, E>>,
    /// One wait-or-lock loop for each key another process holds.
    waits: Vec<Step<'s, T>>,
}

impl<'a, C, T, E> Batch<'a, C, T, E>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    /// The keys this call leads: one read-or-lock request for all of them, then, concurrently,
    /// one computation for those it locked and a wait for each held by another process.
    pub(super) async fn lead(&self, led: Vec<Led<'a, T, E>>) -> Settled<T> {
        let asked = self.read_or_lock(&led).await;
        let mut answered = Answered {
            settled: Vec::new(),
            computing: Vec::new(),
            taken_over: Vec::new(),
            uncached: Vec::new(),
            waits: Vec::new(),
        };
        for (l, (acquiring, sent, answer)) in led.into_iter().zip(asked) {
            self.sort_answer(l, acquiring, sent, answer, &mut answered);
        }
        self.settle_answered(answered).await
    }

    /// Sends one read-or-lock request for the `led` keys; for each, in order, its lock guard,
    /// when the request was sent and the answer. Every guard is armed before the request goes
    /// out: a call dropped while it is in flight frees whatever it was granted.
    async fn read_or_lock(
        &self,
        led: &[Led<'a, T, E>],
    ) -> Vec<(Acquiring, Instant, StoreResult<ReadOrLock>)> {
        let cache = self.cache;
        let mut acquiring: Vec<Acquiring> = led.iter().map(|l| cache.acquiring(&l.keys)).collect();
        let tokens: Vec<Arc<str>> = acquiring.iter().map(Acquiring::token).collect();
        let asked: Vec<Instant> = acquiring.iter_mut().map(Acquiring::sending).collect();
        // Writes of these keys still queued (auto-recovery) go first, checked again here: Redis
        // may have come back since the read failed, and must not answer a key with its old value.
        let keys: Vec<&EntryKeys> = led.iter().map(|l| &*l.keys).collect();
        let replayed = cache.replay_queued(&keys).await;
        let answers = if let Err(e) = replayed {
            led.iter().map(|_| Err(e.clone())).collect()
        } else {
            let requests: Vec<(&EntryKeys, &str, bool)> = led
                .iter()
                .zip(&tokens)
                .map(|(l, token)| (&*l.keys, &**token, !l.replace))
                .collect();
            cache
                .core
                .store
                .read_or_lock_many(&requests, cache.options.lease)
                .await
        };
        acquiring
            .into_iter()
            .zip(asked)
            .zip(answers)
            .map(|((acquiring, asked), answer)| (acquiring, asked, answer))
            .collect()
    }

    /// Sends the led key `l` where its `answer` says: the lock granted (to compute, or to read
    /// again first), a value (served, or replaced after a wait-or-lock loop), the lock held
    /// elsewhere (a wait-or-lock loop), or a backend error (the call's fallback for it).
    fn sort_answer<'s>(
        &'s self,
        l: Led<'a, T, E>,
        mut acquiring: Acquiring,
        asked: Instant,
        answer: StoreResult<ReadOrLock>,
        answered: &mut Answered<'s, 'a, T, E>,
    ) {
        let cache = self.cache;
        match answer {
            Ok(ReadOrLock::Acquired { fence, born }) => {
                let held = acquiring.granted(fence, asked).with_birth(born);
                if l.replace {
                    answered.taken_over.push((l, held));
                } else {
                    answered.computing.push((l, held));
                }
            }
            Ok(ReadOrLock::Value(_)) => {
                // A value landed between the batch's read and its lock request (rare): the
                // key's own loop reads it again with its epochs, which a value needs before it
                // is served (a tag or a clear may have invalidated it), and serves or replaces it.
                acquiring.refused();
                answered.waits.push(Box::pin(self.hold_on(l, Start::Read)));
            }
            Ok(ReadOrLock::Held { expires_in }) => {
                acquiring.refused();
                answered
                    .waits
                    .push(Box::pin(self.hold_on(l, Start::Held(expires_in))));
            }
            Err(e) => {
                // The request may have been granted anyway: the guard frees it as it goes.
                acquiring.failed(&e);
                drop(acquiring);
                // No held copy is looked for: the batch's read looked before.
                if cache.on_backend_failure(&e, false) == Answer::ComputeUncached {
                    // Counted (and logged at most once a minute per reason) as not stored when
                    // it goes to the uncached computation, not warned once per key.
                    cache.not_stored_uncached(l.keys.user(), &e);
                    answered.uncached.push(l);
                } else {
                    let outcome = Err(Error::backend("read-or-lock", e));
                    answered.settled.push(l.settle(outcome));
                }
            }
        }
    }

    /// After the answers: the keys taken over are read again, then the one computation, the
    /// uncached computation and the waits run concurrently.
    async fn settle_answered(&self, answered: Answered<'_, 'a, T, E>) -> Settled<T> {
        let Answered {
            mut settled,
            mut computing,
            taken_over,
            uncached,
            mut waits,
        } = answered;
        if !taken_over.is_empty() {
            let (served, locked) = self.look_again(taken_over).await;
            settled.extend(served);
            computing.extend(locked);
        }
        if !computing.is_empty() {
            waits.push(Box::pin(self.compute(computing)));
        }
        if !uncached.is_empty() {
            waits.push(Box::pin(self.compute_uncached(uncached)));
        }
        for more in join_all(waits).await {
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
        let names = &cache.read_names(&entries);
        let (found, epochs): (Vec<Option<Blob>>, Vec<u64>) = cache
            .core
            .store
            .get_many_with_epochs(&entries, names)
            .await
            .unwrap_or_default();
        let mut epochs = Epochs::of(names, epochs);
        cache.core.tags.note(&epochs);
        let decoded: Vec<_> = found
            .into_iter()
            .zip(&taken_over)
            .map(|(bytes, (l, _))| {
                let entry = bytes
                    .as_ref()
                    .and_then(|bytes| cache.read_stored::<T>(&l.keys, bytes));
                (bytes, entry)
            })
            .collect();
        // A value invalidated by a tag or a clear is neither served nor kept as a fallback;
        // epochs that cannot be read count as raised.
        let entries = decoded.iter().filter_map(|(_, entry)| entry.as_ref());
        let _ = cache.complete_epochs(entries, &mut epochs).await;
        let mut found = decoded.into_iter();
        let mut landed = Vec::new();
        let mut releases = Vec::new();
        let mut locked = Vec::new();
        for (mut l, held) in taken_over {
            let (bytes, entry) = found.next().unwrap_or((None, None));
            let entry = entry.filter(|entry| cache.alive_by(entry, &epochs));
            let now = bytes
                .as_ref()
                .zip(entry)
                .map(|(bytes, entry)| (cache.sort(entry), bytes));
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
            Claim::Backend(e) if cache.on_backend_failure(&e, false) == Answer::ComputeUncached => {
                cache.not_stored_uncached(keys.user(), &e);
                return self.compute_uncached(vec![led]).await;
            }
            Claim::Backend(e) => Err(Error::backend("read-or-lock", e)),
        };
        vec![led.settle(outcome)]
    }
}
