//! The store's commands: every atomic operation of a backend as a value ([`LockOp`], [`Op`]),
//! built before it is sent, and its answer as a value ([`Reply`]). A backend answers them in one
//! `match` ([`LockStore::lock`](super::LockStore::lock), [`Store::run`](super::Store::run)); a
//! wrapper (the breaker, the split store, the recorder) is one generic method over them, not a
//! method per operation. The typed calls the cache and the lock make ([`StoreExt`](super::StoreExt),
//! [`LockStoreExt`](super::LockStoreExt)) build the value, send it and take their answer out of
//! the reply.

use std::sync::Arc;
use std::time::Duration;

use super::{
    Acquire, Blob, HolderTrace, LockPeek, ManyWithEpochs, ReadOrLock, StoreError, StoreResult,
    Stored, Write,
};
use crate::wire::key::EntryKeys;

/// What a wrapper in front of a backend must know of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Sent when the breaker admits it; its answer counts.
    Plain,
    /// Takes or keeps a lock or a fencing counter: waits for replicas when lock writes do
    /// ([`ConnectionOptions::wait_for_replicas`](crate::ConnectionOptions::wait_for_replicas)),
    /// so the breaker's stall watchdog leaves it out then.
    LockWrite,
    /// Frees a lock: clean-up, mostly of a request the breaker itself cut off (it may have been
    /// granted), so an open breaker still lets it through (see `guarded.rs`).
    CleanUp,
}

/// An operation of a lock: what a [`LockStore`](super::LockStore) answers. Every one is about
/// one entry, by its owner's token where it has one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockOp<'a> {
    /// Takes the lock for `token` if it is free (bumping the fencing counter), or reports who
    /// holds it for how long: [`Reply::Acquire`].
    TryLock {
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    },
    /// Extends the lock to `lease` from now if it is still `token`'s: [`Reply::Flag`], false
    /// if it is not.
    Extend {
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    },
    /// Frees the lock if it is still `token`'s and wakes the waiters: [`Reply::Flag`], false
    /// if it was not.
    Unlock { keys: &'a EntryKeys, token: &'a str },
    /// Bumps the fencing counter without taking the lock: [`Reply::Number`], above every token
    /// handed out so far (used to fence values written through another store).
    NextFence {
        keys: &'a EntryKeys,
        lease: Duration,
    },
    /// Raises the fencing counter to at least `floor` (Redlock: the token chosen over a quorum
    /// must be remembered by that quorum, so any later quorum sees it), and keeps it at least
    /// `retention(lease)` longer. A `floor` of 0 only keeps a counter that exists:
    /// [`Reply::Done`].
    RaiseFence {
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    },
    /// Records that a leader's run under `fence` starts now (by the store's clock), for `keep`:
    /// [`Reply::Flag`], false (recording nothing) if a run of a newer term is recorded.
    RecordRun {
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    },
    /// How long ago the last recorded run started, by the store's clock: [`Reply::Since`].
    SinceLastRun { keys: &'a EntryKeys },
    /// Who holds the lock, for how long more, and the fencing counter, changing nothing
    /// (`Cache::inspect`): [`Reply::Peek`].
    Peek { keys: &'a EntryKeys },
}

impl<'a> LockOp<'a> {
    /// The operation's name, as the typed call is named.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            LockOp::TryLock { .. } => "try_lock",
            LockOp::Extend { .. } => "extend",
            LockOp::Unlock { .. } => "unlock",
            LockOp::NextFence { .. } => "next_fence",
            LockOp::RaiseFence { .. } => "raise_fence",
            LockOp::RecordRun { .. } => "record_run",
            LockOp::SinceLastRun { .. } => "since_last_run",
            LockOp::Peek { .. } => "peek",
        }
    }

    /// How a wrapper treats it.
    pub(crate) fn class(&self) -> Class {
        match self {
            LockOp::TryLock { .. }
            | LockOp::Extend { .. }
            | LockOp::NextFence { .. }
            | LockOp::RaiseFence { .. } => Class::LockWrite,
            LockOp::Unlock { .. } => Class::CleanUp,
            LockOp::RecordRun { .. } | LockOp::SinceLastRun { .. } | LockOp::Peek { .. } => {
                Class::Plain
            }
        }
    }
}

/// An operation of the value side: what a [`Store`](super::Store) answers besides the lock
/// operations. Each says its reply.
#[derive(Debug, Clone)]
pub(crate) enum Op<'a> {
    /// The value bytes, if any: [`Reply::Value`].
    Get { keys: &'a EntryKeys },
    /// [`Op::Get`] for many entries, in order: [`Reply::Values`]. On Redis, one `MGET` per
    /// chunk of at most `CHUNK_KEYS` entries, all sent at once (on a cluster, per slot).
    GetMany { entries: &'a [&'a EntryKeys] },
    /// If `read_value` and a value exists, it; otherwise the lock for `token` if it is free
    /// (bumping the fencing counter), or who holds it for how long: [`Reply::ReadOrLock`].
    /// `read_value = false` takes the lock even over a value, to replace bytes that do not
    /// decode. With a `trace` (a W3C `traceparent`), a store that keeps traces stores it beside
    /// a lock it grants, and reads back its holder's beside a lock it finds held:
    /// [`Reply::ReadOrLockTraced`]; a store that keeps none answers as without.
    ReadOrLock {
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
        trace: Option<&'a str>,
    },
    /// [`Op::ReadOrLock`] for many entries, each with its own token, by the very same rule per
    /// entry (atomic per entry, not across the batch): [`Reply::PerEntry`], one answer per
    /// entry, in order; a failed request fails every entry it carried (each may still have
    /// been granted: see [`StoreError::may_have_been_applied`]). On Redis, one script call per
    /// chunk of at most `CHUNK_KEYS` entries (per slot on a cluster), all sent at once.
    ReadOrLockMany {
        entries: &'a [(&'a EntryKeys, &'a str, bool)],
        lease: Duration,
    },
    /// Carries out `write` if the fencing counter still equals `fence` (nobody acquired, set or
    /// invalidated since); frees the lock if it is still `token`'s; wakes the waiters:
    /// [`Reply::Stored`].
    StoreAndUnlock {
        keys: &'a EntryKeys,
        token: &'a str,
        fence: u64,
        write: Write,
    },
    /// Carries out `write` unless the fencing counter is already above `fence`, then records
    /// `fence` as the counter; wakes the waiters: [`Reply::Flag`], true if written. The write
    /// rule when the tokens come from another lock store (a Redlock quorum): newer tokens win.
    WriteFenced {
        keys: &'a EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    },
    /// Writes `value` unconditionally for `ttl` ([`FOREVER`](crate::FOREVER): no expiry), bumps
    /// the fencing counter (so in-flight computations do not overwrite it) and wakes the
    /// waiters: [`Reply::Done`].
    Set {
        keys: &'a EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    },
    /// Deletes the value, bumps the fencing counter (refusing in-flight computations' writes)
    /// and wakes the waiters: [`Reply::Done`].
    Invalidate {
        keys: &'a EntryKeys,
        lease: Duration,
    },
    /// [`Op::Invalidate`] for many entries: every entry is tried, the first failure reported.
    /// On Redis, one script call per chunk of at most `CHUNK_KEYS` entries (per slot on a
    /// cluster), all sent at once.
    InvalidateMany {
        entries: &'a [&'a EntryKeys],
        lease: Duration,
    },
    /// The namespace's clock now: [`Reply::Number`]. Microseconds on Redis (the server's `TIME`,
    /// on the node that holds `clock`, the namespace's clear key, so that every epoch and every
    /// birth of a namespace is read from one clock even on a cluster); a counter in memory. A
    /// value records it as its birth when its computation starts (see `cache/tags.rs`); where
    /// the grant of its lock answered the clock ([`ReadOrLock::Acquired`]), not asked again.
    Born { clock: &'a str },
    /// The epochs under `names` (clear and tag keys), in order, 0 for one never raised:
    /// [`Reply::Epochs`].
    Epochs { names: &'a [String] },
    /// Raises each epoch to at least `floor` and above what it was, for ever (no expiry), and
    /// tells the near tiers (announced like an entry's change): [`Reply::Done`]. One request per
    /// name, all sent at once; the first failure is reported, after every name was tried.
    RaiseEpochs { names: &'a [String], floor: u64 },
    /// [`Op::Get`] and [`Op::Epochs`] together: [`Reply::ValueWithEpochs`]. On Redis one `MGET`
    /// (on a cluster, per slot, sent at once).
    GetWithEpochs {
        keys: &'a EntryKeys,
        names: &'a Arc<[String]>,
    },
    /// [`Op::GetMany`] and [`Op::Epochs`], sent at once: [`Reply::ValuesWithEpochs`].
    GetManyWithEpochs {
        entries: &'a [&'a EntryKeys],
        names: &'a [String],
    },
    /// Wakes the waiters of `keys` without changing anything (a split store's value side, when
    /// the lock side freed a lock without a value landing): [`Reply::Done`].
    Wake { keys: &'a EntryKeys },
    /// Whether the backend answers (`PING` on Redis; the embedded store always does): the
    /// circuit breaker's probe and the health report's check. [`Reply::Done`].
    Ping,
}

impl Op<'_> {
    /// The operation's name, as the typed call is named.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Get { .. } => "get",
            Op::GetMany { .. } => "get_many",
            Op::ReadOrLock { .. } => "read_or_lock",
            Op::ReadOrLockMany { .. } => "read_or_lock_many",
            Op::StoreAndUnlock { .. } => "store_and_unlock",
            Op::WriteFenced { .. } => "write_fenced",
            Op::Set { .. } => "set",
            Op::Invalidate { .. } => "invalidate",
            Op::InvalidateMany { .. } => "invalidate_many",
            Op::Born { .. } => "born",
            Op::Epochs { .. } => "epochs",
            Op::RaiseEpochs { .. } => "raise_epochs",
            Op::GetWithEpochs { .. } => "get_with_epochs",
            Op::GetManyWithEpochs { .. } => "get_many_with_epochs",
            Op::Wake { .. } => "wake",
            Op::Ping => "ping",
        }
    }

    /// How a wrapper treats it: taking locks is a lock write; the rest is plain.
    pub(crate) fn class(&self) -> Class {
        match self {
            Op::ReadOrLock { .. } | Op::ReadOrLockMany { .. } => Class::LockWrite,
            _ => Class::Plain,
        }
    }
}

/// A store's answer to one operation; which one each operation gets is said at the operation.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// Done; nothing to tell.
    Done,
    /// Yes or no: extended, freed, recorded, written.
    Flag(bool),
    /// A fencing token, or the namespace's clock.
    Number(u64),
    /// A lock attempt's answer.
    Acquire(Acquire),
    /// How long ago the last run started; `None` if none is recorded.
    Since(Option<Duration>),
    /// A value's bytes, if any.
    Value(Option<Blob>),
    /// Values' bytes, in the order asked.
    Values(Vec<Option<Blob>>),
    /// A read-or-lock's answer.
    ReadOrLock(ReadOrLock),
    /// A read-or-lock's answer, with what the holder of a lock found held stored beside it.
    ReadOrLockTraced((ReadOrLock, Option<HolderTrace>)),
    /// One read-or-lock answer per entry, in order.
    PerEntry(Vec<StoreResult<ReadOrLock>>),
    /// A fenced write-and-unlock's answer.
    Stored(Stored),
    /// Epochs, in the order asked.
    Epochs(Vec<u64>),
    /// A value's bytes and epochs.
    ValueWithEpochs((Option<Blob>, Vec<u64>)),
    /// Values' bytes and epochs.
    ValuesWithEpochs(ManyWithEpochs),
    /// A lock's holder and the fencing counter, as a look found them.
    Peek(LockPeek),
}

impl Reply {
    /// The variant's name, for the message of a reply of the wrong kind.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Reply::Done => "Done",
            Reply::Flag(_) => "Flag",
            Reply::Number(_) => "Number",
            Reply::Acquire(_) => "Acquire",
            Reply::Since(_) => "Since",
            Reply::Value(_) => "Value",
            Reply::Values(_) => "Values",
            Reply::ReadOrLock(_) => "ReadOrLock",
            Reply::ReadOrLockTraced(_) => "ReadOrLockTraced",
            Reply::PerEntry(_) => "PerEntry",
            Reply::Stored(_) => "Stored",
            Reply::Epochs(_) => "Epochs",
            Reply::ValueWithEpochs(_) => "ValueWithEpochs",
            Reply::ValuesWithEpochs(_) => "ValuesWithEpochs",
            Reply::Peek(_) => "Peek",
        }
    }
}

/// A typed answer taken out of a [`Reply`]: each answer type is carried by one variant.
pub(crate) trait FromReply: Sized {
    /// The answer, or the reply back if it is of another variant.
    fn from_reply(reply: Reply) -> Result<Self, Reply>;
}

macro_rules! from_reply {
    ($($answer:ty => $variant:ident),* $(,)?) => {
        $(impl FromReply for $answer {
            fn from_reply(reply: Reply) -> Result<Self, Reply> {
                match reply {
                    Reply::$variant(answer) => Ok(answer),
                    other => Err(other),
                }
            }
        })*
    };
}

from_reply! {
    bool => Flag,
    u64 => Number,
    Acquire => Acquire,
    Option<Duration> => Since,
    Option<Blob> => Value,
    Vec<Option<Blob>> => Values,
    ReadOrLock => ReadOrLock,
    Vec<StoreResult<ReadOrLock>> => PerEntry,
    Stored => Stored,
    Vec<u64> => Epochs,
    (Option<Blob>, Vec<u64>) => ValueWithEpochs,
    ManyWithEpochs => ValuesWithEpochs,
    LockPeek => Peek,
}

/// A traced read-or-lock's answer: from a store that keeps no traces, the plain answer.
impl FromReply for (ReadOrLock, Option<HolderTrace>) {
    fn from_reply(reply: Reply) -> Result<Self, Reply> {
        match reply {
            Reply::ReadOrLockTraced(answer) => Ok(answer),
            Reply::ReadOrLock(answer) => Ok((answer, None)),
            other => Err(other),
        }
    }
}

impl FromReply for () {
    fn from_reply(reply: Reply) -> Result<Self, Reply> {
        match reply {
            Reply::Done => Ok(()),
            other => Err(other),
        }
    }
}

/// The answer to `op` in `reply`. A reply of another variant is a bug of the store that sent
/// it: a failure that says so (and a panic in debug builds, where tests run).
pub(crate) fn answer<T: FromReply>(op: &'static str, reply: StoreResult<Reply>) -> StoreResult<T> {
    T::from_reply(reply?).map_err(|other| {
        debug_assert!(
            false,
            "the store answered {op} with a {} reply",
            other.name()
        );
        StoreError::WrongReply {
            op,
            reply: other.name(),
        }
    })
}

/// The failure of a store's `match` that met an operation it routes elsewhere: a bug of this
/// crate, reported as [`answer`] reports a wrong reply.
pub(crate) fn unanswered(op: &Op<'_>) -> StoreError {
    debug_assert!(false, "the store has no answer to {}", op.name());
    StoreError::WrongReply {
        op: op.name(),
        reply: "missing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_comes_out_of_its_own_variant() {
        let fence: StoreResult<u64> = answer("next_fence", Ok(Reply::Number(7)));
        assert_eq!(fence.unwrap(), 7);
        let done: StoreResult<()> = answer("set", Ok(Reply::Done));
        assert!(done.is_ok());
        let refused = StoreError::NoQuorum {
            reached: 1,
            needed: 2,
        };
        let failed: StoreResult<bool> = answer("extend", Err(refused));
        assert!(matches!(
            failed,
            Err(StoreError::NoQuorum { reached: 1, .. })
        ));
    }

    #[test]
    #[cfg_attr(
        debug_assertions,
        should_panic(expected = "the store answered get with a Flag reply")
    )]
    fn a_reply_of_the_wrong_variant_is_a_failure_not_a_wrong_answer() {
        let got: StoreResult<Option<Blob>> = answer("get", Ok(Reply::Flag(true)));
        assert!(matches!(
            got,
            Err(StoreError::WrongReply {
                op: "get",
                reply: "Flag"
            })
        ));
    }
}
