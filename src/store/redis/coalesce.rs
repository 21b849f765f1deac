//! Concurrent single-key reads of one store, coalesced: while one `MGET` is out, the reads that
//! arrive wait in a queue and go out together as the next one. A read that finds nothing out
//! sends at once, by itself (a lone call waits for no company); under load each `MGET` carries
//! the reads that arrived during the previous one, so the server runs one command for many
//! hits, and the namespace's epoch, which every read asks for, is read once per `MGET`.
//!
//! Cancellation: the caller that sends a batch may be dropped while its `MGET` is out. The
//! reads it carried then see their answer channel closed and read again, each by itself; the
//! queue behind it is handed to a task, so it never stalls.
//!
//! Explained in the guide: `docs/performance.md` (Reads coalesced into one `MGET`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionLike;
use redis::Value;
use tokio::sync::oneshot;

use super::scripts::unexpected;
use crate::join::join_all;
use crate::store::{Blob, StoreError, StoreResult};
use crate::sync::lock;

/// The most reads one `MGET` carries; a longer queue goes out as several, at once.
pub(crate) const MAX_READS: usize = 128;

/// A read's answer: the value's bytes, then its epochs in the order it named them.
pub(crate) type Answer = (Option<Blob>, Vec<u64>);

/// One queued read.
pub(crate) struct Read {
    /// The value key.
    pub(crate) value: String,
    /// The epochs read with it.
    pub(crate) names: Arc<[String]>,
    pub(crate) answer: oneshot::Sender<StoreResult<Answer>>,
}

/// The reads waiting for the next `MGET` of one store.
#[derive(Default)]
pub(crate) struct Coalescer {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queued: Vec<Read>,
    /// Whether a batch is out (its sender sends the queue when it returns).
    sending: bool,
}

impl Coalescer {
    /// Queues `read`. If no batch is out, the caller is to send the queue now: returned.
    pub(crate) fn enqueue(&self, read: Read) -> Option<Vec<Read>> {
        let mut state = lock(&self.state);
        state.queued.push(read);
        if state.sending {
            return None;
        }
        state.sending = true;
        Some(std::mem::take(&mut state.queued))
    }

    /// After a batch was answered: the reads queued meanwhile, to send next; `None` when
    /// there are none (then no batch is out).
    pub(crate) fn next(&self) -> Option<Vec<Read>> {
        let mut state = lock(&self.state);
        if state.queued.is_empty() {
            state.sending = false;
            return None;
        }
        Some(std::mem::take(&mut state.queued))
    }
}

/// Sends `batch`, then the queue of `coalescer` until it is empty, in a task of its own: the
/// caller whose read was answered goes back to its own work.
pub(crate) fn drain_in_task<C>(conn: C, coalescer: Arc<Coalescer>, batch: Option<Vec<Read>>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let Some(batch) = batch.or_else(|| coalescer.next()) else {
        return;
    };
    let task = async move {
        let mut batch = batch;
        loop {
            send(&conn, batch).await;
            match coalescer.next() {
                Some(next) => batch = next,
                None => return,
            }
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(task)),
        // No runtime (a process shutting down): nothing can be read any more; the queued
        // reads see their channels closed.
        Err(_) => drop(task),
    }
}

/// Sends `batch`: one `MGET` per [`MAX_READS`] reads (all at once), each answering its reads.
pub(crate) async fn send<C>(conn: &C, batch: Vec<Read>)
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
            .map(|chunk| send_one(conn, chunk))
            .collect(),
    )
    .await;
}

/// One `MGET` of `reads`' value keys and the union of their epochs, each key once.
async fn send_one<C>(conn: &C, reads: Vec<Read>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut slot: HashMap<&str, usize> = HashMap::new();
    let mut mget = redis::cmd("MGET");
    for name in reads.iter().map(|read| read.value.as_str()).chain(
        reads
            .iter()
            .flat_map(|read| read.names.iter().map(String::as_str)),
    ) {
        let next = slot.len();
        slot.entry(name).or_insert_with(|| {
            mget.arg(name);
            next
        });
    }
    let answered: StoreResult<Vec<Option<Vec<u8>>>> = mget
        .query_async(&mut conn.clone())
        .await
        .map_err(|e| StoreError::from(e).about(&reads[0].value));
    let answered = answered.and_then(|found| {
        if found.len() == slot.len() {
            Ok(found)
        } else {
            Err(unexpected("mget: wrong number of values", &Value::Nil))
        }
    });
    let answers: Vec<StoreResult<Answer>> = reads
        .iter()
        .map(|read| {
            let found = answered.as_ref().map_err(Clone::clone)?;
            let at = |name: &str| slot.get(name).and_then(|&i| found.get(i));
            let value = at(&read.value).cloned().flatten().map(Blob::Owned);
            let epochs = read
                .names
                .iter()
                .map(|name| super::store::parse_epoch(name, at(name).and_then(|v| v.as_deref())))
                .collect();
            Ok((value, epochs))
        })
        .collect();
    for (read, answer) in reads.into_iter().zip(answers) {
        // A caller that went away no longer listens.
        let _ = read.answer.send(answer);
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
            answer,
        };
        (read, rx)
    }

    #[test]
    fn a_lone_read_is_sent_at_once_and_later_ones_wait_for_it() {
        let coalescer = Coalescer::default();
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
