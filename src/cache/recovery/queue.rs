//! The queue of writes that could not reach the backend: per key (or epoch) one intent, the
//! newest; bounded in count and in value bytes; replayed oldest first. Locked state only: no
//! I/O, no `.await`.
//!
//! Invariants (kept by every method, under the one mutex of [`Recovery`](super::Recovery)):
//! - `slots` and `order` name the same keys: `order[slot.seq] == key` for every slot;
//! - `raises` names exactly the slots whose intent raises an epoch, and while a clear is
//!   queued no tag's raise is (the clear covers them: see [`Queue::push`]);
//! - `slots.len() <= max_entries` and `bytes` (the sum of the queued sets' value bytes)
//!   `<= max_bytes`: a write that does not fit is refused, nothing already queued is dropped;
//! - a slot's `seq` changes whenever its intent is replaced, so a replay that finishes after a
//!   newer intent arrived does not remove the newer one ([`Queue::complete`]);
//! - a key's gate (the async mutex one replay of the key holds) outlives the replacement of its
//!   intent, so two replays of one key never overlap.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::error::RecoveryLimit;
use crate::wire::key::EntryKeys;

/// What the caller asked for and the backend did not get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Intent {
    /// `set` of these bytes. Replayed as an invalidation (see `replay.rs`): the bytes are
    /// only weighed against `max_bytes`.
    Set { keys: EntryKeys, bytes: Vec<u8> },
    /// `invalidate` (or one key of `invalidate_many`).
    Invalidate { keys: EntryKeys },
    /// `invalidate_tag` (or one tag of `invalidate_tags`): raise the epoch `name`, the tag's.
    RaiseTag { name: String },
    /// `clear`: raise the namespace's epoch, `name` (its clear key).
    Clear { name: String },
}

impl Intent {
    /// The value bytes it holds, counted against `max_bytes`.
    fn bytes(&self) -> usize {
        match self {
            Intent::Set { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }

    /// The key it writes: a value key (`ns:{k}`), or an epoch's key. One slot each.
    pub(crate) fn slot(&self) -> &str {
        match self {
            Intent::Set { keys, .. } | Intent::Invalidate { keys } => &keys.value,
            Intent::RaiseTag { name } | Intent::Clear { name } => name,
        }
    }

    /// Whether it raises an epoch (every read replays those first: see `Recovery::replay`).
    fn raises(&self) -> bool {
        matches!(self, Intent::RaiseTag { .. } | Intent::Clear { .. })
    }
}

/// One queued write of one key or epoch.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) intent: Intent,
    /// The call's lease: how long the bumped fence is kept, as the direct write would have
    /// (an epoch has no fence: unused by a raise).
    pub(crate) lease: Duration,
}

/// A value this process computed for a key while its write waited, served in its place until
/// the replay (typed by the caller: `Recovery::held` hands it back only as the type it was held
/// as).
pub(crate) type Held = Arc<dyn Any + Send + Sync>;

/// A key's place in the queue.
#[derive(Debug)]
struct Slot {
    seq: u64,
    queued: Queued,
    /// Held by the one replay of this key in progress (the background task's or a reader's).
    gate: Arc<tokio::sync::Mutex<()>>,
    /// The value computed for the key since this intent was queued: it lives exactly as long
    /// as the intent (a newer write, a replay or a direct write drops it with the slot).
    held: Option<Held>,
    /// What a value being computed must still find to be held: `seq` when the intent was
    /// queued or a raise entered, unchanged when a refused replay only moves the intent back.
    holds: u64,
}

/// A key's intent, as a replay takes it: its sequence number (to complete exactly it), the
/// write, and the key's gate.
pub(crate) type Pending = (u64, Queued, Arc<tokio::sync::Mutex<()>>);

/// The queue itself.
#[derive(Debug)]
pub(crate) struct Queue {
    /// Per value key (`ns:{k}`), its intent.
    /// Hashed by [`Hasher`](crate::random::Hasher): some steps go over every slot in its order.
    slots: HashMap<String, Slot, crate::random::Hasher>,
    /// The keys oldest first, by the sequence number of their current intent.
    order: BTreeMap<u64, String>,
    /// The slots whose intent raises an epoch (a tag's or the clear key): a read replays them
    /// all before it reads anything, so they are found without a walk over every slot.
    raises: BTreeSet<String>,
    next_seq: u64,
    /// Value bytes of the queued sets.
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl Queue {
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> Self {
        Queue {
            slots: HashMap::default(),
            order: BTreeMap::new(),
            raises: BTreeSet::new(),
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
    ///
    /// A clear covers the raises of tags: a clear entering drops those queued (and makes room),
    /// and a tag's raise while a clear waits is queued as that clear again (see [`Queue::covered`]).
    pub(crate) fn push(&mut self, batch: Vec<Queued>) -> Result<(), RecoveryLimit> {
        let batch = self.covered(batch);
        // The batch's newest intent per key, in the batch's order.
        let mut newest: HashMap<String, usize, crate::random::Hasher> = HashMap::default();
        for (i, queued) in batch.iter().enumerate() {
            newest.insert(queued.intent.slot().to_owned(), i);
        }
        let clears = batch
            .iter()
            .any(|queued| matches!(queued.intent, Intent::Clear { .. }));
        let dropped = if clears {
            self.tag_raises()
        } else {
            Vec::new()
        };
        let mut new_keys = 0;
        let mut bytes = self.bytes;
        for (key, &i) in &newest {
            match self.slots.get(key) {
                Some(slot) => bytes -= slot.queued.intent.bytes(),
                None => new_keys += 1,
            }
            bytes = bytes.saturating_add(batch[i].intent.bytes());
        }
        let entries = (self.slots.len() - dropped.len()).saturating_add(new_keys);
        let refused = if entries > self.max_entries {
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
        for key in &dropped {
            self.forget(key);
        }
        let raises = batch.iter().any(|queued| queued.intent.raises());
        for (i, queued) in batch.into_iter().enumerate() {
            if newest.get(queued.intent.slot()) == Some(&i) {
                self.replace(queued);
            }
        }
        if raises {
            self.renew();
        }
        Ok(())
    }

    /// A raise entered: every value held for a key was computed before it, and may be one it
    /// kills, so none is held any more; and every intent takes a new sequence number (in the
    /// same order), so that a value being computed now is not held either ([`Queue::hold`]
    /// checks it). A replay in progress then completes nothing and runs again: harmless.
    fn renew(&mut self) {
        for (_, key) in std::mem::take(&mut self.order) {
            let seq = self.next_seq;
            self.next_seq += 1;
            if let Some(slot) = self.slots.get_mut(&key) {
                slot.seq = seq;
                slot.held = None;
                slot.holds = seq;
            }
            self.order.insert(seq, key);
        }
    }

    /// `batch` with each tag's raise turned into the clear, when a clear is queued or in the
    /// batch: the clear's replay raises the namespace's epoch past every value the tag's would
    /// kill. Queued anew, the clear takes a new sequence number, so a replay of it that read
    /// its floor before this call does not complete it: it runs again, after the call.
    fn covered(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let queued_clear = self
            .raises
            .iter()
            .filter_map(|key| self.slots.get(key))
            .map(|slot| &slot.queued);
        let clear = batch
            .iter()
            .chain(queued_clear)
            .find_map(|queued| match &queued.intent {
                Intent::Clear { name } => Some(name.clone()),
                _ => None,
            });
        let Some(name) = clear else {
            return batch;
        };
        batch
            .into_iter()
            .map(|queued| match queued.intent {
                Intent::RaiseTag { .. } => Queued {
                    intent: Intent::Clear { name: name.clone() },
                    ..queued
                },
                _ => queued,
            })
            .collect()
    }

    /// The queued raises of tags (not the clear).
    fn tag_raises(&self) -> Vec<String> {
        self.raises
            .iter()
            .filter(|key| {
                (self.slots.get(*key))
                    .is_some_and(|slot| matches!(slot.queued.intent, Intent::RaiseTag { .. }))
            })
            .cloned()
            .collect()
    }

    /// Puts `queued` at the back as its key's one intent.
    fn replace(&mut self, queued: Queued) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += queued.intent.bytes();
        let key = queued.intent.slot().to_owned();
        if queued.intent.raises() {
            self.raises.insert(key.clone());
        }
        match self.slots.get_mut(&key) {
            Some(slot) => {
                self.bytes -= slot.queued.intent.bytes();
                self.order.remove(&slot.seq);
                slot.seq = seq;
                slot.queued = queued;
                // A newer write: what was computed before it is older than the caller's write.
                slot.held = None;
                slot.holds = seq;
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
                        holds: seq,
                    },
                );
            }
        }
        self.order.insert(seq, key);
    }

    /// A queued `set` of `key` becomes an invalidation, in place.
    fn downgrade(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key) {
            if let Intent::Set { keys, .. } = &slot.queued.intent {
                self.bytes -= slot.queued.intent.bytes();
                slot.queued.intent = Intent::Invalidate { keys: keys.clone() };
            }
        }
    }

    /// A write of `key` (a value key or an epoch's) reached the backend directly: it is newer
    /// than anything queued for it.
    pub(crate) fn forget(&mut self, key: &str) {
        if let Some(slot) = self.slots.remove(key) {
            self.order.remove(&slot.seq);
            self.raises.remove(key);
            self.bytes -= slot.queued.intent.bytes();
        }
    }

    /// A clear reached the backend directly: every queued raise (the clear's, the tags') is
    /// older, and covered by it.
    pub(crate) fn forget_raises(&mut self) {
        let raises: Vec<String> = self.raises.iter().cloned().collect();
        for key in raises {
            self.forget(&key);
        }
    }

    /// An epoch was raised directly (`invalidate_tag`, `clear`): a value held for a queued key
    /// may be one it kills, so none is held any more, nor will a value being computed now be
    /// (its mark moves on). The intents keep their places and sequence numbers: a replay in
    /// progress still completes its own.
    pub(crate) fn drop_held(&mut self) {
        let next_seq = &mut self.next_seq;
        for slot in self.slots.values_mut() {
            slot.held = None;
            slot.holds = *next_seq;
            *next_seq += 1;
        }
    }

    /// The epochs with a raise queued, to replay before any read.
    pub(crate) fn raises(&self) -> Vec<String> {
        self.raises.iter().cloned().collect()
    }

    /// The intent of `key`, if one is queued.
    pub(crate) fn pending(&self, key: &str) -> Option<Pending> {
        let slot = self.slots.get(key)?;
        Some((slot.seq, slot.queued.clone(), Arc::clone(&slot.gate)))
    }

    /// Whether `key` has an intent queued: the mark a value computed now must still find to be
    /// held ([`hold`](Self::hold)), and the value held for it.
    pub(crate) fn held(&self, key: &str) -> Option<(u64, Option<Held>)> {
        let slot = self.slots.get(key)?;
        Some((slot.holds, slot.held.clone()))
    }

    /// Holds `value` for `key` while its intent `seq` waits (not for a newer one: the value was
    /// computed before that write).
    pub(crate) fn hold(&mut self, key: &str, seq: u64, value: Held) {
        if let Some(slot) = self.slots.get_mut(key).filter(|slot| slot.holds == seq) {
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
        queued(Intent::Set {
            keys: keys(key),
            bytes: vec![7; bytes],
        })
    }

    fn invalidate(key: &str) -> Queued {
        queued(Intent::Invalidate { keys: keys(key) })
    }

    fn tag(name: &str) -> Queued {
        queued(Intent::RaiseTag {
            name: name.to_owned(),
        })
    }

    fn clear() -> Queued {
        queued(Intent::Clear {
            name: "ns:{%c}".to_owned(),
        })
    }

    fn keys(key: &str) -> EntryKeys {
        EntryKeys::new("ns", key).unwrap()
    }

    fn queued(intent: Intent) -> Queued {
        Queued {
            intent,
            lease: Duration::from_secs(30),
        }
    }

    fn invalidated(key: &str) -> Option<Intent> {
        Some(Intent::Invalidate { keys: keys(key) })
    }

    fn value_key(key: &str) -> String {
        EntryKeys::new("ns", key).unwrap().value
    }

    fn intent_of(q: &Queue, key: &str) -> Option<Intent> {
        q.pending(&value_key(key))
            .map(|(_, queued, _)| queued.intent)
    }

    /// The slots oldest first, with their intents' kinds, as the replay takes them.
    fn kinds(q: &Queue) -> Vec<(String, &'static str)> {
        q.order
            .values()
            .map(|key| {
                let kind = match q.slots[key].queued.intent {
                    Intent::Set { .. } => "set",
                    Intent::Invalidate { .. } => "invalidate",
                    Intent::RaiseTag { .. } => "tag",
                    Intent::Clear { .. } => "clear",
                };
                (key.clone(), kind)
            })
            .collect()
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
        assert_eq!(intent_of(&q, "a"), invalidated("a"));
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
        assert_eq!(intent_of(&q, "a"), invalidated("a"));
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
        assert_eq!(intent_of(&q, "a"), invalidated("a"));
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

    #[tokio::test]
    async fn a_tag_queued_twice_is_one_entry_and_raises_are_found_without_a_walk() {
        let mut q = Queue::new(10, 1000);
        q.push(vec![tag("ns:{%t:a}"), invalidate("k")]).unwrap();
        q.push(vec![tag("ns:{%t:a}"), tag("ns:{%t:b}"), tag("ns:{%t:a}")])
            .unwrap();
        assert_eq!(q.len(), 3);
        assert_eq!(q.raises(), ["ns:{%t:a}", "ns:{%t:b}"]);
        q.forget("ns:{%t:a}");
        assert_eq!(q.raises(), ["ns:{%t:b}"]);
    }

    #[tokio::test]
    async fn a_clear_covers_the_queued_tags_and_those_queued_after_it() {
        let mut q = Queue::new(3, 1000);
        q.push(vec![tag("ns:{%t:a}"), tag("ns:{%t:b}"), invalidate("k")])
            .unwrap();
        // The queue is full, but the clear makes room: the tags it covers leave.
        q.push(vec![clear()]).unwrap();
        assert_eq!(
            kinds(&q),
            [(value_key("k"), "invalidate"), ("ns:{%c}".into(), "clear")]
        );
        let (seq, _, _) = q.pending("ns:{%c}").unwrap();
        // A tag while the clear waits is the clear again, with a new sequence: a replay of the
        // clear that started before it does not complete it.
        q.push(vec![tag("ns:{%t:c}")]).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.raises(), ["ns:{%c}"]);
        assert!(!q.complete("ns:{%c}", seq));
        // A clear applied directly covers every queued raise; keys stay.
        q.forget_raises();
        assert_eq!(kinds(&q), [(value_key("k"), "invalidate")]);
        assert!(q.raises().is_empty());
    }

    #[tokio::test]
    async fn a_full_queue_refuses_a_tag() {
        let mut q = Queue::new(1, 1000);
        q.push(vec![invalidate("k")]).unwrap();
        assert_eq!(
            q.push(vec![tag("ns:{%t:a}")]),
            Err(RecoveryLimit::Entries(1))
        );
        assert_eq!(q.push(vec![clear()]), Err(RecoveryLimit::Entries(1)));
        assert!(q.raises().is_empty());
    }

    #[tokio::test]
    async fn a_refused_replay_moved_back_still_holds_what_is_being_computed() {
        let mut q = Queue::new(10, 1 << 20);
        q.push(vec![invalidate("a"), invalidate("b")]).unwrap();
        let (mark, _) = q.held(&value_key("a")).unwrap();
        // The background replay of `a` was refused meanwhile: `a` goes behind `b`.
        let (seq, _, _) = q.pending(&value_key("a")).unwrap();
        q.move_to_back(&value_key("a"), seq);
        assert_eq!(order(&q), [value_key("b"), value_key("a")]);
        q.hold(&value_key("a"), mark, Arc::new(7u32));
        let (_, held) = q.held(&value_key("a")).unwrap();
        assert!(held.is_some_and(|held| held.downcast_ref::<u32>() == Some(&7)));
    }

    #[tokio::test]
    async fn a_direct_raise_drops_every_held_value_and_what_is_being_computed() {
        let mut q = Queue::new(10, 1 << 20);
        q.push(vec![invalidate("a"), invalidate("b")]).unwrap();
        let (mark_a, _) = q.held(&value_key("a")).unwrap();
        q.hold(&value_key("a"), mark_a, Arc::new(1u32));
        let (mark_b, _) = q.held(&value_key("b")).unwrap();
        let (seq_a, _, _) = q.pending(&value_key("a")).unwrap();
        q.drop_held();
        assert!(
            q.held(&value_key("a")).unwrap().1.is_none(),
            "the held value goes"
        );
        q.hold(&value_key("b"), mark_b, Arc::new(2u32));
        assert!(
            q.held(&value_key("b")).unwrap().1.is_none(),
            "b was being computed before it"
        );
        assert!(
            q.complete(&value_key("a"), seq_a),
            "the replay in progress completes"
        );
    }

    #[tokio::test]
    async fn a_raise_drops_every_held_value_and_what_is_being_computed() {
        let mut q = Queue::new(10, 1000);
        q.push(vec![invalidate("a"), invalidate("b")]).unwrap();
        let (seq_a, _) = q.held(&value_key("a")).unwrap();
        q.hold(&value_key("a"), seq_a, Arc::new(1u32));
        let (seq_b, _) = q.held(&value_key("b")).unwrap();
        q.push(vec![tag("ns:{%t:t}")]).unwrap();
        assert!(
            q.held(&value_key("a")).unwrap().1.is_none(),
            "computed before the tag"
        );
        // b's computation started before the tag: its value is not held when it lands.
        q.hold(&value_key("b"), seq_b, Arc::new(2u32));
        assert!(q.held(&value_key("b")).unwrap().1.is_none());
        assert_eq!(
            order(&q),
            [value_key("a"), value_key("b"), "ns:{%t:t}".to_owned()],
            "the order stays"
        );
    }
}
