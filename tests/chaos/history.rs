//! The history of a chaos run: what the workers, the server and the controller recorded, in
//! the form the checker (`checker.rs`) judges.
//!
//! Where each part comes from, and why the faults cannot corrupt it:
//! - worker events (calls, computations, critical sections) are appended by each worker process to
//!   its own file, one line per event, written with one `write` each before the worker goes on:
//!   a SIGKILL loses at most the event it was about to write, never an earlier one;
//! - what the cache server *accepted* is read from the server itself: `redis-cli monitor` on the
//!   server's own port (not through the faulty proxy) prints every command a script runs, in the
//!   order the server ran them; `replay.rs` turns that into acquisitions, fence bumps and
//!   value writes, replaying the fencing counter from its seed;
//! - what the lock holders' writes achieved is decided by a fenced sink on a second redis-server
//!   that no fault touches, which refuses a token lower than the highest it has seen;
//! - the controller's own record: restarts, pauses, kills, the lock keys left after the run, and
//!   the lock keys the server evicted under memory pressure (keyspace notifications on
//!   `__keyevent@0__:evicted`, read on the server's own port).
//!
//!
//! The rules it is judged by: `checker.rs`.

use std::collections::HashMap;

pub use stampede_guard::__private::Epoch;

/// A call of the cache API made by a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub instance: String,
    pub id: u64,
    pub op: String,
    pub key: String,
    pub start_us: u64,
    /// `None`: no end was recorded (the process was killed, or the call hung).
    pub end_us: Option<u64>,
    pub outcome: Outcome,
    /// The value was served from a copy the near tier held while the backend was unreachable
    /// (`Source::Held`): judged by rule (g), with the relaxed bound, instead of rule (f).
    pub held: bool,
    /// The value was served as `Source::Hit`: read by this call itself, from Redis or its near
    /// tier. A near copy is only ever served as a hit (or as held), so rule (f) judges these;
    /// a follower of this process's flight gets `Waited`, read when its leader asked.
    pub hit: bool,
    /// Where the value came from, as the worker wrote it after the value (`hit`, `held`,
    /// `computed`, `waited`...; `near` for a hit the near tier served, where the worker can
    /// tell; empty for other outcomes): evidence in a finding.
    pub source: String,
}

/// The epochs a call raises, if it is a tag invalidation or a clear (as the workers log them:
/// the op, and in the key's place the tags joined by `+`, `*` for a clear).
pub fn raised_by(call: &Call) -> Option<Vec<Epoch>> {
    match call.op.as_str() {
        "clear" => Some(vec![Epoch::Clear]),
        "invalidate_tag" | "invalidate_tags" => Some(
            call.key
                .split('+')
                .map(|tag| Epoch::Tag(tag.to_string()))
                .collect(),
        ),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pending,
    /// `get_or_compute` returned this value.
    Value(String),
    /// `invalidate` / `set` succeeded.
    Done,
    /// The write could not reach the server and waits in the instance's auto-recovery queue
    /// (`Written::Queued`): judged by rule (i), not as done.
    Queued,
    /// A typed error, by kind (`Backend`, `WaitTimeout`, `Compute`...).
    Error(String),
}

/// A computation run under the cache's lock (`get_or_compute_with_lease`).
#[derive(Debug, Clone, PartialEq)]
pub struct Compute {
    pub instance: String,
    pub key: String,
    pub token: u64,
    pub start_us: u64,
    pub end_us: u64,
    pub value: String,
}

/// A critical section under a [`Lock`] or as the active [`Leader`]: from the acquisition to the
/// last moment the holder checked and found its lease valid.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub instance: String,
    pub id: u64,
    pub lock: String,
    pub token: u64,
    /// Just before the acquisition was requested.
    pub asked_us: u64,
    /// Just after it was granted.
    pub start_us: u64,
    /// Read just before the last check of the lease that found it valid.
    pub end_us: u64,
    /// Writes sent to the sink, and how many it accepted (from the sink's own log).
    pub writes: u32,
    pub accepted: u32,
}

/// What the cache server did, in its order.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// A new, empty server (a restart).
    Life(u32),
    /// A lock was taken and the fencing counter bumped to `token`.
    Acquire { key: String, token: u64 },
    /// The counter was bumped by an invalidation or a `set`.
    Bump { key: String, cause: BumpCause },
    /// A value was written.
    Write(Write),
    /// The value was deleted without a bump: a failed refresh's fenced delete, which the server
    /// accepts only while the counter is still the refresh's own token.
    Delete { key: String },
    /// A value was written that the crate's own reader refused (`reason`): its fence and value
    /// are unknown, so the checker reports it instead of judging it. Also an epoch set to
    /// something that is not a number (`key` is then the epoch's Redis key).
    Unreadable { key: String, reason: String },
    /// An epoch was raised (`invalidate_tag`, `clear`).
    Raise(Raise),
    /// On a cluster: the entry's scripts began to run on another node without a migration
    /// moving it there (a failover), so the counter is the one the new master had replicated,
    /// possibly behind the old master's. Placed where the switch happened, resolved by the replay
    /// from what the new master did next.
    Rollback(Rollback),
}

/// A failover's effect on one entry's fencing counter, as the replay proves it: the counter the
/// new master went on from (`to`), read back from its first accepted computed write (which the
/// store script accepts only while the counter equals the write's fence, so the counter at the
/// switch is that fence minus the bumps the new master made before it), and the bumps the old
/// master had made above it, which the new master never had (lost with the old master).
#[derive(Debug, Clone, PartialEq)]
pub struct Rollback {
    pub key: String,
    /// The first script on the new master (MONITOR timestamp).
    pub at_us: u64,
    /// What the new master's counter held at the switch. `None`: not proven (no accepted
    /// computed write before the entry's next switch or the end of the run), or the counter was
    /// gone there and was seeded again from the clock (`reseeded`): either way the entry's
    /// earlier tokens are no evidence for its later ones.
    pub to: Option<u64>,
    pub reseeded: bool,
    /// The new master's first bump set its counter to its clock, above counter + 1
    /// (`bump_fence`): `to` is not known, but every token from there on must be above every
    /// token and write the old master handed out or accepted.
    pub raised: bool,
    /// The old master's counter at the switch, as replayed (`None`: not known).
    pub from: Option<u64>,
    /// The bumps above `to` that the old master made: (counter, what bumped it).
    pub lost: Vec<(u64, &'static str)>,
    /// The last bump at or below `to` that the replay saw: the counter's state after the
    /// switch (the token of an acquisition, `None` for an invalidation or a `set`).
    pub survivor: Option<(Option<u64>, &'static str)>,
}

/// A fault of the cluster schedule that could change which node is master of some keys: from
/// the fault to the moment the controller found the cluster healthy again.
#[derive(Debug, Clone, PartialEq)]
pub struct FailoverWindow {
    pub from_us: u64,
    pub to_us: u64,
    /// The fault's kind (`cluster_failover`, `cluster_failover_force`, `master_kill`,
    /// `master_pause`).
    pub kind: String,
    /// The hash tags (`k0`, `L0`, `leader`, `%t:t0`, `%c`...) whose slots the failed master
    /// served when the fault began.
    pub tags: Vec<String>,
}

impl FailoverWindow {
    /// Whether this window failed over `tag`'s master and overlaps `from..=to`.
    pub fn covers(&self, tag: &str, from: u64, to: u64) -> bool {
        self.tags.iter().any(|t| t == tag) && self.from_us <= to && self.to_us >= from
    }
}

/// The hash tag of an epoch's key (`%c` for the clear key, `%t:<tag>` for a tag's), for
/// matching it against a [`FailoverWindow`]. The chaos tags need no escaping.
pub fn epoch_tag(epoch: &Epoch) -> String {
    match epoch {
        Epoch::Clear => "%c".to_string(),
        Epoch::Tag(tag) => format!("%t:{tag}"),
    }
}

/// One raise of an epoch, as the server ran it: the `SET` of the epoch key, inside the script
/// that raises it (after its `GET`), and the announcement that follows.
#[derive(Debug, Clone, PartialEq)]
pub struct Raise {
    pub epoch: Epoch,
    /// The epoch it was set to (µs, by the server's clock).
    pub value: u64,
    /// When the server ran the script (MONITOR timestamp).
    pub at_us: u64,
    /// Whether the script published `"0 <epoch key>"` on the near channel.
    pub announced: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BumpCause {
    Invalidate,
    Set,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub key: String,
    /// Written by a computation's store-and-unlock (true) or by `set` (false).
    pub computed: bool,
    /// The token the computation put into its value (0 for `set`).
    pub token: u64,
    /// The fence in the value's envelope.
    pub fence: u64,
    /// The fencing counter at the moment of the write, replayed from the server's commands.
    pub counter: Option<u64>,
    pub value: String,
    /// The birth in the value's envelope (the namespace's clock, µs), and its tags.
    pub born: u64,
    pub tags: Vec<String>,
    /// When the server ran the write (MONITOR timestamp).
    pub at_us: u64,
}

/// A pause of a worker by SIGSTOP, until SIGCONT.
#[derive(Debug, Clone, PartialEq)]
pub struct Pause {
    pub instance: String,
    pub from_us: u64,
    pub to_us: u64,
}

/// How a worker process ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    pub instance: String,
    /// SIGKILLed by the controller: its unfinished calls are excused.
    pub killed: bool,
    /// Exited by itself with success after the stop request.
    pub clean_exit: bool,
    /// `Cache::in_flight()` reported as its last act (`None` if it never reported).
    pub in_flight: Option<usize>,
}

#[derive(Debug, Clone, Default)]
pub struct History {
    pub calls: Vec<Call>,
    pub computes: Vec<Compute>,
    pub sections: Vec<Section>,
    pub server: Vec<ServerEvent>,
    /// When redis-server was killed for a restart (the locks it held are gone from then on).
    pub restarts_us: Vec<u64>,
    /// Lock keys the server evicted under memory pressure: when the notification was seen (µs)
    /// and the lock's name.
    pub lock_evictions: Vec<(u64, String)>,
    pub pauses: Vec<Pause>,
    pub endings: Vec<Ending>,
    /// Lock keys found right after the run, with their PTTL in ms.
    pub locks_after_run: Vec<(String, i64)>,
    /// Lock keys found one lease later.
    pub locks_after_lease: Vec<String>,
    pub lease_ms: u64,
    /// The longest a call may take, pauses not counted.
    pub call_bound_us: u64,
    /// The instances that ran a near tier, with its `max_staleness` in µs.
    pub near_instances: HashMap<String, u64>,
    /// The near-tier instances that serve while down, with their `serve_while_down` bound in µs.
    pub held_bounds: HashMap<String, u64>,
    /// Every change of a value key the server ran, in its order, with its time.
    pub changes: Vec<Change>,
    /// Value keys the server evicted under memory pressure: when the notification was seen (µs)
    /// and the entry's name.
    pub value_evictions: Vec<(u64, String)>,
    /// Epoch keys the server evicted (they have no expiry: only an `allkeys-*` policy takes
    /// them): when the notification was seen (µs) and the epoch. A lost epoch brings back the
    /// values it had invalidated (docs/tags.md), as a restart or a flush does.
    pub epoch_evictions: Vec<(u64, Epoch)>,
    /// On a cluster: the faults that could fail a master over, with the keys they touched.
    pub failovers: Vec<FailoverWindow>,
}

/// One change of an entry's value, as the server ran it: one script's `set`, `invalidate`,
/// computed write or fenced delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: String,
    /// The server's clock when it ran the script (the MONITOR timestamp, µs since the epoch:
    /// the same wall clock the workers read on this machine).
    pub at_us: u64,
    /// The value it wrote (`None`: it deleted the value).
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub rule: char,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}) {}", self.rule, self.detail)
    }
}

/// A value as the workers write it: `V|key|token|instance|seq|tags` (computed) or
/// `S|key|instance|seq|tags` (`set`), where `tags` are the tags the value was given (its
/// handle's and its computation's), sorted and joined by `+`, or `-` for none. Every value is
/// unique (`seq` is the call's id, or a batch key's), so a value served names its computation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueParts {
    pub computed: bool,
    pub key: String,
    pub token: u64,
    pub instance: String,
    /// The id of the call that made it (a `set`'s own; a computation's call, or batch key).
    pub seq: u64,
    pub tags: Vec<String>,
}

pub fn parse_value(value: &str) -> Option<ValueParts> {
    let f: Vec<&str> = value.split('|').collect();
    let (computed, key, token, instance, seq, tags) = match f.as_slice() {
        ["V", key, token, instance, seq, tags] => {
            (true, key, token.parse().ok()?, instance, seq, tags)
        }
        ["S", key, instance, seq, tags] => (false, key, 0, instance, seq, tags),
        _ => return None,
    };
    Some(ValueParts {
        computed,
        key: key.to_string(),
        token,
        instance: instance.to_string(),
        seq: seq.parse().ok()?,
        tags: tags_of_label(tags)?,
    })
}

/// The label of a value's tags (sorted, each once, joined by `+`; `-` for none).
pub fn tags_label<S: AsRef<str>>(tags: &[S]) -> String {
    let mut tags: Vec<&str> = tags.iter().map(AsRef::as_ref).collect();
    tags.sort_unstable();
    tags.dedup();
    if tags.is_empty() {
        "-".to_string()
    } else {
        tags.join("+")
    }
}

/// The tags of a label ([`tags_label`]); `None` for an empty label.
fn tags_of_label(label: &str) -> Option<Vec<String>> {
    match label {
        "" => None,
        "-" => Some(Vec::new()),
        tags => Some(tags.split('+').map(str::to_string).collect()),
    }
}
