//! The Redis store: the [`Store`] and [`LockStore`] operations over one data connection, each a
//! Lua script (see [`scripts`]) or a plain read, with wake-ups over the store's [`PubSub`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::Value;

use super::capabilities::{probe, LockWrite, ProbeError, Probed};
use super::clock::ServerClock;
use super::cluster::LazyCluster;
use super::coalesce::{self, Coalescer};
use super::connection::ConnectionOptions;
use super::eviction::Answered;
use super::held_epoch::HeldEpoch;
use super::lock_writes;
use super::mget;
use super::pubsub::PubSub;
use super::replicas::{Acks, ReplicaWait};
use super::scripts::{
    self, unexpected, ClockCall, ExtendCall, InvalidateCall, InvalidateManyCall, NextFenceCall,
    PeekCall, RaiseEpochCall, RaiseFenceCall, ReadOrLockCall, ReadOrLockManyCall, RecordRunCall,
    ScriptCall, Scripts, SetCall, SinceLastRunCall, StoreAndUnlockCall, Told, UnlockCall, WakeCall,
    WriteFencedCall,
};
use super::traced::{Target, Traced};
use crate::error::BackendErrorKind;
use crate::join::join_all;
use crate::store::op::unanswered;
use crate::store::wakeup::Listener;
use crate::store::{
    Blob, BoxFuture, Clock, HolderTrace, LockOp, LockStore, ManyWithEpochs, Op, ReadOrLock, Reply,
    Store, StoreError, StoreResult,
};
use crate::wire::key::EntryKeys;

/// The most entries one batch request carries: one `MGET`, one read-or-lock or invalidate
/// script. Redis runs one script (and one command) at a time, so a script over every key of a
/// 10,000-key batch held the server for 147 ms while every other client waited (issue 27).
/// A batch's requests are cut into chunks of this size and sent all at once, pipelined on the
/// connection, so a cold batch still costs about one round trip, and other clients' commands
/// run between the chunks. Chosen by measurement (`cargo bench --bench big_batch`, docs/batch.md,
/// "A big batch and everyone else"): a script costs the server about 15 µs per key (147 ms for
/// 10,000), so 128 keys hold it about 2 ms, under the 5 ms of the latency monitor's threshold.
/// On the loaded 2-core machine, the median round's worst latency event was 8.5, 7.5, 7, 14 and
/// 16 ms for chunks of 32, 64, 128, 256 and 512 keys (251 ms in one script): 128 is the largest
/// at the noise floor, and the batch's own time did not move with the size.
pub(crate) const CHUNK_KEYS: usize = 128;

/// The Redis store, generic over the connection: a `ConnectionManager` for one server, a
/// [`LazyCluster`] for Redis Cluster.
pub(crate) struct RedisStore<C> {
    /// The data connection; [`Answered`] starts the eviction-policy check at its first answer,
    /// and [`Traced`] makes each request a client span.
    conn: Answered<Traced<C>>,
    /// Where the data connection goes, for the client spans of coalesced reads.
    target: Arc<Target>,
    /// Wake-up subscriptions, on a connection of their own (a subscribed connection can do
    /// nothing else).
    pubsub: Arc<PubSub>,
    /// `PUBLISH` or, on a cluster, `SPUBLISH` for wake-ups.
    scripts: Scripts,
    /// Freshness is stamped and judged by the server's clock, not this machine's.
    clock: Arc<ServerClock>,
    /// Appended to every wake-up channel: `@n` on database `n`, nothing on database 0. Pub/sub
    /// channels are global to a server, not per database, so without it caches on `/0` and `/1`
    /// with one namespace would wake each other's waiters. Database 0 (and so a cluster) keeps
    /// the bare name, so processes of an older version on it still wake and are woken.
    channel_suffix: String,
    /// Where the scripts announce changed entries to near tiers (`"<fence> <value key>"`), or
    /// `""`: a lock's own store (no values), where the scripts publish nothing but wake-ups.
    near_channel: String,
    /// Redis Cluster: a script may only touch the keys of one slot, so batch scripts are sent
    /// per slot.
    per_slot: bool,
    /// Concurrent single-key reads, coalesced into one `MGET` ([`ConnectionOptions::coalesce_reads`]).
    coalescer: Option<Arc<Coalescer>>,
    /// One server's namespace epoch held under tracking, so that a hit reads its value alone
    /// (see [`held_epoch`](super::held_epoch)). `None` on a cluster.
    held: Option<HeldEpoch>,
    /// Lock and fencing writes wait for replicas over this connection
    /// ([`ConnectionOptions::wait_for_replicas`]); `None`: they do not wait.
    replicas: Option<ReplicaWait<Traced<C>>>,
    /// What the server allows, probed at `build()` or at the first answer, and again after a
    /// call finds the connection lost (see [`capabilities`](super::capabilities)).
    probed: Arc<Probed>,
    /// A single server's client and the settings of a one-off connection: `build()` probes
    /// over a connection of its own, one attempt, so the data connection's reconnection
    /// schedule is not touched. `None` on a cluster.
    probe_client: Option<(redis::Client, redis::AsyncConnectionConfig)>,
}

impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedisStore<C> {
    /// A store over `conn`, announcing nothing until [`announcing`](Self::announcing).
    fn new(
        conn: C,
        target: Target,
        pubsub: Arc<PubSub>,
        scripts: Scripts,
        channel_suffix: String,
    ) -> Self {
        let target = Arc::new(target);
        let probed = Arc::<Probed>::default();
        // A cluster's nodes are not probed: its lock writes stay scripts (see `capabilities`).
        let first_probe = matches!(scripts, Scripts::Plain).then(|| Arc::clone(&probed));
        RedisStore {
            conn: Answered::new(Traced::new(conn, Arc::clone(&target)), first_probe),
            target,
            pubsub,
            scripts,
            clock: Arc::default(),
            channel_suffix,
            near_channel: String::new(),
            per_slot: false,
            coalescer: None,
            held: None,
            replicas: None,
            probed,
            probe_client: None,
        }
    }

    /// Coalesce concurrent single-key reads, or not (see [`coalesce`](super::coalesce)).
    fn coalescing(mut self, connection: &ConnectionOptions) -> Self {
        let per_slot = self.per_slot;
        self.coalescer = connection
            .coalesce_reads
            .then(|| Arc::new(Coalescer::new(per_slot)));
        self
    }

    /// Announce every change of an entry on the near channel of `namespace` (see
    /// [`near_channels`]).
    pub(crate) fn announcing(mut self, namespace: &str) -> Self {
        self.near_channel = near_channels(namespace, &self.channel_suffix).0;
        self
    }
}

/// The near tier's channels of `namespace` on a database (`suffix`, as for wake-ups, since
/// channels are global to a server): where the scripts announce changed entries, and the prefix
/// of each instance's own heartbeat channel. Wake-up channels always carry a `{tag}`, so these
/// never clash with them.
pub(crate) fn near_channels(namespace: &str, suffix: &str) -> (String, String) {
    (
        format!("{namespace}:near-tier{suffix}"),
        format!("{namespace}:near-tier{suffix}:heartbeat:"),
    )
}

impl RedisStore<ConnectionManager> {
    /// Connects lazily: building never fails because the server is down; calls do, with a
    /// backend error, until it is up.
    pub(crate) fn connect(
        client: redis::Client,
        connection: &ConnectionOptions,
    ) -> StoreResult<Self> {
        let conn =
            ConnectionManager::new_lazy_with_config(client.clone(), connection.manager_config())?;
        let pubsub = PubSub::connect(&client, connection)?;
        let info = client.get_connection_info();
        let db = info.redis_settings().db();
        let target = Target::of(info);
        let mut store = RedisStore::new(conn, target, pubsub, Scripts::Plain, channel_suffix(db))
            .coalescing(connection);
        store.probe_client = Some((client.clone(), connection.async_config()));
        store.held = connection.hold_epoch.then(|| {
            HeldEpoch::new(
                client.clone(),
                connection.async_config(),
                Arc::clone(&store.target),
                connection.coalesce_reads,
            )
        });
        if let Some(acks) = connection.wait_for_replicas {
            let config = connection.waited_manager_config(acks);
            let waited = ConnectionManager::new_lazy_with_config(client, config)?;
            let waited = Traced::new(waited, Arc::clone(&store.target));
            store.replicas = Some(ReplicaWait::new(waited, acks));
        }
        Ok(store)
    }

    /// The suffix of this store's channels (its database), for the near tier's feed.
    pub(crate) fn channel_suffix(&self) -> &str {
        &self.channel_suffix
    }
}

impl RedisStore<LazyCluster> {
    /// A Redis Cluster reached through `seeds` (any reachable nodes; the rest is discovered).
    /// Lazy like a single server: nothing is asked of the cluster until the first call, and a
    /// call made while it is unreachable fails with a backend error; the next one tries again.
    pub(crate) fn connect_cluster(
        seeds: &[String],
        connection: &ConnectionOptions,
    ) -> StoreResult<Self> {
        let conn = LazyCluster::new(connection.cluster_builder(seeds).build()?);
        let pubsub = PubSub::connect_cluster(seeds, connection)?;
        // A cluster has database 0 only.
        let target = Target::cluster();
        let mut store = RedisStore::new(conn, target, pubsub, Scripts::Sharded, String::new());
        store.per_slot = true;
        if let Some(acks) = connection.wait_for_replicas {
            let waited = connection.waited_cluster_builder(seeds, acks).build()?;
            let waited = Traced::new(LazyCluster::new(waited), Arc::clone(&store.target));
            store.replicas = Some(ReplicaWait::new(waited, acks));
        }
        Ok(store.coalescing(connection))
    }
}

/// The indices `0..n` as requests: grouped by `group_of` (groups in the order of their first
/// index, indices in order within each), each group cut into chunks of at most `chunk`.
fn chunked<G: Eq + std::hash::Hash>(
    n: usize,
    group_of: impl Fn(usize) -> G,
    chunk: usize,
) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<G, usize> = HashMap::new();
    for i in 0..n {
        let group = *index.entry(group_of(i)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(i);
    }
    groups
        .iter()
        .flat_map(|group| group.chunks(chunk).map(<[usize]>::to_vec))
        .collect()
}

/// What scopes a database's wake-up channels (see `RedisStore::channel_suffix`).
fn channel_suffix(db: i64) -> String {
    if db == 0 {
        String::new()
    } else {
        format!("@{db}")
    }
}

impl<C> RedisStore<C> {
    /// The indices of `entries` in the requests of a batch script: grouped as the server
    /// allows (all in one group on a single server; one group per slot on a cluster, since a
    /// script may only touch one slot's keys, and the entries of one group share it and their
    /// wake-up channels), then each group cut into chunks of at most [`CHUNK_KEYS`] entries, so
    /// that no script holds the server for long (see there).
    fn script_requests<E>(
        &self,
        entries: &[E],
        keys: impl Fn(&E) -> &EntryKeys,
    ) -> Vec<Vec<usize>> {
        if !self.per_slot {
            return chunked(entries.len(), |_| (), CHUNK_KEYS);
        }
        chunked(
            entries.len(),
            |i| redis::cluster_routing::Slot::for_key(&keys(&entries[i]).value),
            CHUNK_KEYS,
        )
    }

    /// The entry's wake-up channel on this store's database. It keeps the entry's hash tag, so
    /// sharded pub/sub still routes it to the slot's node.
    fn channel<'k>(&self, keys: &'k EntryKeys) -> std::borrow::Cow<'k, str> {
        if self.channel_suffix.is_empty() {
            keys.channel().into()
        } else {
            format!("{}{}", keys.channel(), self.channel_suffix).into()
        }
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Runs one script call on a clone of the data connection (it multiplexes; a clone per call
    /// because a call needs it mutable).
    async fn script<S: ScriptCall>(&self, call: S) -> StoreResult<S::Reply> {
        scripts::run(self.scripts, call, &mut self.conn.clone()).await
    }

    /// An operation (`run`, `lock`), boxed, watched for a lost connection: it may come back
    /// to another server (a failover), so the capabilities are probed again at its next
    /// answer. Only failures pay.
    ///
    /// `operation` makes the future inside the box: a future passed in would be kept twice
    /// there (as given, and as awaited), which takes a hit's box past the allocator's fast path.
    fn watched<'a, T: Send + 'a, F>(
        &'a self,
        operation: impl FnOnce() -> F + Send + 'a,
    ) -> BoxFuture<'a, StoreResult<T>>
    where
        F: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        Box::pin(async move {
            let answer = operation().await;
            if let Err(e) = &answer {
                if e.connection_lost() || e.kind() == BackendErrorKind::Unreachable {
                    self.conn.rearm();
                }
            }
            answer
        })
    }

    /// A Lua-free lock write (`lock_writes.rs`), read by `read`; `None` when the server refused
    /// the command itself (a syntax error or an unknown command: a failover to a server
    /// without it, before the next probe found out). Then the caller runs the script, and a
    /// probe is due at the next answer.
    async fn lock_write(
        &self,
        pipe: redis::Pipeline,
        read: fn(&[Value]) -> StoreResult<bool>,
    ) -> Option<StoreResult<bool>> {
        match pipe.query_async::<Vec<Value>>(&mut self.conn.clone()).await {
            Ok(replies) => Some(read(&replies)),
            Err(e) if matches!(e.code(), Some("ERR" | "EXECABORT")) => {
                self.conn.rearm();
                None
            }
            Err(e) => Some(Err(e.into())),
        }
    }

    /// Runs a lock or fencing write: followed by `WAIT` on the replicas' connection when writes
    /// wait for replicas (see [`replicas`](super::replicas)), else as [`script`](Self::script)
    /// does.
    async fn run_acked<S: ScriptCall>(&self, call: S) -> StoreResult<(S::Reply, Acks)> {
        match &self.replicas {
            Some(replicas) => replicas.run(self.scripts, call).await,
            None => Ok((self.script(call).await?, Ok(()))),
        }
    }

    /// A lock granted to `token` that too few replicas acknowledged: released, so that nobody
    /// holds a lock a failover could lose. Best effort: if the release fails too, the lease
    /// running out frees it.
    async fn release_unacked(&self, keys: &EntryKeys, token: &str) {
        if let Err(e) = self.unlock(keys, token).await {
            crate::log::throttled!(warn, key = %keys.user(), error = %e, "could not release a lock that too few replicas acknowledged; it expires with its lease");
        }
    }

    /// The answers of one read-or-lock-many request whose replicas fell `short`: each lock it
    /// granted is released and fails with `short`; values and held locks stand (they wrote
    /// nothing).
    async fn release_unacked_many(
        &self,
        entries: &[(&EntryKeys, &str, bool)],
        answers: Vec<StoreResult<ReadOrLock>>,
        short: &StoreError,
    ) -> Vec<StoreResult<ReadOrLock>> {
        let granted =
            |answer: &StoreResult<ReadOrLock>| matches!(answer, Ok(ReadOrLock::Acquired { .. }));
        let releases = entries
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| granted(answer))
            .map(|((keys, token, _), _)| self.release_unacked(keys, token));
        join_all(releases.collect()).await;
        entries
            .iter()
            .zip(answers)
            .map(|((keys, _, _), answer)| {
                if !granted(&answer) {
                    return answer;
                }
                // `short` names the request's first key: each entry's error names its own.
                let mut own = short.clone();
                if let StoreError::Redis { key, .. } = &mut own {
                    *key = Some(keys.value.clone());
                }
                Err(own)
            })
            .collect()
    }

    /// One `MGET` of the values of `entries` (at most [`CHUNK_KEYS`] of them) and the epochs
    /// `names`: the values in order, then each epoch read as a number, 0 when absent. Epoch
    /// bytes that are not a number are another program's: read as the highest epoch (every
    /// value it judges is gone) until `raise_epochs` repairs it.
    async fn mget(&self, entries: &[&EntryKeys], names: &[String]) -> StoreResult<ManyWithEpochs> {
        let values: Vec<&str> = entries.iter().map(|keys| keys.value.as_str()).collect();
        let (values, epochs) =
            mget::values_and_epochs(&self.conn, &values, names, self.per_slot).await?;
        Ok((
            values.into_iter().map(|v| v.map(Blob::Owned)).collect(),
            epochs,
        ))
    }
}

/// The lock operations: scripts, each followed by `WAIT` when lock writes wait for replicas.
impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn extend(&self, keys: &EntryKeys, token: &str, lease: Duration) -> StoreResult<bool> {
        // Writes that wait for replicas stay scripts: `ReplicaWait` runs a script, then `WAIT`.
        if self.replicas.is_none() && self.probed.renewal() == LockWrite::SetIfEq {
            let pipe = lock_writes::renewal(keys, token, lease);
            if let Some(renewed) = self.lock_write(pipe, lock_writes::renewed).await {
                return renewed;
            }
        }
        // A renewal too few replicas acknowledged does not count: the holder's lease is not
        // moved on (its heartbeat retries), since a failover could bring back the older expiry.
        let (extended, acks) = self.run_acked(ExtendCall { keys, token, lease }).await?;
        if extended {
            acks?;
        }
        Ok(extended)
    }

    async fn unlock(&self, keys: &EntryKeys, token: &str) -> StoreResult<bool> {
        let channel = self.channel(keys);
        if self.replicas.is_none() {
            let path = self.probed.release();
            if let Some(pipe) = lock_writes::release(path, self.scripts, keys, token, &channel) {
                if let Some(released) = self.lock_write(pipe, lock_writes::released).await {
                    return released;
                }
            }
        }
        let call = UnlockCall {
            keys,
            token,
            channel: &channel,
        };
        // Behind the acquisitions, when they wait for replicas (see `ReplicaWait::release`).
        match &self.replicas {
            Some(replicas) => replicas.release(self.scripts, call).await,
            None => self.script(call).await,
        }
    }

    async fn next_fence(&self, keys: &EntryKeys, lease: Duration) -> StoreResult<u64> {
        // A fence a failover could hand out again is no fence.
        let (fence, acks) = self.run_acked(NextFenceCall { keys, lease }).await?;
        acks.map(|()| fence)
    }

    async fn raise_fence(&self, keys: &EntryKeys, floor: u64, lease: Duration) -> StoreResult<()> {
        let ((), acks) = self
            .run_acked(RaiseFenceCall { keys, floor, lease })
            .await?;
        acks
    }

    /// A read-or-lock; with `trace`, the holder's trace of a lock found held (see
    /// [`ReadOrLockCall`]).
    async fn read_or_lock(
        &self,
        keys: &EntryKeys,
        token: &str,
        lease: Duration,
        read_value: bool,
        trace: Option<&str>,
    ) -> StoreResult<(ReadOrLock, Option<HolderTrace>)> {
        let call = ReadOrLockCall {
            keys,
            token,
            lease,
            read_value,
            trace,
        };
        match self.run_acked(call).await? {
            ((ReadOrLock::Acquired { .. }, _), Err(short)) => {
                self.release_unacked(keys, token).await;
                Err(short)
            }
            // A value read or a lock found held wrote nothing: no replica needs it.
            ((answer, trace), _) => Ok((self.birth_here(answer), trace)),
        }
    }

    /// A granted lock's birth, kept where the script's clock is the namespace's: one server.
    /// On a cluster the script ran on the entry's node, the clock is the clear key's, and the
    /// birth is read from there apart (`Op::Born`).
    fn birth_here(&self, answer: ReadOrLock) -> ReadOrLock {
        if self.per_slot {
            answer.without_birth()
        } else {
            answer
        }
    }

    async fn read_or_lock_many(
        &self,
        entries: &[(&EntryKeys, &str, bool)],
        lease: Duration,
    ) -> Vec<StoreResult<ReadOrLock>> {
        let groups = self.script_requests(entries, |(keys, _, _)| keys);
        let calls = groups.iter().map(|group| async move {
            let chunk: Vec<_> = group.iter().map(|&i| entries[i]).collect();
            let call = ReadOrLockManyCall {
                entries: chunk.clone(),
                lease,
            };
            match self.run_acked(call).await {
                Ok((answers, Ok(()))) => answers
                    .into_iter()
                    .map(|answer| answer.map(|answer| self.birth_here(answer)))
                    .collect(),
                Ok((answers, Err(short))) => {
                    self.release_unacked_many(&chunk, answers, &short).await
                }
                // A failed call fails each of its entries.
                Err(e) => vec![Err(e); group.len()],
            }
        });
        let answers = join_all(calls.collect()).await;
        let mut out: Vec<Option<StoreResult<ReadOrLock>>> = vec![None; entries.len()];
        for (group, answers) in groups.iter().zip(answers) {
            for (&i, answer) in group.iter().zip(answers) {
                out[i] = Some(answer);
            }
        }
        out.into_iter()
            .map(|answer| {
                answer
                    .unwrap_or_else(|| Err(unexpected("read-or-lock-many: no reply", &Value::Nil)))
            })
            .collect()
    }
}

/// The reads: `GET`, and `MGET`s of values and epochs.
impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn get(&self, keys: &EntryKeys) -> StoreResult<Option<Blob>> {
        let found = coalesce::value_alone(&self.conn, &keys.value).await?;
        Ok(found.map(Blob::Owned))
    }

    async fn epochs(&self, names: &[String]) -> StoreResult<Vec<u64>> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.mget(&[], names).await?.1)
    }

    async fn get_with_epochs(
        &self,
        keys: &EntryKeys,
        names: &Arc<[String]>,
    ) -> StoreResult<(Option<Blob>, Vec<u64>)> {
        let read = coalesce::Request {
            target: &self.target,
            per_slot: self.per_slot,
        };
        if let Some(held) = &self.held {
            if let Some(answer) = held.read(read, &keys.value, names).await? {
                return Ok(answer);
            }
        }
        let coalescer = self.coalescer.as_ref();
        if coalescer.is_none() && names.is_empty() {
            return Ok((self.get(keys).await?, Vec::new()));
        }
        let all = coalesce::Names::all(names);
        let answer = coalesce::read(&self.conn, coalescer, read, &keys.value, all).await?;
        if let Some(held) = &self.held {
            held.answered(names);
        }
        Ok(answer)
    }

    async fn get_many_with_epochs(
        &self,
        entries: &[&EntryKeys],
        names: &[String],
    ) -> StoreResult<ManyWithEpochs> {
        if entries.is_empty() && names.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        // One `MGET` per chunk of at most CHUNK_KEYS keys, all sent at once (pipelined on the
        // multiplexed connection); the epochs go in the first, which carries fewer values to
        // make room for them.
        let first_len = CHUNK_KEYS.saturating_sub(names.len()).max(1);
        let (first, rest) = entries.split_at(first_len.min(entries.len()));
        let reads = std::iter::once(self.mget(first, names))
            .chain(rest.chunks(CHUNK_KEYS).map(|chunk| self.mget(chunk, &[])));
        let mut values = Vec::with_capacity(entries.len());
        let mut epochs = Vec::new();
        for (i, chunk) in join_all(reads.collect()).await.into_iter().enumerate() {
            let (chunk, read) = chunk?;
            values.extend(chunk);
            if i == 0 {
                epochs = read;
            }
        }
        Ok((values, epochs))
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(StoreError::from)
    }
}

/// The writes: scripts that also wake the waiters and announce the change to near tiers.
impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn raise_epochs(&self, names: &[String], floor: u64) -> StoreResult<()> {
        let near_channel = self.near_channel.as_str();
        let raises = names.iter().map(|name| {
            self.script(RaiseEpochCall {
                name,
                floor,
                near_channel,
            })
        });
        let mut first_error = None;
        for raised in join_all(raises.collect()).await {
            if let Err(e) = raised {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn invalidate_many(&self, entries: &[&EntryKeys], lease: Duration) -> StoreResult<()> {
        let groups = self.script_requests(entries, |keys| keys);
        let calls = groups.iter().map(|group| {
            self.script(InvalidateManyCall {
                entries: group
                    .iter()
                    .map(|&i| (entries[i], self.channel(entries[i])))
                    .collect(),
                lease,
                near_channel: &self.near_channel,
            })
        });
        let results = join_all(calls.collect()).await;
        results
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    /// The write `op`: a script on the entry's channel.
    async fn write(&self, op: Op<'_>) -> StoreResult<Reply> {
        let (Op::WriteFenced { keys, .. }
        | Op::StoreAndUnlock { keys, .. }
        | Op::Set { keys, .. }
        | Op::Invalidate { keys, .. }
        | Op::Wake { keys }) = op
        else {
            return Err(unanswered(&op));
        };
        let channel = &self.channel(keys);
        let told = Told {
            channel,
            near_channel: &self.near_channel,
        };
        match op {
            Op::WriteFenced {
                keys,
                fence,
                write,
                lease,
            } => {
                let call = WriteFencedCall {
                    keys,
                    fence,
                    write,
                    lease,
                    told,
                };
                self.script(call).await.map(Reply::Flag)
            }
            Op::StoreAndUnlock {
                keys,
                token,
                fence,
                write,
            } => {
                let call = StoreAndUnlockCall {
                    keys,
                    token,
                    fence,
                    write,
                    told,
                };
                self.script(call).await.map(Reply::Stored)
            }
            Op::Set {
                keys,
                value,
                ttl,
                lease,
            } => {
                let call = SetCall {
                    keys,
                    value,
                    ttl,
                    lease,
                    told,
                };
                self.script(call).await.map(|()| Reply::Done)
            }
            Op::Invalidate { keys, lease } => {
                let call = InvalidateCall { keys, lease, told };
                self.script(call).await.map(|()| Reply::Done)
            }
            Op::Wake { keys } => {
                let call = WakeCall { keys, channel };
                self.script(call).await.map(|()| Reply::Done)
            }
            other => Err(unanswered(&other)),
        }
    }
}

impl<C> LockStore for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        self.watched(move || async move {
            Ok(match op {
                LockOp::TryLock { keys, token, lease } => {
                    let (answer, _) = self.read_or_lock(keys, token, lease, false, None).await?;
                    Reply::Acquire(answer.into())
                }
                LockOp::Extend { keys, token, lease } => {
                    Reply::Flag(self.extend(keys, token, lease).await?)
                }
                LockOp::Unlock { keys, token } => Reply::Flag(self.unlock(keys, token).await?),
                LockOp::NextFence { keys, lease } => {
                    Reply::Number(self.next_fence(keys, lease).await?)
                }
                LockOp::RaiseFence { keys, floor, lease } => {
                    self.raise_fence(keys, floor, lease).await?;
                    Reply::Done
                }
                LockOp::RecordRun { keys, fence, keep } => {
                    Reply::Flag(self.script(RecordRunCall { keys, fence, keep }).await?)
                }
                LockOp::SinceLastRun { keys } => {
                    Reply::Since(self.script(SinceLastRunCall { keys }).await?)
                }
                LockOp::Peek { keys } => Reply::Peek(self.script(PeekCall { keys }).await?),
            })
        })
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        Box::pin(async move { self.pubsub.listen(&self.channel(keys)).await })
    }

    fn capabilities(&self) -> Option<Arc<Probed>> {
        (!self.per_slot).then(|| Arc::clone(&self.probed))
    }

    fn probe_now(&self, timeout: Duration) -> BoxFuture<'_, Result<(), ProbeError>> {
        Box::pin(async move {
            let Some((client, config)) = &self.probe_client else {
                return Ok(());
            };
            let found = tokio::time::timeout(timeout, async {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map_err(ProbeError::from_connect)?;
                probe(&mut conn, timeout).await
            })
            .await
            .map_err(|_| ProbeError::timed_out())??;
            self.probed.set(found);
            Ok(())
        })
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        // The hit's read in a future of its own: boxed with the others, it would be as large
        // as the largest operation's (kilobytes), built and moved on every hit.
        if let Op::GetWithEpochs { keys, names } = op {
            return self.watched(move || async move {
                Ok(Reply::ValueWithEpochs(
                    self.get_with_epochs(keys, names).await?,
                ))
            });
        }
        self.watched(move || async move {
            Ok(match op {
                Op::Get { keys } => Reply::Value(self.get(keys).await?),
                Op::GetMany { entries } => {
                    Reply::Values(self.get_many_with_epochs(entries, &[]).await?.0)
                }
                Op::ReadOrLock {
                    keys,
                    token,
                    lease,
                    read_value,
                    trace,
                } => {
                    let answer = self.read_or_lock(keys, token, lease, read_value, trace);
                    match (answer.await?, trace) {
                        (answer, Some(_)) => Reply::ReadOrLockTraced(answer),
                        ((answer, _), None) => Reply::ReadOrLock(answer),
                    }
                }
                Op::ReadOrLockMany { entries, lease } => {
                    Reply::PerEntry(self.read_or_lock_many(entries, lease).await)
                }
                Op::InvalidateMany { entries, lease } => {
                    self.invalidate_many(entries, lease).await?;
                    Reply::Done
                }
                Op::Born { clock } => Reply::Number(self.script(ClockCall { clock }).await?),
                Op::Epochs { names } => Reply::Epochs(self.epochs(names).await?),
                Op::RaiseEpochs { names, floor } => {
                    self.raise_epochs(names, floor).await?;
                    Reply::Done
                }
                // Answered above; here too, so that the match needs no arm that panics.
                Op::GetWithEpochs { keys, names } => {
                    Reply::ValueWithEpochs(self.get_with_epochs(keys, names).await?)
                }
                Op::GetManyWithEpochs { entries, names } => {
                    Reply::ValuesWithEpochs(self.get_many_with_epochs(entries, names).await?)
                }
                Op::Ping => {
                    self.ping().await?;
                    Reply::Done
                }
                Op::WriteFenced { .. }
                | Op::StoreAndUnlock { .. }
                | Op::Set { .. }
                | Op::Invalidate { .. }
                | Op::Wake { .. } => self.write(op).await?,
            })
        })
    }

    fn clock(&self) -> &dyn Clock {
        self
    }
}

/// Freshness is judged by the server's clock, as estimated here (see `clock.rs`).
impl<C> Clock for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn is_synced(&self) -> bool {
        self.clock.is_synced()
    }

    fn sync(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.clock.sync(&self.conn))
    }

    /// Births are the `TIME` of the namespace's clock node (`ClockCall`).
    fn births_are_micros(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::chunked;

    #[test]
    fn one_group_is_cut_into_bounded_chunks_in_order() {
        let requests = chunked(300, |_| (), 128);
        let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
        assert_eq!(sizes, [128, 128, 44]);
        assert_eq!(requests.concat(), (0..300).collect::<Vec<_>>());
        assert!(chunked(0, |_| (), 128).is_empty());
    }

    #[test]
    fn each_group_is_chunked_on_its_own_and_no_chunk_mixes_groups() {
        // Two "slots", interleaved: chunks never mix them, and each slot keeps its order.
        let requests = chunked(10, |i| i % 2, 3);
        assert_eq!(
            requests,
            [vec![0, 2, 4], vec![6, 8], vec![1, 3, 5], vec![7, 9]]
        );
    }
}
