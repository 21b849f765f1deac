//! In-process single flight: per key, one task (the leader) talks to the backend; the others in
//! the process wait for its outcome.
//!
//! Invariants:
//! - the map holds an entry for a key exactly while its leader is alive: the leader's guard removes
//!   it on completion and in `Drop`, so a cancelled or panicking leader leaves nothing behind;
//! - followers of a leader that went away without an outcome are told so and try again, one of
//!   them becoming the next leader (the same contract as tokio's `OnceCell` and moka's
//!   `get_with`);
//! - a caller that knows of an invalidation the leader did not (a higher epoch mark: see
//!   `cache/tags.rs`) does not follow it: the leader's computation may have started before the
//!   invalidation, and its value would be one the caller must not get. It goes alone (and
//!   waits on the distributed lock, then reads and judges the value itself).
//!
//! Explained in the guide: `docs/how-it-works.md` and `docs/guarantees.md` (cancellation and panics).

use std::any::Any;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::signal as watch;

use crate::error::Error;
use crate::sync::lock;

type Outcome<T> = Result<T, Error>;

#[derive(Clone)]
enum State<T> {
    Running,
    Done(Outcome<T>),
    Abandoned,
}

/// One leader's outcome channel. The computation's error type `E` is part of the slot's type,
/// though the outcome does not carry it, so that callers share a flight only when they share
/// `E` too: a caller's [`Error::Compute`] then always holds its own `E`.
struct Slot<T, E> {
    tx: watch::Sender<State<T>>,
    /// The epoch mark the leader knew when it started.
    mark: u64,
    _error: PhantomData<fn() -> E>,
}

/// Key → the running leader's slot, type-erased because each call chooses its own `T` and `E`.
#[derive(Default)]
pub(crate) struct Flights {
    /// The `std` mutex is held only for a map operation, never across an `.await`.
    map: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
}

impl std::fmt::Debug for Flights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flights")
            .field("in_flight", &self.len())
            .finish()
    }
}

pub(crate) enum Role<'a, T: Send + Sync + 'static, E: Send + Sync + 'static> {
    /// Do the work, then hand the outcome to [`Leader::finish`].
    Lead(Leader<'a, T, E>),
    /// Another task is doing it.
    Follow(Follower<T>),
    /// The key is in flight with other types `T`/`E`, or by a leader that started before an
    /// invalidation this caller knows of: go alone, without sharing.
    Alone,
}

impl Flights {
    /// Joins the flight of `key`, knowing the epoch mark `mark` (see the module docs).
    pub(crate) fn join<T, E>(&self, key: &str, mark: u64) -> Role<'_, T, E>
    where
        T: Clone + Send + Sync + 'static,
        E: Send + Sync + 'static,
    {
        self.join_in(&mut lock(&self.map), key, mark)
    }

    /// [`join`](Self::join) for many keys in one step: two batches asking for the same keys at
    /// once cannot each lead part of them (the second follows them all), so a batch's
    /// computation is not split between callers that raced.
    pub(crate) fn join_many<'k, T, E>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
        mark: u64,
    ) -> Vec<Role<'_, T, E>>
    where
        T: Clone + Send + Sync + 'static,
        E: Send + Sync + 'static,
    {
        let mut map = lock(&self.map);
        keys.into_iter()
            .map(|key| self.join_in(&mut map, key, mark))
            .collect()
    }

    fn join_in<T, E>(
        &self,
        map: &mut HashMap<String, Arc<dyn Any + Send + Sync>>,
        key: &str,
        mark: u64,
    ) -> Role<'_, T, E>
    where
        T: Clone + Send + Sync + 'static,
        E: Send + Sync + 'static,
    {
        if let Some(existing) = map.get(key) {
            return match Arc::clone(existing).downcast::<Slot<T, E>>() {
                Ok(slot) if slot.mark >= mark => Role::Follow(Follower {
                    rx: slot.tx.subscribe(),
                    mark: slot.mark,
                }),
                Ok(_) | Err(_) => Role::Alone,
            };
        }
        let slot: Arc<Slot<T, E>> = Arc::new(Slot {
            tx: watch::channel(State::Running).0,
            mark,
            _error: PhantomData,
        });
        map.insert(key.to_owned(), slot.clone());
        Role::Lead(Leader {
            flights: self,
            key: key.to_owned(),
            slot,
            finished: false,
        })
    }

    /// How many keys are in flight (nothing may be left behind after a call ends).
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// A write of `key` was made: the flight running now (if any) read or computed before it,
    /// so calls from now on lead a flight of their own instead of joining it. Its followers
    /// (which began before the write) still get its outcome, and its leader's leaving removes
    /// only its own entry.
    pub(crate) fn detach(&self, key: &str) {
        lock(&self.map).remove(key);
    }

    fn remove(&self, key: &str, slot: &Arc<dyn Any + Send + Sync>) {
        let mut map = lock(&self.map);
        if map.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            map.remove(key);
        }
    }
}

pub(crate) struct Leader<'a, T: Send + Sync + 'static, E: Send + Sync + 'static> {
    flights: &'a Flights,
    key: String,
    slot: Arc<Slot<T, E>>,
    finished: bool,
}

impl<T, E> Leader<'_, T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    /// Hands the outcome to every follower and leaves the map.
    pub(crate) fn finish(mut self, outcome: &Outcome<T>) {
        self.slot.tx.send_replace(State::Done(outcome.clone()));
        self.finished = true;
        self.leave();
    }
}

impl<T: Send + Sync + 'static, E: Send + Sync + 'static> Leader<'_, T, E> {
    fn leave(&self) {
        let slot: Arc<dyn Any + Send + Sync> = self.slot.clone();
        self.flights.remove(&self.key, &slot);
    }
}

impl<T: Send + Sync + 'static, E: Send + Sync + 'static> Drop for Leader<'_, T, E> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Cancelled or panicking: release the followers so that one of them takes over.
        self.slot.tx.send_replace(State::Abandoned);
        self.leave();
    }
}

pub(crate) struct Follower<T> {
    rx: watch::Receiver<State<T>>,
    /// The epoch mark its leader knew when it started.
    mark: u64,
}

impl<T: Clone> Follower<T> {
    /// The epoch mark the leader knew when it started.
    pub(crate) fn mark(&self) -> u64 {
        self.mark
    }

    /// The leader's outcome, or `None` if it went away without one.
    pub(crate) async fn outcome(mut self) -> Option<Outcome<T>> {
        let state = self
            .rx
            .wait_for(|s| !matches!(s, State::Running))
            .await
            .ok()?;
        match state {
            State::Done(outcome) => Some(outcome),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_that_knows_a_newer_epoch_does_not_follow() {
        let flights = Flights::default();
        let Role::Lead(_leader) = flights.join::<u32, ()>("k", 5) else {
            panic!("the first caller leads");
        };
        let Role::Follow(follower) = flights.join::<u32, ()>("k", 5) else {
            panic!("a caller that knows what the leader knew follows");
        };
        assert_eq!(follower.mark(), 5);
        assert!(matches!(flights.join::<u32, ()>("k", 4), Role::Follow(_)));
        assert!(
            matches!(flights.join::<u32, ()>("k", 6), Role::Alone),
            "an invalidation the leader did not know of: alone"
        );
    }

    #[tokio::test]
    async fn followers_get_the_leaders_outcome_and_the_map_empties() {
        let flights = Flights::default();
        let Role::Lead(leader) = flights.join::<u32, ()>("k", 0) else {
            panic!("the first caller leads");
        };
        let Role::Follow(follower) = flights.join::<u32, ()>("k", 0) else {
            panic!("the second caller follows");
        };
        assert!(matches!(flights.join::<String, ()>("k", 0), Role::Alone));
        leader.finish(&Ok(7));
        assert_eq!(flights.len(), 0);
        assert!(matches!(follower.outcome().await, Some(Ok(7))));
    }

    #[tokio::test]
    async fn a_dropped_leader_releases_its_followers() {
        let flights = Flights::default();
        let leader = flights.join::<u32, ()>("k", 0);
        let Role::Follow(follower) = flights.join::<u32, ()>("k", 0) else {
            panic!("the second caller follows");
        };
        drop(leader);
        assert_eq!(flights.len(), 0);
        assert!(follower.outcome().await.is_none());
    }
}
