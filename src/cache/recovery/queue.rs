//! The queue of writes that could not reach the backend: per key one intent, the newest; bounded
//! in count and in value bytes; replayed oldest first. Locked state only: no I/O, no `.await`.
//!
//! Invariants (kept by every method, under the one mutex of [`Recovery`](super::Recovery)):
//! - `slots` and `order` name the same keys: `order[slot.seq] == key` for every slot;
//! - `slots.len() <= max_entries` and `bytes` (the sum of the queued sets' value bytes)
//!   `<= max_bytes`: a write that does not fit is refused, nothing already queued is dropped;
//! - a slot's `seq` changes whenever its intent is replaced, so a replay that finishes after a
//!   newer intent arrived does not remove the newer one ([`Queue::complete`]);
//! - a key's gate (the async mutex one replay of the key holds) outlives the replacement of its
//!   intent, so two replays of one key never overlap.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::error::RecoveryLimit;
use crate::wire::key::EntryKeys;

/// What the caller asked for and the backend did not get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Intent {
    /// `set` of these bytes. Replayed as an invalidation (see `replay.rs`): the bytes are
    /// only weighed against `max_bytes`.
    Set { bytes: Vec<u8> },
    /// `invalidate` (or one key of `invalidate_many`).
    Invalidate,
}

impl Intent {
    /// The value bytes it holds, counted against `max_bytes`.
    fn bytes(&self) -> usize {
        match self {
            Intent::Set { bytes, .. } => bytes.len(),
            Intent::Invalidate => 0,
        }
    }
}

/// One queued write of one key.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) keys: EntryKeys,
    pub(crate) intent: Intent,
    /// The call's lease: how long the bumped fence is kept, as the direct write would have.
    pub(crate) lease: Duration,
}

/// A value this process computed for a key while its write waited, served in its place until
/// the replay (typed by the caller: `Recovery::held` hands it back only as the type it was held
/// as).
pub(crate) type Held = Arc<dyn Any + Send + Sync>;

/// A key's place in the queue.
struct Slot {
    seq: u64,
    queued: Queued,
    /// Held by the one replay of this key in progress (the background task's or a reader's).
    gate: Arc<tokio::sync::Mutex<()>>,
    /// The value computed for the key since this intent was queued: it lives exactly as long
    /// as the intent (a newer write, a replay or a direct write drops it with the slot).
    held: Option<Held>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("seq", &self.seq)
            .field("queued", &self.queued)
            .field("held", &self.held.is_some())
            .finish()
    }
}

/// A key's intent, as a replay takes it: its sequence number (to complete exactly it), the
/// write, and the key's gate.
pub(crate) type Pending = (u64, Queued, Arc<tokio::sync::Mutex<()>>);

/// The queue itself.
#[derive(Debug)]
pub(crate) struct Queue {
    /// Per value key (`ns:{k}`), its intent.
    slots: HashMap<String, Slot>,
    /// The keys oldest first, by the sequence number of their current intent.
    order: BTreeMap<u64, String>,
    next_seq: u64,
    /// Value bytes of the queued sets.
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl Queue {
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> Self {
        Queue {
            slots: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            max_entries,
            max_bytes,
        }
    }

    /// How many keys have an intent queued.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Queues every write of `batch` (a later one of a key replacing an earlier one, each the
    /// newest of its key, moved to the back), or none: `Err` names the bound it would pass.
    /// A refused batch still leaves no older `set` of its keys behind to be replayed over the
    /// writes the caller could not make: such a set is queued as an invalidation instead (it
    /// always fits: no new key, fewer bytes).
    pub(crate) fn push(&mut self, batch: Vec<Queued>) -> Result<(), RecoveryLimit> {
        // The batch's newest intent per key, in the batch's order.
        let mut newest: HashMap<String, usize> = HashMap::new();
        for (i, queued) in batch.iter().enumerate() {
            newest.insert(queued.keys.value.clone(), i);
        }
        let mut new_keys = 0;
        let mut bytes = self.bytes;
        for (key, &i) in &newest {
            match self.slots.get(key) {
                Some(slot) => bytes -= slot.queued.intent.bytes(),
                None => new_keys += 1,
            }
            bytes = bytes.saturating_add(batch[i].intent.bytes());
        }
        let refused = if self.slots.len().saturating_add(new_keys) > self.max_entries {
            Some(RecoveryLimit::Entries(self.max_entries))
        } else if bytes > self.max_bytes {
            Some(RecoveryLimit::Bytes(self.max_bytes))
        } else {
            None
        };
        if let Some(limit) = refused {
            for key in newest.keys() {
                self.downgrade(key);
            }
            return Err(limit);
        }
        for (i, queued) in batch.into_iter().enumerate() {
            if newest.get(queued.keys.value.as_str()) == Some(&i) {
                self.replace(queued);
            }
        }
        Ok(())
    }

    /// Puts `queued` at the back as its key's one intent.
    fn replace(&mut self, queued: Queued) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += queued.intent.bytes();
        let key = queued.keys.value.clone();
        match self.slots.get_mut(&key) {
            Some(slot) => {
                self.bytes -= slot.queued.intent.bytes();
                self.order.remove(&slot.seq);
                slot.seq = seq;
                slot.queued = queued;
                // A newer write: what was computed before it is older than the caller's write.
                slot.held = None;
            }
            None => {
                let gate = Arc::default();
                let held = None;
                self.slots.insert(
                    key.clone(),
                    Slot {
                        seq,
                        queued,
                        gate,
                        held,
                    },
                );
            }
        }
        self.order.insert(seq, key);
    }

    /// A queued `set` of `key` becomes an invalidation, in place.
    fn downgrade(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key) {
            self.bytes -= slot.queued.intent.bytes();
            slot.queued.intent = Intent::Invalidate;
        }
    }

    /// A write of `key` reached the backend directly: it is newer than anything queued for it.
    pub(crate) fn forget(&mut self, key: &str) {
        if let Some(slot) = self.slots.remove(key) {
            self.order.remove(&slot.seq);
            self.bytes -= slot.queued.intent.bytes();
        }
    }

    /// The intent of `key`, if one is queued.
    pub(crate) fn pending(&self, key: &str) -> Option<Pending> {
        let slot = self.slots.get(key)?;
        Some((slot.seq, slot.queued.clone(), Arc::clone(&slot.gate)))
    }

    /// Whether `key` has an intent queued: its sequence number and the value held for it.
    pub(crate) fn held(&self, key: &str) -> Option<(u64, Option<Held>)> {
        let slot = self.slots.get(key)?;
        Some((slot.seq, slot.held.clone()))
    }

    /// Holds `value` for `key` while its intent `seq` waits (not for a newer one: the value was
    /// computed before that write).
    pub(crate) fn hold(&mut self, key: &str, seq: u64, value: Held) {
        if let Some(slot) = self.slots.get_mut(key).filter(|slot| slot.seq == seq) {
            slot.held = Some(value);
        }
    }

    /// The oldest queued key.
    pub(crate) fn oldest(&self) -> Option<String> {
        self.order.values().next().cloned()
    }

    /// The replay of `key`'s intent `seq` is done: removed, unless a newer intent replaced it.
    pub(crate) fn complete(&mut self, key: &str, seq: u64) -> bool {
        if self.slots.get(key).is_some_and(|slot| slot.seq == seq) {
            self.forget(key);
            return true;
        }
        false
    }

    /// `key`'s intent `seq` goes to the back (a replay the backend refused: the others go first).
    pub(crate) fn move_to_back(&mut self, key: &str, seq: u64) {
        let Some(slot) = self.slots.get_mut(key).filter(|slot| slot.seq == seq) else {
            return;
        };
        self.order.remove(&seq);
        slot.seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(slot.seq, key.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, bytes: usize) -> Queued {
        queued(
            key,
            Intent::Set {
                bytes: vec![7; bytes],
            },
        )
    }

    fn invalidate(key: &str) -> Queued {
        queued(key, Intent::Invalidate)
    }

    fn queued(key: &str, intent: Intent) -> Queued {
        Queued {
            keys: EntryKeys::new("ns", key).unwrap(),
            intent,
            lease: Duration::from_secs(30),
        }
    }

    fn value_key(key: &str) -> String {
        EntryKeys::new("ns", key).unwrap().value
    }

    fn intent_of(q: &Queue, key: &str) -> Option<Intent> {
        q.pending(&value_key(key))
            .map(|(_, queued, _)| queued.intent)
    }

    /// Keys oldest first, as the replay takes them.
    fn order(q: &Queue) -> Vec<String> {
        q.order.values().cloned().collect()
    }

    #[tokio::test]
    async fn the_newest_intent_of_a_key_wins_and_moves_to_the_back() {
        let mut q = Queue::new(10, 1000);
        q.push(vec![set("a", 3)]).unwrap();
        q.push(vec![set("b", 4)]).unwrap();
        q.push(vec![invalidate("a")]).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(intent_of(&q, "a"), Some(Intent::Invalidate));
        assert_eq!(order(&q), [value_key("b"), value_key("a")]);
        assert_eq!(q.bytes, 4, "the replaced set's bytes are released");
        q.push(vec![set("a", 5)]).unwrap();
        assert!(matches!(intent_of(&q, "a"), Some(Intent::Set { bytes, .. }) if bytes.len() == 5));
        assert_eq!(q.bytes, 9);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_keeps_what_it_has() {
        let mut q = Queue::new(2, 1000);
        q.push(vec![invalidate("a"), invalidate("b")]).unwrap();
        assert_eq!(
            q.push(vec![invalidate("c")]),
            Err(RecoveryLimit::Entries(2))
        );
        assert_eq!(order(&q), [value_key("a"), value_key("b")]);
        // A key already queued still fits: its intent is replaced, the count does not grow.
        q.push(vec![set("a", 10)]).unwrap();
        assert_eq!(q.len(), 2);

        let mut q = Queue::new(10, 8);
        q.push(vec![set("a", 5)]).unwrap();
        assert_eq!(q.push(vec![set("b", 4)]), Err(RecoveryLimit::Bytes(8)));
        assert_eq!(q.len(), 1);
        assert_eq!(q.bytes, 5);
    }

    #[tokio::test]
    async fn a_batch_is_queued_whole_or_not_at_all() {
        let mut q = Queue::new(3, 1000);
        q.push(vec![invalidate("a")]).unwrap();
        let refused = q.push(vec![
            invalidate("a"),
            invalidate("b"),
            invalidate("c"),
            invalidate("d"),
        ]);
        assert_eq!(refused, Err(RecoveryLimit::Entries(3)));
        assert_eq!(order(&q), [value_key("a")], "none of the batch was queued");
        // Repeated keys count once.
        q.push(vec![invalidate("b"), invalidate("c"), invalidate("b")])
            .unwrap();
        assert_eq!(q.len(), 3);
    }

    #[tokio::test]
    async fn a_refused_write_leaves_no_older_set_of_its_key_to_replay() {
        let mut q = Queue::new(10, 8);
        q.push(vec![set("a", 5)]).unwrap();
        // The newer value does not fit: the older one must not be written back later.
        assert_eq!(q.push(vec![set("a", 9)]), Err(RecoveryLimit::Bytes(8)));
        assert_eq!(intent_of(&q, "a"), Some(Intent::Invalidate));
        assert_eq!(q.bytes, 0);
    }

    #[tokio::test]
    async fn a_replay_completes_only_the_intent_it_replayed() {
        let mut q = Queue::new(10, 1000);
        q.push(vec![set("a", 3)]).unwrap();
        let (seq, _, _) = q.pending(&value_key("a")).unwrap();
        // A newer write arrives while the replay runs...
        q.push(vec![invalidate("a")]).unwrap();
        assert!(!q.complete(&value_key("a"), seq), "the newer intent stays");
        assert_eq!(intent_of(&q, "a"), Some(Intent::Invalidate));
        let (seq, _, _) = q.pending(&value_key("a")).unwrap();
        assert!(q.complete(&value_key("a"), seq));
        assert_eq!((q.len(), q.bytes, q.order.len()), (0, 0, 0));
    }

    #[tokio::test]
    async fn a_direct_write_forgets_the_queued_intent_and_a_refused_replay_goes_last() {
        let mut q = Queue::new(10, 1000);
        q.push(vec![set("a", 3), invalidate("b"), invalidate("c")])
            .unwrap();
        q.forget(&value_key("b"));
        assert_eq!(order(&q), [value_key("a"), value_key("c")]);
        let (seq, _, gate) = q.pending(&value_key("a")).unwrap();
        q.move_to_back(&value_key("a"), seq);
        assert_eq!(q.oldest(), Some(value_key("c")));
        let (_, _, same_gate) = q.pending(&value_key("a")).unwrap();
        assert!(Arc::ptr_eq(&gate, &same_gate), "one gate per key");
        assert_eq!(q.bytes, 3);
    }
}
