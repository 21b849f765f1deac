//! The namespace's epoch, and its tags' epochs, held in process, so that a hit on one server
//! reads its value alone, tags or not.
//!
//! Every read asks for the namespace's epoch (its clear key) beside the value, and for the
//! epochs of the tags the handle names or the value carried: a value born before the last
//! `clear` or an invalidation of one of its tags is no value. Held in process, an epoch need not
//! be read again as long as Redis has not changed it, and Redis says so itself: the reads go out
//! on one RESP3 connection of their own with `CLIENT TRACKING ON OPTIN`, the epochs read once
//! on it after `CLIENT CACHING yes` (so only those keys are tracked, at most [`HELD_NAMES`]),
//! and any change of one (a `clear` or an `invalidate_tag` by any client, an outside `SET`, an
//! eviction, `FLUSHDB`) comes back as an invalidation on that very connection; it forgets them
//! all, and the next reads learn them again. Redis writes the invalidation into the
//! connection's stream when the change happens, so it comes before the reply of any read the
//! server ran after the change, and redis-rs hands it to the push sender before it hands on that
//! reply. A read therefore takes a
//! [`Ticket`] (the epoch and a generation) before it is sent, and after its answer checks that
//! the generation did not move ([`HeldEpoch::still`]); if it moved, the read is done again the
//! old way, the epochs read beside the value. A read whose first names are held skips those
//! and reads the rest beside the value. A lost connection moves the generation too (a read
//! out on it fails, as one on the data connection would), and so does a read on it that gets no
//! answer (a time-out; a driver dropped with its runtime says nothing): the connection is let
//! go, the next reads go the old way, and one answered there connects and learns again, in the
//! background. Each connection has its own queue of coalesced reads, so a read is sent on the
//! connection its ticket was given for.
//!
//! Only on one server: on a cluster the epoch lies on another node than most values, and an
//! invalidation from one node is not ordered with a reply from another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, Value};
use tokio::time::Instant;

use super::coalesce::{self, Coalescer};
use super::mget::parse_epoch;
use super::traced::{Target, Traced};
use crate::store::StoreResult;
use crate::sync::lock;
use crate::BackendErrorKind;

/// The longest wait before connecting again after a failure (a server without RESP3 or
/// tracking, or a managed one that refuses `CLIENT`): reads go the old way meanwhile.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// The most epochs held at once: the clear key's and the tags' that reads ask for most (a
/// handle's tags, then those values carried). A read asking for more reads the others beside
/// its value; the server tracks no more keys than this for the connection.
pub(crate) const HELD_NAMES: usize = 32;

/// The reads' own connection, as handed to a read.
pub(crate) type Tracked = Traced<MultiplexedConnection>;

/// The epochs of one namespace, held under Redis's own tracking (see the module's docs).
pub(crate) struct HeldEpoch {
    /// The server, over RESP3, and the time-outs of the data connection.
    client: redis::Client,
    config: AsyncConnectionConfig,
    target: Arc<Target>,
    /// The clear key, taken from the first read that asks for it: a store serves one namespace.
    name: OnceLock<String>,
    shared: Arc<Shared>,
    /// Whether the reads on a tracked connection are coalesced, as the data connection's are
    /// ([`ConnectionOptions::coalesce_reads`](crate::ConnectionOptions::coalesce_reads)).
    coalesce: bool,
}

/// What the push sender (on the connection's driver) and the reads share.
#[derive(Default)]
struct Shared {
    /// Moved (under `state`'s lock) by every invalidation and every lost connection.
    generation: AtomicU64,
    /// The serial the next tracked connection gets.
    serials: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Shared: a read's ticket holds it by one reference count, not a copy of the connection.
    link: Option<Arc<Link>>,
    /// The epochs read on `link` under tracking in the current generation, by name: the clear
    /// key's first, once learned; at most [`HELD_NAMES`].
    epochs: Vec<(String, u64)>,
    /// A connection or a learning read is under way.
    busy: bool,
    /// After a failure, no attempt before this; the wait doubles up to [`MAX_RETRY`].
    retry_at: Option<Instant>,
    backoff: Duration,
}

/// One tracked connection, and the queue of the reads that go out on it: a read queued behind
/// another goes out on the connection its ticket was given for, never on a later one.
#[derive(Clone)]
struct Link {
    /// Which connection a push or a failure is about: only the current one's loss drops it.
    serial: u64,
    conn: Tracked,
    coalescer: Option<Arc<Coalescer>>,
}

/// A read's leave to skip the first of its epochs: the connection to read on and the epochs to
/// judge by (with room for those read beside the value), valid if the generation has not moved
/// once the read is answered.
struct Ticket {
    link: Arc<Link>,
    epochs: Vec<u64>,
    generation: u64,
}

impl Shared {
    /// Redis changed the epoch (an invalidation, on any tracked connection): what is held is
    /// no longer proven.
    fn forget(&self) {
        let mut state = lock(&self.state);
        self.generation.fetch_add(1, Ordering::SeqCst);
        state.epochs.clear();
    }

    /// The connection `serial` is lost, or no longer trusted: nothing held is proven, and if
    /// it is the current one, the next learning connects again. A late push from an older
    /// connection does not drop the current one.
    fn lost(&self, serial: u64) {
        let mut state = lock(&self.state);
        self.generation.fetch_add(1, Ordering::SeqCst);
        state.epochs.clear();
        if state
            .link
            .as_ref()
            .is_some_and(|link| link.serial == serial)
        {
            state.link = None;
        }
    }

    /// An attempt to learn failed (on the connection `serial`, if it got one): forget that
    /// connection and wait before the next attempt.
    fn failed(&self, serial: Option<u64>) {
        match serial {
            Some(serial) => self.lost(serial),
            None => self.forget(),
        }
        let mut state = lock(&self.state);
        state.backoff = (state.backoff * 2).clamp(Duration::from_secs(1), MAX_RETRY);
        state.retry_at = Some(Instant::now() + state.backoff);
    }
}

/// Marks a learning as under way, and ends it however its task ends: completed, failed, or
/// dropped with its runtime (a cache kept across runtimes must not stay without its epoch).
struct Learning(Arc<Shared>);

impl Drop for Learning {
    fn drop(&mut self) {
        lock(&self.0.state).busy = false;
    }
}

impl HeldEpoch {
    /// The held epoch of the server `client` reaches (turned to RESP3 here), with the data
    /// connection's time-outs; its reads coalesced if `coalesce`.
    pub(crate) fn new(
        client: redis::Client,
        config: AsyncConnectionConfig,
        target: Arc<Target>,
        coalesce: bool,
    ) -> Self {
        HeldEpoch {
            client,
            config,
            target,
            name: OnceLock::new(),
            shared: Arc::default(),
            coalesce,
        }
    }

    /// The read of `value` with the epochs `names` (the clear key first), the first taken as
    /// held: the value and the other epochs read on the tracked connection, the held epoch put
    /// first. `Ok(None)` when it is not held, or when Redis changed it before the answer came
    /// back: then the caller reads the old way. A failure is the read's error, as on the data
    /// connection: asked again the old way, a frozen server would cost the read a second
    /// time-out, a refusal would come again, and a server that went away would keep the
    /// callers that were out together waiting on the data connection's reconnection one by
    /// one, so that a fallback's single flight (`ComputeUncached`) ran more than once.
    pub(crate) async fn read(
        &self,
        request: coalesce::Request<'_>,
        value: &str,
        names: &Arc<[String]>,
    ) -> StoreResult<Option<coalesce::Answer>> {
        let Some(ticket) = self.ticket(names) else {
            return Ok(None);
        };
        let rest = coalesce::Names {
            all: names,
            skip: ticket.epochs.len(),
        };
        let link = &ticket.link;
        let read = coalesce::read(&link.conn, link.coalescer.as_ref(), request, value, rest);
        let (value, mut epochs) = match read.await {
            Ok(answer) => answer,
            Err(e) => {
                // No answer on it: the connection is not trusted any more. Its driver may be
                // gone without a word (dropped with the runtime that ran it) or its path
                // black-holed; the next reads go the old way, and one answered there connects
                // again.
                if e.kind() == BackendErrorKind::Unreachable {
                    self.shared.lost(link.serial);
                }
                return Err(e);
            }
        };
        if !self.still(&ticket) {
            return Ok(None);
        }
        let mut held = ticket.epochs;
        if held.len() < names.len() {
            // Some were read beside the value: learned for the next reads.
            self.answered(names);
        }
        held.append(&mut epochs);
        Ok(Some((value, held)))
    }

    /// Leave for a read that asks for `names` (the clear key first) to skip the longest run of
    /// them from the first that is held: `None` when the clear key's epoch is not held now.
    fn ticket(&self, names: &[String]) -> Option<Ticket> {
        if self.name.get()? != names.first()? {
            return None;
        }
        let state = lock(&self.shared.state);
        let link = state.link.as_ref()?;
        let mut epochs = Vec::with_capacity(names.len());
        for name in names {
            match state.epochs.iter().find(|(held, _)| held == name) {
                Some(&(_, epoch)) => epochs.push(epoch),
                None => break,
            }
        }
        if epochs.is_empty() {
            return None;
        }
        Some(Ticket {
            link: Arc::clone(link),
            epochs,
            generation: self.shared.generation.load(Ordering::SeqCst),
        })
    }

    /// A read that asked for `names` (the clear key first) was answered with some of them read
    /// beside the value: the server answers, so those not held are learned under tracking now,
    /// in the background (the connection made first if there is none), unless that is under
    /// way, failed a moment ago, or [`HELD_NAMES`] are held.
    pub(crate) fn answered(&self, names: &[String]) {
        let Some(first) = names.first() else {
            return;
        };
        if self.name.get_or_init(|| first.clone()) != first {
            return;
        }
        let mut state = lock(&self.shared.state);
        let waiting = state.retry_at.is_some_and(|at| Instant::now() < at);
        if state.busy || waiting {
            return;
        }
        // Only those not held are read (in the order asked: the clear key first if missing,
        // without which nothing held is used).
        let room = HELD_NAMES.saturating_sub(state.epochs.len());
        if room == 0 {
            return;
        }
        let missing: Vec<String> = (names.iter())
            .filter(|name| !state.epochs.iter().any(|(held, _)| held == *name))
            .take(room)
            .cloned()
            .collect();
        if missing.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            state.busy = true;
            let link = state.link.clone();
            drop(state);
            let learning = Learning(Arc::clone(&self.shared));
            runtime.spawn(self.learn(link, missing, learning));
        }
    }

    /// Whether what `ticket` was given still holds now that its read was answered: no
    /// invalidation and no lost connection came in between (see the module's docs).
    fn still(&self, ticket: &Ticket) -> bool {
        self.shared.generation.load(Ordering::SeqCst) == ticket.generation
    }

    /// Connects (if `link` is `None`) and reads the epochs `names` under tracking; `learning`
    /// ends with it.
    fn learn(
        &self,
        link: Option<Arc<Link>>,
        names: Vec<String>,
        learning: Learning,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (client, shared, target) = (
            self.client.clone(),
            Arc::clone(&self.shared),
            Arc::clone(&self.target),
        );
        let config = self.config.clone();
        let coalesce = self.coalesce;
        async move {
            // Declared first, dropped last: after the state's lock below is let go.
            let _learning = learning;
            let link = match link {
                Some(link) => link,
                None => match connect(&client, config, &shared, target, coalesce).await {
                    Ok(link) => Arc::new(link),
                    Err(e) => {
                        tracing::debug!(error = %e, "reads keep asking for the namespace's epoch: no tracked connection");
                        return shared.failed(None);
                    }
                },
            };
            let generation = shared.generation.load(Ordering::SeqCst);
            // One key (the clear key alone, a handle without tags) is a `GET`, as ever; more
            // are one `MGET`.
            let read = redis::pipe()
                .cmd("CLIENT")
                .arg("CACHING")
                .arg("yes")
                .ignore()
                .cmd(if names.len() == 1 { "GET" } else { "MGET" })
                .arg(&names)
                .query_async::<(Value,)>(&mut link.conn.clone())
                .await
                .map(|(read,)| match read {
                    Value::Array(values) => values.into_iter().map(epoch_bytes).collect(),
                    one => vec![epoch_bytes(one)],
                });
            let epochs: Vec<Option<Vec<u8>>> = match read {
                Ok(epochs) if epochs.len() == names.len() => epochs,
                Ok(_) => return shared.failed(Some(link.serial)),
                Err(e) => {
                    tracing::debug!(error = %e, "reads keep asking for the namespace's epochs: they could not be read under tracking");
                    return shared.failed(Some(link.serial));
                }
            };
            let mut state = lock(&shared.state);
            state.backoff = Duration::ZERO;
            state.retry_at = None;
            // An invalidation or a lost connection since the read was sent: not proven. What
            // is held already was read in this generation too (each move clears it).
            if shared.generation.load(Ordering::SeqCst) == generation {
                state.link = Some(link);
                for (name, epoch) in names.into_iter().zip(epochs) {
                    let epoch = parse_epoch(&name, epoch.as_deref());
                    if !state.epochs.iter().any(|(held, _)| *held == name) {
                        state.epochs.push((name, epoch));
                    }
                }
            }
        }
    }
}

/// An epoch's bytes as read (none for a key that is absent; another type's reply is read as
/// bytes that are not a number, which `parse_epoch` takes for the highest epoch).
fn epoch_bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::Nil => None,
        Value::BulkString(bytes) => Some(bytes),
        _ => Some(Vec::new()),
    }
}

/// A RESP3 connection whose pushes (invalidations, the connection's loss) make `shared` forget,
/// with tracking on for the keys read after `CLIENT CACHING yes`; its reads coalesced if
/// `coalesce`.
async fn connect(
    client: &redis::Client,
    config: AsyncConnectionConfig,
    shared: &Arc<Shared>,
    target: Arc<Target>,
    coalesce: bool,
) -> redis::RedisResult<Link> {
    let serial = shared.serials.fetch_add(1, Ordering::SeqCst);
    let heard = Arc::downgrade(shared);
    let config = config.set_push_sender(move |push: PushInfo| {
        if let Some(shared) = heard.upgrade() {
            match push.kind {
                redis::PushKind::Disconnection => shared.lost(serial),
                _ => shared.forget(),
            }
        }
        Ok::<(), std::convert::Infallible>(())
    });
    let client = super::connection::resp3(client)?;
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    redis::cmd("CLIENT")
        .arg("TRACKING")
        .arg("ON")
        .arg("OPTIN")
        .exec_async(&mut conn)
        .await?;
    Ok(Link {
        serial,
        conn: Traced::new(conn, target),
        coalescer: coalesce.then(|| Arc::new(Coalescer::new(false))),
    })
}
