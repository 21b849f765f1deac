//! Planted bugs: mutations of the protocol that the deterministic simulation (`tests/sim/`)
//! must find, each switched on at run time by the simulation alone (`__private::sim::plant`).
//! Without the `simulation` feature every switch is the constant `false` and the compiler
//! removes the mutation: the crate's own code pays nothing for them.
//!
//! The list, and how many schedules the simulation needs to find each: docs/testing-under-faults.md.

/// A mutation the simulation can switch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "simulation"), allow(dead_code))]
pub(crate) enum Bug {
    /// The store accepts a computation's write whatever its fencing counter says.
    FenceSkipped,
    /// A batch read serves a stored value without judging it by its epochs (tags, clear).
    EpochIgnoredInBatch,
    /// The heartbeat believes a renewal it never sent: the holder's lease moves on while the
    /// lock in the store runs out.
    LeaseNotRenewed,
    /// The near tier serves its copies whether or not its feed proved itself current within
    /// `max_staleness`: a copy is served without proof.
    NearWithoutProof,
    /// A read of a key goes to the backend without first replaying the writes this instance
    /// queued for it (auto-recovery): a queued invalidation is replayed after the read.
    QueuedReplayedAfterRead,
    /// The near tier serves a copy held while the backend is unreachable however long ago its
    /// feed last proved it current: `serve_while_down` is not counted.
    HeldPastBound,
}

#[cfg(feature = "simulation")]
mod switch {
    use super::Bug;
    use std::cell::Cell;

    thread_local! {
        /// The bugs switched on for this thread, one bit each. Per thread, not per process:
        /// the simulation runs on one thread, and the tests beside it must not see its bugs.
        static PLANTED: Cell<u8> = const { Cell::new(0) };
    }

    fn bit(bug: Bug) -> u8 {
        1 << (bug as u8)
    }

    /// Switches `bug` on or off on this thread.
    pub(crate) fn plant(bug: Bug, on: bool) {
        PLANTED.with(|planted| {
            let bits = planted.get();
            planted.set(if on {
                bits | bit(bug)
            } else {
                bits & !bit(bug)
            });
        });
    }

    /// Whether `bug` is switched on on this thread.
    pub(crate) fn on(bug: Bug) -> bool {
        PLANTED.with(|planted| planted.get() & bit(bug) != 0)
    }
}

#[cfg(feature = "simulation")]
pub(crate) use switch::{on, plant};

/// Without the feature no bug is ever on.
#[cfg(not(feature = "simulation"))]
#[inline(always)]
pub(crate) const fn on(_bug: Bug) -> bool {
    false
}
