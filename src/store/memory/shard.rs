//! One shard of the embedded store: the entries whose value key hashes to it, and the two
//! eviction queues of those that hold a value.
//!
//! Invariants:
//! - every key of one entry (value, lock, fencing counter, last run) lives in one [`Entry`],
//!   found by the value key, so an operation touches one entry of one shard;
//! - a slot is in a queue if and only if its entry holds a value, and its `weight` is then
//!   what the store's totals count for it (zero otherwise);
//! - a slot whose entry holds nothing is removed at once, so dead entries cost memory only
//!   until an operation or the sweep hand passes them.
//!
//! Eviction is S3-FIFO (Yang et al., SOSP 2023), spread over the shards: a new value enters the
//! probation queue; one read while there promotes it to the main queue when it reaches the head,
//! otherwise it is evicted. The main queue gives each value as many second chances as it was
//! read (up to 3) since it last passed the head. A scan of keys read once passes through the
//! probation queue and never displaces a key that is read again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use super::entry::{Entry, Value};

/// No slot: the end of a queue.
const NIL: u32 = u32::MAX;

/// How many reads a value in the main queue is credited with at most: each is one second chance.
const MAX_FREQ: u8 = 3;

/// The counts the bounds apply to, summed over the shards (relaxed: each is a tally).
#[derive(Debug, Default)]
pub(super) struct Totals {
    /// Values held.
    pub(super) values: AtomicU64,
    /// Their weights (see [`Value::weight`]).
    pub(super) bytes: AtomicU64,
    /// Values in a probation queue.
    pub(super) probation: AtomicU64,
}

impl Totals {
    fn add(&self, counter: &AtomicU64, delta: i64) {
        if delta >= 0 {
            counter.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
        } else {
            counter.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    None,
    Probation,
    Main,
}

#[derive(Debug)]
struct Slot {
    key: Box<str>,
    entry: Entry,
    prev: u32,
    next: u32,
    queue: Queue,
    /// Reads since it entered its queue or last passed the head of the main queue.
    freq: u8,
    /// What it counts for in [`Totals::bytes`] (0 when it holds no value).
    weight: u64,
}

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u64,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// What one eviction step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// A value was evicted.
    Evicted,
    /// A value moved on (promoted, or given a second chance): no memory freed, but progress.
    Moved,
    /// Nothing in the queue asked for.
    Empty,
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    index: HashMap<Box<str>, u32>,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    probation: List,
    main: List,
    /// The sweep hand: the next slot whose expired parts are dropped.
    hand: usize,
}

impl Shard {
    /// Runs `op` on the entry of `key` (an empty one if there is none) with its expired parts
    /// dropped, then files the entry as it is now: queued if it holds a value, removed if it
    /// holds nothing.
    pub(super) fn update<R>(
        &mut self,
        key: &str,
        now: Instant,
        totals: &Totals,
        op: impl FnOnce(&mut Entry) -> R,
    ) -> R {
        let Some(&at) = self.index.get(key) else {
            let mut entry = Entry::default();
            let answer = op(&mut entry);
            if !entry.is_empty() {
                let at = self.insert(key, entry);
                self.settle(at, totals);
            }
            return answer;
        };
        let slot = self.slot_mut(at);
        slot.entry.prune(now);
        let answer = op(&mut slot.entry);
        self.settle(at, totals);
        answer
    }

    /// Runs `op` on the entry of `key`, if there is one, as a read: a live value counts one read
    /// for eviction. Nothing is created or removed.
    pub(super) fn read<R>(
        &mut self,
        key: &str,
        now: Instant,
        op: impl FnOnce(Option<&Entry>) -> R,
    ) -> R {
        let Some(&at) = self.index.get(key) else {
            return op(None);
        };
        let slot = self.slot_mut(at);
        if slot.entry.value(now).is_some() {
            slot.freq = (slot.freq + 1).min(MAX_FREQ);
        }
        op(Some(&slot.entry))
    }

    /// The live value of `key`, to change in place (its bytes stay; only what is derived from
    /// them may change), then re-weighed.
    pub(super) fn with_value(
        &mut self,
        key: &str,
        now: Instant,
        totals: &Totals,
        op: impl FnOnce(&mut Value),
    ) {
        let Some(&at) = self.index.get(key) else {
            return;
        };
        let slot = self.slot_mut(at);
        let Some(value) = slot.entry.value_mut(now) else {
            return;
        };
        op(value);
        self.settle(at, totals);
    }

    /// Drops the expired parts of the next `steps` slots (and the slots left empty): memory
    /// held by entries nobody touches again is reclaimed a few slots per write, never by a
    /// sweep of the whole store.
    pub(super) fn sweep(&mut self, steps: usize, now: Instant, totals: &Totals) {
        for _ in 0..steps.min(self.slots.len()) {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let at = self.hand as u32;
            self.hand += 1;
            if let Some(slot) = self.slots[at as usize].as_mut() {
                slot.entry.prune(now);
                self.settle(at, totals);
            }
        }
    }

    /// One step of eviction from the probation queue or the main one. A value that was read
    /// while it waited moves on instead (to the main queue, or to its tail with one chance
    /// fewer); expired values go first whatever their reads.
    pub(super) fn evict_one(
        &mut self,
        from_probation: bool,
        now: Instant,
        totals: &Totals,
    ) -> Step {
        let list = if from_probation {
            self.probation
        } else {
            self.main
        };
        let at = list.head;
        if at == NIL {
            return Step::Empty;
        }
        let slot = self.slot_mut(at);
        if slot.freq > 0 && slot.entry.value(now).is_some() {
            slot.freq = if from_probation { 0 } else { slot.freq - 1 };
            self.unlink(at, totals);
            self.push_back(at, Queue::Main, totals);
            return Step::Moved;
        }
        slot.entry.evict(now);
        // Still queued: settling unqueues it and takes it off the totals.
        self.settle(at, totals);
        Step::Evicted
    }

    fn insert(&mut self, key: &str, entry: Entry) -> u32 {
        let slot = Slot {
            key: key.into(),
            entry,
            prev: NIL,
            next: NIL,
            queue: Queue::None,
            freq: 0,
            weight: 0,
        };
        let at = match self.free.pop() {
            Some(at) => {
                self.slots[at as usize] = Some(slot);
                at
            }
            None => {
                // More than 4 billion entries in one shard: not reachable in memory.
                let at = u32::try_from(self.slots.len()).unwrap_or(NIL - 1);
                self.slots.push(Some(slot));
                at
            }
        };
        self.index.insert(key.into(), at);
        at
    }

    /// Files slot `at` as its entry is now: queued and weighed if it holds a value, unqueued
    /// if not, removed if it holds nothing at all.
    fn settle(&mut self, at: u32, totals: &Totals) {
        let slot = self.slot_mut(at);
        let weight = slot
            .entry
            .value_any()
            .map_or(0, |value| value.weight(slot.key.len()));
        let (queue, old) = (slot.queue, slot.weight);
        slot.weight = weight;
        match (queue, weight > 0) {
            (Queue::None, true) => {
                totals.values.fetch_add(1, Ordering::Relaxed);
                totals.add(&totals.bytes, weight as i64);
                self.slot_mut(at).freq = 0;
                self.push_back(at, Queue::Probation, totals);
            }
            (Queue::Probation | Queue::Main, true) => {
                totals.add(&totals.bytes, weight as i64 - old as i64);
            }
            (Queue::Probation | Queue::Main, false) => {
                self.unlink(at, totals);
                totals.values.fetch_sub(1, Ordering::Relaxed);
                totals.add(&totals.bytes, -(old as i64));
            }
            (Queue::None, false) => {}
        }
        if self.slot_mut(at).entry.is_empty() {
            if let Some(slot) = self.slots[at as usize].take() {
                self.index.remove(&slot.key);
                self.free.push(at);
            }
        }
    }

    fn slot_mut(&mut self, at: u32) -> &mut Slot {
        // Indices come from the index or a queue, which only name occupied slots.
        self.slots[at as usize]
            .as_mut()
            .expect("a queued or indexed slot is occupied")
    }

    fn list_mut(&mut self, queue: Queue) -> Option<&mut List> {
        match queue {
            Queue::Probation => Some(&mut self.probation),
            Queue::Main => Some(&mut self.main),
            Queue::None => None,
        }
    }

    fn push_back(&mut self, at: u32, queue: Queue, totals: &Totals) {
        if queue == Queue::Probation {
            totals.probation.fetch_add(1, Ordering::Relaxed);
        }
        let Some(list) = self.list_mut(queue) else {
            return;
        };
        let tail = list.tail;
        list.tail = at;
        if list.head == NIL {
            list.head = at;
        }
        list.len += 1;
        if tail != NIL {
            self.slot_mut(tail).next = at;
        }
        let slot = self.slot_mut(at);
        slot.prev = tail;
        slot.next = NIL;
        slot.queue = queue;
    }

    fn unlink(&mut self, at: u32, totals: &Totals) {
        let slot = self.slot_mut(at);
        let (prev, next, queue) = (slot.prev, slot.next, slot.queue);
        slot.prev = NIL;
        slot.next = NIL;
        slot.queue = Queue::None;
        if queue == Queue::Probation {
            totals.probation.fetch_sub(1, Ordering::Relaxed);
        }
        if prev != NIL {
            self.slot_mut(prev).next = next;
        }
        if next != NIL {
            self.slot_mut(next).prev = prev;
        }
        let Some(list) = self.list_mut(queue) else {
            return;
        };
        if list.head == at {
            list.head = next;
        }
        if list.tail == at {
            list.tail = prev;
        }
        list.len -= 1;
    }

    /// The keys of the entries the shard holds (with or without a value).
    #[cfg(any(test, feature = "simulation"))]
    pub(super) fn keys(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(|k| &**k)
    }

    /// The entry of `key`, for tests that look inside (and the simulation's replica).
    #[cfg(any(test, feature = "simulation"))]
    pub(super) fn entry(&self, key: &str) -> Option<&Entry> {
        let at = *self.index.get(key)?;
        self.slots[at as usize].as_ref().map(|slot| &slot.entry)
    }
}
