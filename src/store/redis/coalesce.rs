//! Concurrent single-key reads of one store, coalesced: while one `MGET` is out, the reads
//! that arrive wait in a queue and go out together as the next one. A read that finds
//! nothing out sends at once, by itself (a lone call waits for no company); under load each
//! `MGET` carries the reads that arrived during the one before, so the server runs one command
//! for many hits, and the namespace's epoch, which every read asks for, is read once per
//! `MGET`; reads of one key in a batch share its bytes.
//!
//! Company: when reads came together (the last batch carried more than one), the task that
//! sends the queue lets the scheduler run the other ready tasks once before it takes the
//! queue, so the callers a batch's answers woke, who read again at once, go out together.
//! Without it the first of them to read goes out by itself and the rest queue behind it: two
//! round trips per round, with the client idle during the lone one.
//!
//! Cancellation: the caller that sends a batch may be dropped while its `MGET` is out. The
//! reads it carried then see their answer channel closed and read again, each by itself; the
//! queue behind it is handed to a task. If that task cannot run or ends early (no runtime, the
//! runtime shutting down), its guard gives the turn back and lets the queued reads go, which
//! then read alone: the queue never waits for a sender that is gone.
//!
//! Explained in the guide: `docs/performance.md` (Reads coalesced into one `MGET`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionLike;
use redis::Value;
use tokio::sync::oneshot;
use tracing::{Instrument, Span};

use super::mget;
use super::traced::{record_error, Target};
use crate::join::join_all;
use crate::store::{Blob, StoreError, StoreResult};
use crate::sync::lock;

/// The most reads one `MGET` carries; a longer queue goes out as several, at once.
pub(crate) const MAX_READS: usize = 128;

/// A read's answer: the value's bytes, then its epochs in the order it named them.
pub(crate) type Answer = (Option<Blob>, Vec<u64>);

/// The epochs a read asks for: `all` but its first `skip` (a read whose namespace epoch is held
/// skips it, see `held_epoch.rs`), borrowed as the caller has them, so that skipping allocates
/// nothing.
#[derive(Clone, Copy)]
pub(crate) struct Names<'n> {
    pub(crate) all: &'n Arc<[String]>,
    pub(crate) skip: usize,
}

impl<'n> Names<'n> {
    /// All of `all`.
    pub(crate) fn all(all: &'n Arc<[String]>) -> Self {
        Names { all, skip: 0 }
    }

    fn asked(&self) -> &'n [String] {
        self.all.get(self.skip..).unwrap_or_default()
    }
}

/// One queued read.
struct Read {
    /// The value key.
    value: String,
    /// The epochs read with it: `names` from `skip` on (see [`Names`]).
    names: Arc<[String]>,
    skip: usize,
    answer: oneshot::Sender<StoreResult<Answer>>,
    /// The caller's client span for this read (disabled without a subscriber that wants it):
    /// the `MGET` that carries it is its request (see `traced.rs`).
    span: Span,
}

impl Read {
    /// The epochs this read asks for.
    fn asked(&self) -> &[String] {
        self.names.get(self.skip..).unwrap_or_default()
    }
}

/// How a store's single-key reads go out.
#[derive(Clone, Copy)]
pub(crate) struct Request<'s> {
    /// Where they go, for the client spans of queued reads.
    pub(crate) target: &'s Target,
    /// A Redis Cluster: one `MGET` per slot (see `mget.rs`).
    pub(crate) per_slot: bool,
}

/// The reads waiting for the next `MGET` of one store.
pub(crate) struct Coalescer {
    state: Mutex<State>,
    /// A Redis Cluster: one `MGET` per slot (see `mget.rs`).
    per_slot: bool,
}

#[derive(Default)]
struct State {
    queued: Vec<Read>,
    /// Whether a batch is out (its sender sends the queue when it returns).
    sending: bool,
    /// Whether the last batch taken carried more than one read (see the module's "Company").
    company: bool,
}

impl Coalescer {
    /// The coalescer of a store (`per_slot`: a cluster's).
    pub(crate) fn new(per_slot: bool) -> Self {
        Coalescer {
            state: Mutex::default(),
            per_slot,
        }
    }

    /// Takes the turn to send if no batch is out (then the queue is empty): the caller reads
    /// alone, at once, and hands the turn on when answered (see [`drain_in_task`]).
    fn lead(&self) -> bool {
        let mut state = lock(&self.state);
        !std::mem::replace(&mut state.sending, true)
    }

    /// Queues `read`. If no batch is out, the caller is to send the queue now: returned.
    fn enqueue(&self, read: Read) -> Option<Vec<Read>> {
        let mut state = lock(&self.state);
        state.queued.push(read);
        if state.sending {
            return None;
        }
        state.sending = true;
        Some(std::mem::take(&mut state.queued))
    }

    /// The sender of the queue went away before it was empty: no batch is out any more, and
    /// the reads queued are let go (their callers see their answer channel closed and read
    /// alone), so the queue never waits for a sender that is gone.
    fn give_up(&self) {
        let mut state = lock(&self.state);
        state.sending = false;
        state.company = false;
        state.queued.clear();
    }

    /// A read out on one server failed for want of an answer (`error`: the server silent past
    /// the response time-out, or the connection refused): the reads queued meanwhile fail with
    /// it at once, each about its own key. Sent next, they would wait on the same server a
    /// second time (a frozen server's second time-out, a dead one's reconnection attempts), and
    /// callers that were out together would fail apart, as they never do without coalescing: a
    /// fallback's single flight (`ComputeUncached`) would then run once for the first and again
    /// for the rest. A dropped connection is not such a failure: the queue goes out on the new
    /// connection, which may answer. Nor is anything on a cluster, whose queue holds reads of
    /// other masters.
    fn fail_queued(&self, error: &StoreError) {
        let StoreError::Redis { source, .. } = error else {
            return;
        };
        if self.per_slot || !(source.is_timeout() || source.is_connection_refusal()) {
            return;
        }
        let queued = std::mem::take(&mut lock(&self.state).queued);
        for read in queued {
            let mut own = error.clone();
            if let StoreError::Redis { key, .. } = &mut own {
                *key = Some(read.value.clone());
            }
            let _ = read.answer.send(Err(own));
        }
    }

    /// After a batch was answered: the reads queued meanwhile, to send next; `None` when
    /// there are none (then no batch is out).
    fn next(&self) -> Option<Vec<Read>> {
        let mut state = lock(&self.state);
        state.company = state.queued.len() > 1;
        if state.queued.is_empty() {
            state.sending = false;
            return None;
        }
        Some(std::mem::take(&mut state.queued))
    }

    /// After a batch was answered, whether its sender keeps the turn to send the next: reads
    /// are queued, or came in company and may yet come (see the module's "Company"). If not, no
    /// batch is out any more.
    fn keep_turn(&self) -> bool {
        let mut state = lock(&self.state);
        state.sending = state.company || !state.queued.is_empty();
        state.sending
    }

    /// Whether reads came in company lately.
    fn in_company(&self) -> bool {
        lock(&self.state).company
    }
}

/// The value `value` and the epochs `names`, read with the other single-key reads that arrive
/// while one is out, through `coalescer` (without one, alone): the one read of a hit.
pub(crate) async fn read<C>(
    conn: &C,
    coalescer: Option<&Arc<Coalescer>>,
    request: Request<'_>,
    value: &str,
    names: Names<'_>,
) -> StoreResult<Answer>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let per_slot = request.per_slot;
    let Some(coalescer) = coalescer else {
        return read_alone(conn, per_slot, value, names.asked()).await;
    };
    if coalescer.lead() {
        // Nothing was out: this caller reads now, alone (no company waited for). Dropped
        // before it returns, its guard hands the turn to a task, as when answered.
        let handover = Handover { conn, coalescer };
        let read = read_alone(conn, per_slot, value, names.asked()).await;
        if let Err(e) = &read {
            coalescer.fail_queued(e);
        }
        drop(handover);
        return read;
    }
    let (answer, answered) = oneshot::channel();
    // Queued: this caller's own client span, since another caller's request may carry it.
    let span = request.target.span("MGET", None);
    if !span.is_disabled() {
        span.record("stampede_guard.coalesced", true);
    }
    let read = Read {
        value: value.to_owned(),
        names: Arc::clone(names.all),
        skip: names.skip,
        answer,
        span: span.clone(),
    };
    if let Some(batch) = coalescer.enqueue(read) {
        // The batch out came back meanwhile: this caller sends the queue now. Dropped before
        // it returns, its guard hands the queue to a task. Boxed, as the read alone below:
        // the lone read, the common one, does not carry these futures in its own.
        let handover = Handover { conn, coalescer };
        if let Some(e) = Box::pin(send(conn, batch, per_slot)).await {
            coalescer.fail_queued(&e);
        }
        // Answered: the reads queued meanwhile go out from a task.
        drop(handover);
    }
    match answered.instrument(span.clone()).await {
        Ok(answer) => answer,
        // The caller that carried this read went away with it: read alone, in this read's span.
        Err(_) => Box::pin(read_alone(conn, per_slot, value, names.asked()).instrument(span)).await,
    }
}

/// One read by itself: on one server a `GET` when it asks for no epoch, else an `MGET` sized up
/// front and taken apart in place; on a cluster one per slot (the epochs may lie on other slots
/// than the value).
async fn read_alone<C>(
    conn: &C,
    per_slot: bool,
    value: &str,
    names: &[String],
) -> StoreResult<Answer>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if per_slot {
        // Boxed: a hit on one server, the common read, does not carry the cluster's larger
        // future in its own (the store boxes the hit's future; past 1 KiB it leaves the
        // allocator's fast path, and it is copied whole into its box).
        let values = [value];
        let read = Box::pin(mget::values_and_epochs(conn, &values, names, true));
        let (mut values, epochs) = read.await?;
        return Ok((values.pop().flatten().map(Blob::Owned), epochs));
    }
    if names.is_empty() {
        let found = value_alone(conn, value).await?;
        return Ok((found.map(Blob::Owned), Vec::new()));
    }
    let (found, epochs) = mget::value_with_epochs(conn, value, names).await?;
    Ok((found.map(Blob::Owned), epochs))
}

/// One value by itself, no epoch beside it (`Store::get`, or a hit on one server whose
/// namespace epoch is held, see `held_epoch.rs`): `GET`, its reply taken as it is. A key of
/// another Redis type is foreign data: a miss (as `MGET` answers it), logged, replaced on the
/// next write.
pub(crate) async fn value_alone<C>(conn: &C, value: &str) -> StoreResult<Option<Vec<u8>>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut get = redis::Cmd::with_capacity(2, 3 + value.len());
    get.arg("GET").arg(value);
    let reply = conn.clone().req_packed_command(&get).await;
    let reply = reply.and_then(|reply| match reply {
        Value::BulkString(bytes) => Ok(Some(bytes)),
        other => redis::from_redis_value(other.extract_error()?).map_err(Into::into),
    });
    match reply {
        Ok(found) => Ok(found),
        Err(e) if e.code() == Some("WRONGTYPE") => {
            crate::log::throttled!(warn, key = %value, "a non-string Redis value sits under the key; treating it as a miss");
            Ok(None)
        }
        Err(e) => Err(StoreError::from(e).about(value)),
    }
}

/// Hands the queue of a coalescer to a task when the caller that sent its batch returns (the
/// reads queued meanwhile go next) or is dropped while its `MGET` is out.
/// Borrowed: the connection is cloned only if there is a queue to hand on.
struct Handover<'s, C: ConnectionLike + Clone + Send + Sync + 'static> {
    conn: &'s C,
    coalescer: &'s Arc<Coalescer>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for Handover<'_, C> {
    fn drop(&mut self) {
        drain_in_task(self.conn, self.coalescer);
    }
}

/// Sends the queue of `coalescer` until it is empty, in a task of its own: the caller whose
/// read was answered (or who went away) goes back to its own work.
fn drain_in_task<C>(conn: &C, coalescer: &Arc<Coalescer>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if !coalescer.keep_turn() {
        return;
    }
    // The turn to send is the task's from here: if the task ends before the queue is empty
    // (the runtime shutting down, no runtime at all, a panic), its guard gives the turn back.
    let turn = Turn {
        coalescer: Arc::clone(coalescer),
        done: false,
    };
    let conn = conn.clone();
    let task = async move {
        let mut turn = turn;
        loop {
            if turn.coalescer.in_company() {
                // The callers just answered may read again in this turn of the scheduler.
                tokio::task::yield_now().await;
            }
            let Some(batch) = turn.coalescer.next() else {
                turn.done = true;
                return;
            };
            if let Some(e) = send(&conn, batch, turn.coalescer.per_slot).await {
                turn.coalescer.fail_queued(&e);
            }
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(task)),
        // No runtime to send from (a process shutting down): the guard gives up the turn.
        Err(_) => drop(task),
    }
}

/// The turn to send a coalescer's queue, held by the task that drains it.
struct Turn {
    coalescer: Arc<Coalescer>,
    /// The queue was found empty: the turn was given back by [`Coalescer::next`].
    done: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.done {
            self.coalescer.give_up();
        }
    }
}

/// Sends `batch`: one `MGET` per [`MAX_READS`] reads (all at once; on a cluster, `per_slot`, one
/// per slot of each), each answering its reads. Returns a failure met, if any.
async fn send<C>(conn: &C, batch: Vec<Read>, per_slot: bool) -> Option<StoreError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut chunks = Vec::new();
    let mut batch = batch.into_iter().peekable();
    while batch.peek().is_some() {
        chunks.push(batch.by_ref().take(MAX_READS).collect::<Vec<_>>());
    }
    join_all(
        chunks
            .into_iter()
            .map(|chunk| send_one(conn, chunk, per_slot))
            .collect(),
    )
    .await
    .into_iter()
    .find_map(Result::err)
}

/// One `MGET` of `reads`' value keys and the union of their epochs, each key once; its failure
/// returned too.
async fn send_one<C>(conn: &C, reads: Vec<Read>, per_slot: bool) -> StoreResult<()>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = Keys::of(&reads);
    // Sent inside the first read's client span, which stands for it: no second span.
    let span = reads
        .first()
        .map_or_else(Span::none, |read| read.span.clone());
    let answered = mget::mget(conn, &keys.names, per_slot)
        .instrument(span)
        .await;
    trace_carried(&reads, reads.len(), &answered);
    // Several reads of one key (a hot key under load) share its bytes rather than copy them.
    let shared: Vec<Option<Arc<[u8]>>> = match &answered {
        Ok(found) if reads.len() > 1 => found
            .iter()
            .map(|value| value.as_deref().map(Arc::from))
            .collect(),
        _ => Vec::new(),
    };
    let answers: Vec<StoreResult<Answer>> = reads
        .iter()
        .map(|read| {
            let found = answered.as_ref().map_err(Clone::clone)?;
            let at = |name: &str| keys.position(name).and_then(|i| found.get(i));
            let value = match keys.position(&read.value).and_then(|i| shared.get(i)) {
                Some(value) => value.clone().map(Blob::Shared),
                None => at(&read.value).cloned().flatten().map(Blob::Owned),
            };
            let epochs = read
                .asked()
                .iter()
                .map(|name| mget::parse_epoch(name, at(name).and_then(|v| v.as_deref())))
                .collect();
            Ok((value, epochs))
        })
        .collect();
    for (read, answer) in reads.into_iter().zip(answers) {
        // A caller that went away no longer listens.
        let _ = read.answer.send(answer);
    }
    answered.map(drop)
}

/// Records on each carried read's client span how many reads the `MGET` that carried it carried,
/// and its
/// failure.
fn trace_carried<T>(reads: &[Read], size: usize, answered: &StoreResult<T>) {
    for span in reads.iter().map(|read| &read.span) {
        if span.is_disabled() {
            continue;
        }
        // As `Target::span` does: a batch of one is no batch.
        if size > 1 {
            span.record("db.operation.batch.size", size);
        }
        if let Err(crate::store::StoreError::Redis { source, .. }) = answered {
            record_error(span, source);
        }
    }
}

/// The keys of one `MGET`: every read's value key and epochs, each once, in order.
struct Keys<'r> {
    names: Vec<&'r str>,
    /// Where each name went, once there are too many to search.
    at: Option<HashMap<&'r str, usize>>,
}

/// Up to this many keys a linear search finds a name faster than hashing it.
const SEARCHED: usize = 16;

impl<'r> Keys<'r> {
    fn of(reads: &'r [Read]) -> Self {
        let mut keys = Keys {
            names: Vec::new(),
            at: None,
        };
        let all = reads.iter().map(|read| read.value.as_str()).chain(
            reads
                .iter()
                .flat_map(|read| read.asked().iter().map(String::as_str)),
        );
        for name in all {
            if keys.position(name).is_none() {
                keys.names.push(name);
                if let Some(at) = &mut keys.at {
                    at.insert(name, keys.names.len() - 1);
                } else if keys.names.len() > SEARCHED {
                    keys.at = Some(
                        keys.names
                            .iter()
                            .enumerate()
                            .map(|(i, n)| (*n, i))
                            .collect(),
                    );
                }
            }
        }
        keys
    }

    fn position(&self, name: &str) -> Option<usize> {
        match &self.at {
            Some(at) => at.get(name).copied(),
            None => self.names.iter().position(|held| *held == name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: &str) -> (Read, oneshot::Receiver<StoreResult<Answer>>) {
        let (answer, rx) = oneshot::channel();
        let read = Read {
            value: value.to_owned(),
            names: Arc::default(),
            skip: 0,
            answer,
            span: Span::none(),
        };
        (read, rx)
    }

    #[test]
    fn a_sender_that_ends_early_gives_the_turn_back_and_lets_the_queue_go() {
        let coalescer = Arc::new(Coalescer::new(false));
        let (first, _a) = read("a");
        let _sent = coalescer.enqueue(first).expect("nothing out: send now");
        let (second, mut waiting) = read("b");
        assert!(coalescer.enqueue(second).is_none());
        // The task that drains the queue is dropped before it finished (no runtime, a
        // shutdown): its turn's guard goes with it.
        drop(Turn {
            coalescer: Arc::clone(&coalescer),
            done: false,
        });
        assert!(
            matches!(
                waiting.try_recv(),
                Err(oneshot::error::TryRecvError::Closed)
            ),
            "the queued read is let go, to read alone"
        );
        let (third, _c) = read("c");
        assert!(
            coalescer.enqueue(third).is_some(),
            "nothing out: the next read sends"
        );
    }

    #[test]
    fn a_sender_keeps_the_turn_while_reads_come_in_company() {
        let coalescer = Coalescer::new(false);
        let (a, _a) = read("a");
        let _sent = coalescer.enqueue(a).expect("nothing out: send now");
        let (b, _b) = read("b");
        let (c, _c) = read("c");
        assert!(coalescer.enqueue(b).is_none());
        assert!(coalescer.enqueue(c).is_none());
        assert_eq!(coalescer.next().map(|batch| batch.len()), Some(2));
        // Answered, the two may read again at once: the turn is kept though none is queued.
        assert!(coalescer.keep_turn());
        let (d, _d) = read("d");
        assert!(coalescer.enqueue(d).is_none(), "the turn is held: queue");
        assert_eq!(coalescer.next().map(|batch| batch.len()), Some(1));
        // A batch of one is no company: with nothing queued the turn is given back.
        assert!(!coalescer.keep_turn());
        let (e, _e) = read("e");
        assert!(coalescer.enqueue(e).is_some(), "nothing out: send at once");
    }

    #[test]
    fn a_lone_read_is_sent_at_once_and_later_ones_wait_for_it() {
        let coalescer = Coalescer::new(false);
        let (first, _a) = read("a");
        let batch = coalescer.enqueue(first).expect("nothing out: send now");
        assert_eq!(batch.len(), 1);
        let (second, _b) = read("b");
        let (third, _c) = read("c");
        assert!(coalescer.enqueue(second).is_none(), "one is out: wait");
        assert!(coalescer.enqueue(third).is_none());
        let next = coalescer.next().expect("the queue goes next");
        assert_eq!(
            next.iter().map(|r| r.value.as_str()).collect::<Vec<_>>(),
            ["b", "c"]
        );
        assert!(coalescer.next().is_none(), "nothing queued: none out now");
        let (fourth, _d) = read("d");
        assert!(
            coalescer.enqueue(fourth).is_some(),
            "nothing out again: send at once"
        );
    }
}
