//! The fencing counters as the replay follows them, on one server or across a cluster's nodes.
//!
//! On one server every bump is seen (MONITOR prints each script's `INCR`, and the `SET` of the
//! clock that follows it when the counter was gone or the clock is above counter + 1).
//! On a cluster the counter of an entry lives on the node that serves its slot, and moves in
//! two ways:
//! - a migration (`MIGRATE` of the slot's keys) carries it whole to the new node: the controller
//!   marks it in the merged log (`M <node> <entry>...`) before it runs the `MIGRATE`;
//! - a failover puts the entry on the old master's replica, whose copy may be behind:
//!   replication is asynchronous, and a Redis 7.0 replica's MONITOR shows nothing of what it
//!   replicates (tried: a script's `INCR` on the master does not appear in its replica's
//!   MONITOR), so the counter the new master went on from cannot be read there. It is read back
//!   instead from the first computed write the new master accepts: the store script writes only
//!   while the counter equals the write's fence, so at that write the counter *is* the fence,
//!   and at the switch it was the fence minus the bumps the new master made in between. Until
//!   then the bumps on the new master are counted from 0 and patched once the start is known.
//!   A bump that sets the counter to the new master's clock ends the wait instead: the start is
//!   then unknown, and no longer matters, since the clock is above the old master's tokens.
//!   The old master's bumps above that start never reached the new master: they are the ones a
//!   failover lost, each an acquisition, an invalidation or a `set` ([`Rollback::lost`]).

use std::collections::HashMap;

use crate::history::{Rollback, ServerEvent};

/// What bumped a counter: an acquisition's token, or an invalidation's or a `set`'s.
type Bumped = (Option<u64>, &'static str);

/// A switch of an entry to another node whose counter at the switch is not yet known.
struct Pending {
    /// Where its [`ServerEvent::Rollback`] sits in the events.
    rollback: usize,
    /// The events since the switch whose token or counter counts from 0 until it is known.
    events: Vec<usize>,
    /// The bumps since the switch, counted from 0.
    bumps: Vec<(u64, Bumped)>,
}

/// The counters of one replay: the known value of each entry's counter on the node serving it.
#[derive(Default)]
pub struct Fences {
    counters: HashMap<String, u64>,
    /// The node the following script lines ran on (`None`: one server).
    node: Option<u32>,
    /// The node that ran each entry's last script.
    holder: HashMap<String, u32>,
    /// Entries a migration is moving, with the node they go to.
    moving: HashMap<String, u32>,
    pending: HashMap<String, Pending>,
    /// Each entry's bumps in the current life, in order: (counter after it, what bumped it).
    bumps: HashMap<String, Vec<(u64, Bumped)>>,
}

impl Fences {
    /// The counter's value as far as the replay knows it (from 0 after a failover until the
    /// new master's start is known).
    pub fn get(&self, entry: &str) -> Option<u64> {
        self.counters.get(entry).copied()
    }

    /// The following script lines ran on `node` (a line `N <node>` of a cluster's merged log).
    pub fn on_node(&mut self, node: u32) {
        self.node = Some(node);
    }

    /// A migration is moving `entry` to `node` (a line `M <node> <entry>...`).
    pub fn moving(&mut self, entry: &str, node: u32) {
        self.moving.insert(entry.to_string(), node);
    }

    /// A flush or a restart: every counter is gone.
    pub fn clear(&mut self, events: &mut [ServerEvent]) {
        self.close_all(events);
        self.counters.clear();
        self.bumps.clear();
    }

    /// A script of `entry` runs (on the current node). If the entry was last served by another
    /// node and no migration moved it there, a failover put it there: a [`Rollback`] is placed
    /// here, and the counter counts from 0 until a computed write tells where it started.
    pub fn script_of(&mut self, entry: &str, at_us: u64, events: &mut Vec<ServerEvent>) {
        let Some(node) = self.node else {
            return;
        };
        let previous = self.holder.insert(entry.to_string(), node);
        if previous.is_none_or(|p| p == node) {
            return;
        }
        if self.moving.get(entry) == Some(&node) {
            self.moving.remove(entry);
            return;
        }
        // Counted from 0 itself (an earlier switch never proven): not a value to compare with.
        let unproven = self.pending.contains_key(entry);
        self.close(entry, events);
        let from = self
            .counters
            .insert(entry.to_string(), 0)
            .filter(|_| !unproven);
        events.push(ServerEvent::Rollback(Rollback {
            key: entry.to_string(),
            at_us,
            to: None,
            reseeded: false,
            raised: false,
            from,
            lost: Vec::new(),
            survivor: None,
        }));
        self.pending.insert(
            entry.to_string(),
            Pending {
                rollback: events.len() - 1,
                events: Vec::new(),
                bumps: Vec::new(),
            },
        );
    }

    /// `INCR` of the entry's counter: the value it returned (as far as known).
    pub fn incr(&mut self, entry: &str) -> u64 {
        // A counter the replay has not seen (or that lapsed) starts at 1, as in Redis.
        let n = self.counters.entry(entry.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    /// The counter was seeded from the clock (`INCR` made it 1: it was gone). After a failover
    /// that ends the pending switch: the counter was gone on the new master (lost or lapsed).
    pub fn seed(&mut self, entry: &str, seed: u64, events: &mut [ServerEvent]) {
        self.counters.insert(entry.to_string(), seed);
        self.bumps.remove(entry);
        if let Some(pending) = self.pending.remove(entry) {
            if let ServerEvent::Rollback(r) = &mut events[pending.rollback] {
                r.reseeded = true;
            }
        }
    }

    /// The bump set the counter to the server's clock, above counter + 1 (`SET ... KEEPTTL`).
    /// After a failover that ends the pending switch: the counter the new master went on from
    /// can no longer be read back from a later write (the clock replaced it), but the clock
    /// puts this token above every one the old master handed out (as long as the nodes' clocks
    /// agree to within the failover's time), which the checker holds it to
    /// ([`Rollback::raised`]). Unless a bump since the switch was counted from 0 (the counter
    /// was above the clock: not one clock): then the switch stays unproven.
    pub fn raise(&mut self, entry: &str, value: u64, events: &mut [ServerEvent]) {
        self.counters.insert(entry.to_string(), value);
        if let Some(pending) = self.pending.remove(entry) {
            self.bumps.remove(entry);
            if let ServerEvent::Rollback(r) = &mut events[pending.rollback] {
                r.raised = pending.events.is_empty();
            }
        }
    }

    /// The event at `index` carries the entry's counter (an acquisition's token, a write's
    /// counter): patched if the counter's start is still unknown. `bumped` records a bump.
    pub fn record(&mut self, entry: &str, index: usize, bumped: Option<Bumped>) {
        let counter = self.get(entry).unwrap_or(0);
        match self.pending.get_mut(entry) {
            Some(pending) => {
                pending.events.push(index);
                pending.bumps.extend(bumped.map(|b| (counter, b)));
            }
            None => {
                if let Some(b) = bumped {
                    self.bumps
                        .entry(entry.to_string())
                        .or_default()
                        .push((counter, b));
                }
            }
        }
    }

    /// The server accepted a computed write with `fence` after the store script checked that
    /// the counter equals it: if the entry's counter after a failover was not yet known, it is
    /// now, and so are the bumps the old master made above it.
    pub fn written(&mut self, entry: &str, fence: u64, events: &mut [ServerEvent]) {
        self.resolve(entry, fence, events);
    }

    /// The controller read the counter inside the server (a probe script, run once the cluster
    /// settled after a failover: the only proof for a lock's entry, which no cache write
    /// follows). A counter that is gone proves nothing: the next bump seeds it.
    pub fn probed(&mut self, entry: &str, value: u64, events: &mut [ServerEvent]) {
        if value > 0 {
            self.resolve(entry, value, events);
        }
    }

    /// The entry's counter is `now` at this point of the log: if its start after a switch was
    /// not yet known, it is the value minus the bumps counted since.
    fn resolve(&mut self, entry: &str, now: u64, events: &mut [ServerEvent]) {
        let Some(pending) = self.pending.remove(entry) else {
            return;
        };
        let counted = self.get(entry).unwrap_or(0);
        let Some(start) = now.checked_sub(counted) else {
            // Not a counter this replay can explain: left unproven.
            return;
        };
        for &i in &pending.events {
            match &mut events[i] {
                ServerEvent::Acquire { token, .. } => *token += start,
                ServerEvent::Write(w) => w.counter = w.counter.map(|c| c + start),
                _ => {}
            }
        }
        self.counters.insert(entry.to_string(), now);
        let log = self.bumps.entry(entry.to_string()).or_default();
        let lost: Vec<(u64, &'static str)> = log
            .iter()
            .filter(|(counter, _)| *counter > start)
            .map(|(counter, (_, what))| (*counter, *what))
            .collect();
        log.retain(|(counter, _)| *counter <= start);
        let survivor = log.last().filter(|(c, _)| *c == start).map(|(_, b)| *b);
        log.extend(
            pending
                .bumps
                .iter()
                .map(|(c, (token, what))| (c + start, (token.map(|t| t + start), *what))),
        );
        if let ServerEvent::Rollback(r) = &mut events[pending.rollback] {
            r.to = Some(start);
            r.lost = lost;
            r.survivor = survivor;
        }
    }

    /// The entry's pending switch stays unproven: its bumps since the switch are no evidence.
    fn close(&mut self, entry: &str, _events: &mut [ServerEvent]) {
        if self.pending.remove(entry).is_some() {
            self.bumps.remove(entry);
        }
    }

    fn close_all(&mut self, events: &mut [ServerEvent]) {
        let entries: Vec<String> = self.pending.keys().cloned().collect();
        for entry in entries {
            self.close(&entry, events);
        }
    }
}
