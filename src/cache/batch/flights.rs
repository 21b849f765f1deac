//! Step 3 of a batch: each key still missing joins this process's flight of that key. A key no
//! one here is computing is led by this call; one that a single-key call or another batch is
//! computing is followed, not computed again.

use std::fmt::{Debug, Display};
use std::sync::Arc;

use serde::{de::DeserializeOwned, Serialize};

use super::lead::Led;
use super::{Batch, Outcome, Settled, Step};
use crate::wait::flight::{Follower, Role};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::Fetched;

impl<'a, C, T, E> Batch<'a, C, T, E>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    /// The misses (the keys without an outcome): one step leading the keys no one in this
    /// process is computing, one step following each of the others. `replace` marks the keys
    /// whose stored value must be replaced.
    pub(super) fn join_flights<'s>(
        &'s self,
        distinct: &[Arc<EntryKeys>],
        outcomes: &[Option<Outcome<T>>],
        replace: &[bool],
    ) -> Vec<Step<'s, T>> {
        let mut led = Vec::new();
        let mut steps: Vec<Step<'s, T>> = Vec::new();
        let missing: Vec<usize> = (0..distinct.len())
            .filter(|&slot| outcomes[slot].is_none())
            .collect();
        let roles = self.cache.core.flights.join_many::<Fetched<T>, E>(
            missing.iter().map(|&slot| distinct[slot].value.as_str()),
            self.cache.core.tags.mark(),
        );
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
            let mut l = Led::new(slot, keys, leader);
            l.replace = replace[slot];
            led.push(l);
        }
        if !led.is_empty() {
            steps.push(Box::pin(self.lead(led)));
        }
        steps
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
            let mark = cache.core.tags.mark();
            let leader = match cache.core.flights.join::<Fetched<T>, E>(&keys.value, mark) {
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
}
