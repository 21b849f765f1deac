//! The plan of a batch's keys: each distinct key once, in the order first asked, and the way
//! back from each distinct key's outcome to every place that asked for it.

use std::collections::HashMap;
use std::sync::Arc;

use super::{unsettled, Outcome};
use crate::wire::key::EntryKeys;
use crate::Error;

/// The keys of one call, each fetched once however often it was asked.
pub(super) struct Plan {
    /// Each distinct valid key once, in the order first asked: the "slots" every step uses.
    pub(super) distinct: Vec<Arc<EntryKeys>>,
    /// For each asked key, in order, its slot in `distinct`; a bad key is its own error.
    places: Vec<Result<usize, Error>>,
}

impl Plan {
    /// The plan of `asked` under `namespace`.
    pub(super) fn new(namespace: &str, asked: &[String]) -> Self {
        let mut distinct: Vec<Arc<EntryKeys>> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let places = asked
            .iter()
            .map(|key| {
                if let Some(&slot) = seen.get(key.as_str()) {
                    return Ok(slot);
                }
                let keys = EntryKeys::new(namespace, key)?;
                distinct.push(Arc::new(keys));
                seen.insert(key, distinct.len() - 1);
                Ok(distinct.len() - 1)
            })
            .collect();
        Plan { distinct, places }
    }

    /// One outcome per asked key, in order, from `settled` (one per distinct key). Each outcome
    /// moves to the last place that asked for it; earlier duplicates get copies.
    pub(super) fn hand_out<T: Clone>(self, settled: Vec<Outcome<T>>) -> Vec<Outcome<T>> {
        let mut uses = vec![0usize; settled.len()];
        for slot in self.places.iter().flatten() {
            uses[*slot] += 1;
        }
        let mut settled: Vec<Option<Outcome<T>>> = settled.into_iter().map(Some).collect();
        self.places
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
