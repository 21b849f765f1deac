//! The typed calls over the store's seam: each builds its operation, sends it and takes its
//! answer out of the reply, so the cache and the lock call `store.get(keys)` and never see an
//! [`Op`]. Each call sends at once (the memory store answers before the future is polled, as a
//! method did); only the answer waits for `.await`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::op::{answer, FromReply};
use super::{
    Acquire, Blob, BoxFuture, HolderTrace, LockOp, LockPeek, LockStore, ManyWithEpochs, Op,
    ReadOrLock, Reply, Store, StoreResult, Stored, Write,
};
use crate::wire::key::EntryKeys;

/// The lock operations as typed calls, on every [`LockStore`].
pub(crate) trait LockStoreExt: LockStore {
    /// Sends `op`; its answer as a `T`.
    fn ask<'a, T: FromReply + Send + 'a>(
        &'a self,
        op: LockOp<'a>,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a {
        let name = op.name();
        let sent = self.lock(op);
        async move { answer(name, sent.await) }
    }

    /// [`LockOp::TryLock`].
    fn try_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<Acquire>> + Send + 'a {
        self.ask(LockOp::TryLock { keys, token, lease })
    }

    /// [`LockOp::Extend`].
    fn extend<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send + 'a {
        self.ask(LockOp::Extend { keys, token, lease })
    }

    /// [`LockOp::Unlock`].
    fn unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
    ) -> impl Future<Output = StoreResult<bool>> + Send + 'a {
        self.ask(LockOp::Unlock { keys, token })
    }

    /// [`LockOp::NextFence`].
    fn next_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<u64>> + Send + 'a {
        self.ask(LockOp::NextFence { keys, lease })
    }

    /// [`LockOp::RaiseFence`].
    fn raise_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        self.ask(LockOp::RaiseFence { keys, floor, lease })
    }

    /// [`LockOp::RecordRun`].
    fn record_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send + 'a {
        self.ask(LockOp::RecordRun { keys, fence, keep })
    }

    /// [`LockOp::SinceLastRun`].
    fn since_last_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> impl Future<Output = StoreResult<Option<Duration>>> + Send + 'a {
        self.ask(LockOp::SinceLastRun { keys })
    }

    /// [`LockOp::Peek`].
    fn peek<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> impl Future<Output = StoreResult<LockPeek>> + Send + 'a {
        self.ask(LockOp::Peek { keys })
    }
}

impl<S: LockStore + ?Sized> LockStoreExt for S {}

/// The value operations and the clock as typed calls, on every [`Store`].
pub(crate) trait StoreExt: Store {
    /// Sends `op`; its answer as a `T`.
    fn send<'a, T: FromReply + Send + 'a>(
        &'a self,
        op: Op<'a>,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a {
        let name = op.name();
        let sent = self.run(op);
        async move { answer(name, sent.await) }
    }

    /// [`Op::Get`].
    fn get<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> impl Future<Output = StoreResult<Option<Blob>>> + Send + 'a {
        self.send(Op::Get { keys })
    }

    /// [`Op::ReadOrLock`].
    fn read_or_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
    ) -> impl Future<Output = StoreResult<ReadOrLock>> + Send + 'a {
        self.send(Op::ReadOrLock {
            keys,
            token,
            lease,
            read_value,
            trace: None,
        })
    }

    /// [`Op::ReadOrLock`] with this caller's `trace`: stored beside a lock it is granted; with
    /// a lock found held, what its holder stored (if the store keeps traces).
    fn read_or_lock_traced<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
        trace: &'a str,
    ) -> impl Future<Output = StoreResult<(ReadOrLock, Option<HolderTrace>)>> + Send + 'a {
        self.send(Op::ReadOrLock {
            keys,
            token,
            lease,
            read_value,
            trace: Some(trace),
        })
    }

    /// [`Op::StoreAndUnlock`].
    fn store_and_unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        fence: u64,
        write: Write,
    ) -> impl Future<Output = StoreResult<Stored>> + Send + 'a {
        self.send(Op::StoreAndUnlock {
            keys,
            token,
            fence,
            write,
        })
    }

    /// [`Op::WriteFenced`].
    fn write_fenced<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send + 'a {
        self.send(Op::WriteFenced {
            keys,
            fence,
            write,
            lease,
        })
    }

    /// [`Op::Set`].
    fn set<'a>(
        &'a self,
        keys: &'a EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        self.send(Op::Set {
            keys,
            value,
            ttl,
            lease,
        })
    }

    /// [`Op::Invalidate`].
    fn invalidate<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        self.send(Op::Invalidate { keys, lease })
    }

    /// [`Op::GetMany`].
    fn get_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
    ) -> impl Future<Output = StoreResult<Vec<Option<Blob>>>> + Send + 'a {
        self.send(Op::GetMany { entries })
    }

    /// [`Op::ReadOrLockMany`]: one answer per entry; a store that failed as a whole fails each.
    fn read_or_lock_many<'a>(
        &'a self,
        entries: &'a [(&'a EntryKeys, &'a str, bool)],
        lease: Duration,
    ) -> impl Future<Output = Vec<StoreResult<ReadOrLock>>> + Send + 'a {
        let answers = self.send(Op::ReadOrLockMany { entries, lease });
        async move {
            answers
                .await
                .unwrap_or_else(|failed| vec![Err(failed); entries.len()])
        }
    }

    /// [`Op::InvalidateMany`].
    fn invalidate_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        lease: Duration,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        self.send(Op::InvalidateMany { entries, lease })
    }

    /// [`Op::Born`].
    fn born<'a>(&'a self, clock: &'a str) -> impl Future<Output = StoreResult<u64>> + Send + 'a {
        self.send(Op::Born { clock })
    }

    /// [`Op::Epochs`].
    fn epochs<'a>(
        &'a self,
        names: &'a [String],
    ) -> impl Future<Output = StoreResult<Vec<u64>>> + Send + 'a {
        self.send(Op::Epochs { names })
    }

    /// [`Op::RaiseEpochs`].
    fn raise_epochs<'a>(
        &'a self,
        names: &'a [String],
        floor: u64,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        self.send(Op::RaiseEpochs { names, floor })
    }

    /// [`Op::GetWithEpochs`].
    fn get_with_epochs<'a>(
        &'a self,
        keys: &'a EntryKeys,
        names: &'a Arc<[String]>,
    ) -> impl Future<Output = StoreResult<(Option<Blob>, Vec<u64>)>> + Send + 'a {
        self.send(Op::GetWithEpochs { keys, names })
    }

    /// [`Op::GetManyWithEpochs`].
    fn get_many_with_epochs<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        names: &'a [String],
    ) -> impl Future<Output = StoreResult<ManyWithEpochs>> + Send + 'a {
        self.send(Op::GetManyWithEpochs { entries, names })
    }

    /// [`Op::Wake`].
    fn wake<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        self.send(Op::Wake { keys })
    }

    /// [`Op::Ping`].
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send + '_ {
        self.send(Op::Ping)
    }

    /// The store's [`Clock`](super::Clock) now.
    fn now_ms(&self) -> u64 {
        self.clock().now_ms()
    }

    /// Whether the store's clock is calibrated.
    fn clock_synced(&self) -> bool {
        self.clock().is_synced()
    }

    /// Calibrates the store's clock once (see [`Clock::sync`](super::Clock::sync)).
    fn sync_clock(&self) -> BoxFuture<'_, ()> {
        self.clock().sync()
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// A batch operation of a store that has no batch request: each entry asked by itself, one
/// after another, through `store` (the memory store, whose every step is atomic anyway, and a
/// split store, whose Redlock quorum is taken per key). Any other operation is sent as it is.
pub(crate) fn one_by_one<'a, S: Store + ?Sized>(
    store: &'a S,
    op: Op<'a>,
) -> BoxFuture<'a, StoreResult<Reply>> {
    match op {
        Op::GetMany { entries } => Box::pin(async move {
            let mut values = Vec::with_capacity(entries.len());
            for keys in entries {
                values.push(store.get(keys).await?);
            }
            Ok(Reply::Values(values))
        }),
        Op::ReadOrLockMany { entries, lease } => Box::pin(async move {
            let mut answers = Vec::with_capacity(entries.len());
            for (keys, token, read_value) in entries {
                answers.push(store.read_or_lock(keys, token, lease, *read_value).await);
            }
            Ok(Reply::PerEntry(answers))
        }),
        Op::InvalidateMany { entries, lease } => Box::pin(async move {
            let mut first_error = None;
            for keys in entries {
                if let Err(e) = store.invalidate(keys, lease).await {
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(Reply::Done), Err)
        }),
        Op::GetWithEpochs { keys, names } => Box::pin(async move {
            let value = store.get(keys).await?;
            Ok(Reply::ValueWithEpochs((value, store.epochs(names).await?)))
        }),
        Op::GetManyWithEpochs { entries, names } => Box::pin(async move {
            let (values, epochs) = tokio::join!(store.get_many(entries), store.epochs(names));
            Ok(Reply::ValuesWithEpochs((values?, epochs?)))
        }),
        single => store.run(single),
    }
}
