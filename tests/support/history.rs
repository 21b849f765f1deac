//! The history of a chaos run and the checker that judges it.
//!
//! Where each part comes from, and why the faults cannot corrupt it:
//! - worker events (calls, computations, critical sections) are appended by each worker process to
//!   its own file, one line per event, written with one `write` each before the worker goes on:
//!   a SIGKILL loses at most the event it was about to write, never an earlier one;
//! - what the cache server *accepted* is read from the server itself: `redis-cli monitor` on the
//!   server's own port (not through the faulty proxy) prints every command a script runs, in the
//!   order the server ran them; [`replay_monitor`] turns that into acquisitions, fence bumps and
//!   value writes, replaying the fencing counter from its seed;
//! - what the lock holders' writes achieved is decided by a fenced sink on a second redis-server
//!   that no fault touches, which refuses a token lower than the highest it has seen;
//! - the controller's own record: restarts, pauses, kills, the lock keys left after the run, and
//!   the lock keys the server evicted under memory pressure (keyspace notifications on
//!   `__keyevent@0__:evicted`, read on the server's own port).
//!
//! The rules (`check`):
//! - (a) no two accepted critical sections of one key overlap in time (a computation counts as
//!   accepted when the server took its value; a lock or leader section counts as soon as its
//!   holder found its lease valid and wrote to the sink, accepted or not, server restarts and
//!   evictions of the lock key excepted);
//! - (b) accepted writes carry strictly increasing fencing tokens per key, acquisitions hand out
//!   strictly increasing tokens, and a later acquisition never gets a lower token;
//! - (c) no write is accepted after an invalidation that followed its lock acquisition;
//! - (d) every call ended, within its bound (time paused by SIGSTOP not counted), with a value of
//!   its own key that the server accepted or its own process computed, or with a typed error of
//!   an expected kind;
//! - (e) nothing is stranded: no lock key without expiry or beyond its lease after the run, none at
//!   all one lease later, and no in-process entry (`Cache::in_flight`) left in any worker;
//! - (f) the near tier's staleness bound: a value returned to a worker running a near tier is
//!   never older than a change of its key (a `set`, an `invalidate`, an accepted computed
//!   write) that the server ran more than that worker's `max_staleness` before the call began.
//!   Every value such a worker gets counts as possibly served from its near tier (the public
//!   API does not say which call a near hit answered; a value read from Redis is never older
//!   than what the server ran before the call, so it always passes). Every instance announces
//!   its changes, with a near tier or without, so every change counts, whoever asked for it.
//!   Excused: a computed write into a key that Redis emptied by evicting the value (a fill of an
//!   empty key is not announced); a `set` and an invalidation, always announced, count even
//!   then. An eviction counts from the value's write to two leases after the call began (its
//!   notification is read late, as in rule (a)).

use std::collections::{BTreeMap, HashMap, HashSet};

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
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pending,
    /// `get_or_compute` returned this value.
    Value(String),
    /// `invalidate` / `set` succeeded.
    Done,
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
    /// Every change of a value key the server ran, in its order, with its time.
    pub changes: Vec<Change>,
    /// Value keys the server evicted under memory pressure: when the notification was seen (µs)
    /// and the entry's name.
    pub value_evictions: Vec<(u64, String)>,
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

/// A value as the workers write it: `V|key|token|instance|seq` (computed) or `S|key|instance|seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueParts {
    pub computed: bool,
    pub key: String,
    pub token: u64,
    pub instance: String,
}

pub fn parse_value(value: &str) -> Option<ValueParts> {
    let f: Vec<&str> = value.split('|').collect();
    match f.as_slice() {
        ["V", key, token, instance, _seq] => Some(ValueParts {
            computed: true,
            key: key.to_string(),
            token: token.parse().ok()?,
            instance: instance.to_string(),
        }),
        ["S", key, instance, _seq] => Some(ValueParts {
            computed: false,
            key: key.to_string(),
            token: 0,
            instance: instance.to_string(),
        }),
        _ => None,
    }
}

/// The error kinds a call may end with under faults; anything else is a bug.
const EXPECTED_ERRORS: &[&str] = &["Backend", "WaitTimeout", "Compute", "NotHeld"];

/// Whether a call of `op` may end with the error `kind`: a batch also with `MissingFromBatch`
/// (its computation left the key out, as the workers do on purpose), and only a batch: a
/// single-key caller that followed such a key computes it itself.
fn expected_error(op: &str, kind: &str) -> bool {
    EXPECTED_ERRORS.contains(&kind) || (op == "batch" && kind == "MissingFromBatch")
}

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut violation = |rule: char, detail: String| out.push(Violation { rule, detail });

    // Ground truth of accepted writes.
    let accepted_values: HashSet<&str> = h
        .server
        .iter()
        .filter_map(|e| match e {
            ServerEvent::Write(w) => Some(w.value.as_str()),
            _ => None,
        })
        .collect();

    // (a) accepted computations of one key never overlap.
    let mut by_key: BTreeMap<&str, Vec<(u64, u64, String)>> = BTreeMap::new();
    for c in &h.computes {
        if accepted_values.contains(c.value.as_str()) {
            by_key.entry(&c.key).or_default().push((
                c.start_us,
                c.end_us,
                format!(
                    "computation {} token {} by {}",
                    c.value, c.token, c.instance
                ),
            ));
        }
    }
    for (key, spans) in &mut by_key {
        for (a, b) in overlaps(spans, |_, _| false) {
            violation(
                'a',
                format!("key {key}: accepted critical sections overlap: {a} and {b}"),
            );
        }
    }
    // (a) lock sections of one lock never overlap, unless the lock was lost on the server in
    // between: by a restart (which loses every lock) or by an eviction of the lock key under
    // memory pressure (the documented limits of a lock on a server without persistence, or
    // whose policy can evict it). The earlier-granted holder of the two then learns of the loss
    // at its next renewal. Which of the two was granted first is not always the one whose
    // section started first (a leader's first run may come well after its grant), so the loss
    // counts from the earlier of the two requests to the later section's start. An eviction is
    // seen through a notification on another connection, read by a thread of a busy controller,
    // which may come after the later grant reached its holder: it counts up to two leases later.
    // Stricter than "accepted sections": every section in which the holder checked its lease,
    // found it valid and wrote counts, accepted by the sink or not, because the lease promises
    // that the holder's own view never outlasts the lock in the backend; the sink's verdict
    // only says whether fencing also caught a late write.
    let mut by_lock: BTreeMap<&str, Vec<(u64, u64, String)>> = BTreeMap::new();
    let mut asked: HashMap<String, u64> = HashMap::new();
    for s in &h.sections {
        if s.writes > 0 {
            let label = format!("section {}#{} token {}", s.instance, s.id, s.token);
            asked.insert(label.clone(), s.asked_us);
            by_lock
                .entry(&s.lock)
                .or_default()
                .push((s.start_us, s.end_us, label));
        }
    }
    let notification_slack_us = 2 * h.lease_ms * 1000;
    for (lock, spans) in &mut by_lock {
        let lock_lost = |a: &(u64, u64, String), b: &(u64, u64, String)| {
            let asked_a = asked.get(&a.2).copied().unwrap_or(a.0);
            let asked_b = asked.get(&b.2).copied().unwrap_or(b.0);
            let from = asked_a.min(asked_b);
            h.restarts_us.iter().any(|k| *k >= from && *k <= b.0)
                || h.lock_evictions.iter().any(|(seen, name)| {
                    name == lock && *seen >= from && *seen <= b.0 + notification_slack_us
                })
        };
        for (a, b) in overlaps(spans, lock_lost) {
            violation(
                'a',
                format!("lock {lock}: critical sections overlap: {a} and {b}"),
            );
        }
    }

    // (b) and (c), from the server's own order.
    let mut last_write: HashMap<&str, u64> = HashMap::new();
    let mut last_acquire: HashMap<&str, u64> = HashMap::new();
    // The last thing that bumped each key's counter in the current server life.
    let mut last_bump: HashMap<&str, (Option<u64>, &'static str)> = HashMap::new();
    for e in &h.server {
        match e {
            ServerEvent::Life(_) => last_bump.clear(),
            ServerEvent::Acquire { key, token } => {
                if let Some(prev) = last_acquire.get(key.as_str()) {
                    if token <= prev {
                        violation(
                            'b',
                            format!("key {key}: acquisition got token {token} after {prev}"),
                        );
                    }
                }
                last_acquire.insert(key, *token);
                last_bump.insert(key, (Some(*token), "acquisition"));
            }
            ServerEvent::Bump { key, cause } => {
                let what = match cause {
                    BumpCause::Invalidate => "invalidation",
                    BumpCause::Set => "set",
                };
                last_bump.insert(key, (None, what));
            }
            ServerEvent::Write(w) if w.computed => {
                if w.token != w.fence {
                    violation(
                        'b',
                        format!(
                            "key {}: value {} computed under token {} stored with fence {}",
                            w.key, w.value, w.token, w.fence
                        ),
                    );
                }
                if let Some(prev) = last_write.get(w.key.as_str()) {
                    if w.token <= *prev {
                        violation(
                            'b',
                            format!(
                                "key {}: write with token {} accepted after one with {}",
                                w.key, w.token, prev
                            ),
                        );
                    }
                }
                last_write.insert(&w.key, w.token);
                match last_bump.get(w.key.as_str()) {
                    Some((Some(t), _)) if *t == w.token => {}
                    Some((_, "invalidation")) => violation(
                        'c',
                        format!(
                            "key {}: write with token {} accepted after an invalidation that followed its acquisition",
                            w.key, w.token
                        ),
                    ),
                    Some((other, what)) => violation(
                        'b',
                        format!(
                            "key {}: write with token {} accepted after a newer {what} ({other:?})",
                            w.key, w.token
                        ),
                    ),
                    None => violation(
                        'b',
                        format!(
                            "key {}: write with token {} accepted by a server that never granted it",
                            w.key, w.token
                        ),
                    ),
                }
            }
            ServerEvent::Write(_) => {}
            ServerEvent::Delete { key } => match last_bump.get(key.as_str()) {
                Some((Some(_), "acquisition")) => {}
                other => violation(
                    'c',
                    format!("key {key}: a fenced delete accepted after a newer bump ({other:?})"),
                ),
            },
        }
    }
    // (b) a lock acquisition that began after another was granted gets a higher token.
    let mut by_lock: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for s in &h.sections {
        by_lock.entry(&s.lock).or_default().push(s);
    }
    for (lock, mut sections) in by_lock {
        sections.sort_by_key(|s| s.start_us);
        // The highest token granted so far, in grant order; each section is compared with every
        // earlier-granted one that was granted before it was even asked for.
        let mut granted: Vec<(u64, u64)> = Vec::new(); // (start_us, token), sorted by start
        for s in sections {
            let earlier_max = granted
                .iter()
                .filter(|(start, _)| *start < s.asked_us)
                .map(|(_, t)| *t)
                .max();
            if let Some(max) = earlier_max {
                if s.token <= max {
                    violation(
                        'b',
                        format!(
                            "lock {lock}: {}#{} asked after token {max} was granted but got {}",
                            s.instance, s.id, s.token
                        ),
                    );
                }
            }
            granted.push((s.start_us, s.token));
        }
    }

    // (d) every call ended in time with a correct value or an expected typed error.
    let killed: HashSet<&str> = h
        .endings
        .iter()
        .filter(|e| e.killed)
        .map(|e| e.instance.as_str())
        .collect();
    // A caller may get a value its own process computed even if the write was refused (a lost
    // lease, an invalidation): the computing caller and its in-process followers share it.
    let computed_here: HashSet<(&str, &str)> = h
        .computes
        .iter()
        .map(|c| (c.instance.as_str(), c.value.as_str()))
        .collect();
    for c in &h.calls {
        let Some(end) = c.end_us else {
            if !killed.contains(c.instance.as_str()) {
                violation(
                    'd',
                    format!(
                        "{} call #{} {} {} never ended",
                        c.instance, c.id, c.op, c.key
                    ),
                );
            }
            continue;
        };
        let paused: u64 = h
            .pauses
            .iter()
            .filter(|p| p.instance == c.instance)
            .map(|p| p.to_us.min(end).saturating_sub(p.from_us.max(c.start_us)))
            .sum();
        let took = end.saturating_sub(c.start_us).saturating_sub(paused);
        if took > h.call_bound_us {
            violation(
                'd',
                format!(
                    "{} call #{} {} {} took {} ms (pauses excluded), over the bound of {} ms",
                    c.instance,
                    c.id,
                    c.op,
                    c.key,
                    took / 1000,
                    h.call_bound_us / 1000
                ),
            );
        }
        match &c.outcome {
            Outcome::Value(v) => match parse_value(v) {
                Some(parts) if parts.key != c.key => violation(
                    'd',
                    format!(
                        "{} call #{} for {} returned another key's value {v}",
                        c.instance, c.id, c.key
                    ),
                ),
                Some(_)
                    if !accepted_values.contains(v.as_str())
                        && !computed_here.contains(&(c.instance.as_str(), v.as_str())) =>
                {
                    violation(
                        'd',
                        format!(
                            "{} call #{} for {} returned {v}, which the server never accepted and its process never computed",
                            c.instance, c.id, c.key
                        ),
                    )
                }
                Some(_) => {}
                None => violation(
                    'd',
                    format!("{} call #{} returned garbage {v:?}", c.instance, c.id),
                ),
            },
            Outcome::Error(kind) if !expected_error(&c.op, kind) => violation(
                'd',
                format!(
                    "{} call #{} {} {} failed with unexpected {kind}",
                    c.instance, c.id, c.op, c.key
                ),
            ),
            Outcome::Pending => violation(
                'd',
                format!("{} call #{} ended without an outcome", c.instance, c.id),
            ),
            _ => {}
        }
    }

    // (e) nothing stranded.
    for e in &h.endings {
        if e.killed {
            continue;
        }
        if !e.clean_exit {
            violation('e', format!("{} did not shut down cleanly", e.instance));
        }
        match e.in_flight {
            Some(0) => {}
            Some(n) => violation(
                'e',
                format!("{} ended with {n} in-process entries left", e.instance),
            ),
            None => violation(
                'e',
                format!("{} never reported its in-process entries", e.instance),
            ),
        }
    }
    let lease_ms = i64::try_from(h.lease_ms).unwrap_or(i64::MAX);
    for (key, pttl) in &h.locks_after_run {
        if *pttl < 0 || *pttl > lease_ms {
            violation(
                'e',
                format!("lock key {key} has PTTL {pttl} ms after the run, lease {lease_ms} ms"),
            );
        }
    }
    for key in &h.locks_after_lease {
        violation(
            'e',
            format!("lock key {key} outlived its lease after the run"),
        );
    }

    // (f) the near tier's staleness bound.
    for stale in stale_near_reads(h) {
        violation('f', stale);
    }
    out
}

/// Rule (f): each value returned to a near-tier worker, against the changes of its key that the
/// server ran after writing it; one finding per call at most.
fn stale_near_reads(h: &History) -> Vec<String> {
    // Each key's changes in server order, and where each written value sits among them.
    let mut by_key: HashMap<&str, Vec<&Change>> = HashMap::new();
    let mut written: HashMap<&str, (&str, usize)> = HashMap::new();
    for c in &h.changes {
        let list = by_key.entry(&c.key).or_default();
        if let Some(v) = &c.value {
            written.insert(v, (&c.key, list.len()));
        }
        list.push(c);
    }
    let notification_slack_us = 2 * h.lease_ms * 1000;
    let mut found = Vec::new();
    for call in &h.calls {
        let Some(&bound) = h.near_instances.get(&call.instance) else {
            continue;
        };
        let Outcome::Value(v) = &call.outcome else {
            continue;
        };
        // A value the server never took came from the caller's own computation, not a copy.
        let Some(&(key, at)) = written.get(v.as_str()) else {
            continue;
        };
        let since = by_key[key][at].at_us;
        // Seen through a notification on another connection, read by a busy controller: it
        // may come late, as for rule (a).
        let evicted = h.value_evictions.iter().any(|(seen, name)| {
            name == key && *seen >= since && *seen <= call.start_us + notification_slack_us
        });
        // A computed write into an empty key is not announced: no copy can exist of a value
        // that is not there, unless Redis emptied the key by evicting it, which nobody
        // announces. So once an eviction came after the value, computed writes are excused:
        // not only the first, since the key may be evicted and filled again and again under
        // memory pressure (a 10,000-round run showed two unannounced fills in 41 ms). Only the
        // changes that are always announced still count then: a `set` and an invalidation.
        let mut newer = None;
        for c in &by_key[key][at + 1..] {
            let computed = c
                .value
                .as_deref()
                .and_then(parse_value)
                .is_some_and(|p| p.computed);
            if evicted && computed {
                continue;
            }
            if c.at_us.saturating_add(bound) < call.start_us {
                newer = Some(c);
                break;
            }
        }
        if let Some(newer) = newer {
            found.push(format!(
                "{} call #{} for {} began at {} and returned {v}, older than {} the server ran \
                 at {} ({} ms before the call; max_staleness {} ms)",
                call.instance,
                call.id,
                call.key,
                call.start_us,
                match &newer.value {
                    Some(w) => format!("the write of {w}"),
                    None => "a delete".to_string(),
                },
                newer.at_us,
                (call.start_us - newer.at_us) / 1000,
                bound / 1000
            ));
        }
    }
    found
}

/// Pairs of spans `(start, end, label)` that overlap, unless `excused(earlier, later)`.
fn overlaps(
    spans: &mut [(u64, u64, String)],
    excused: impl Fn(&(u64, u64, String), &(u64, u64, String)) -> bool,
) -> Vec<(String, String)> {
    spans.sort_by_key(|s| s.0);
    let mut found = Vec::new();
    for i in 0..spans.len() {
        for j in (0..i).rev() {
            let (a, b) = (&spans[j], &spans[i]);
            if a.1 > b.0 && !excused(a, b) {
                found.push((a.2.clone(), b.2.clone()));
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Reading the cache server's MONITOR output back into `ServerEvent`s.

/// Splits one MONITOR line (`1700000000.123456 [0 lua] "SET" "k" "v\x01"`) into its source and
/// its arguments (unescaped bytes).
pub fn parse_monitor_line(line: &str) -> Option<(bool, Vec<Vec<u8>>)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let lua = line[open..close].ends_with(" lua");
    let mut args = Vec::new();
    let bytes = &line.as_bytes()[close + 1..];
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        i += 1;
        let mut arg = Vec::new();
        while i < bytes.len() && bytes[i] != b'"' {
            if bytes[i] == b'\\' && i + 1 < bytes.len() {
                let e = bytes[i + 1];
                i += 2;
                match e {
                    b'n' => arg.push(b'\n'),
                    b'r' => arg.push(b'\r'),
                    b't' => arg.push(b'\t'),
                    b'a' => arg.push(7),
                    b'b' => arg.push(8),
                    b'x' if i + 1 < bytes.len() => {
                        let hex = std::str::from_utf8(&bytes[i..i + 2]).ok()?;
                        arg.push(u8::from_str_radix(hex, 16).ok()?);
                        i += 2;
                    }
                    other => arg.push(other),
                }
            } else {
                arg.push(bytes[i]);
                i += 1;
            }
        }
        i += 1;
        args.push(arg);
    }
    Some((lua, args))
}

/// Which entry a Redis key belongs to, and which of its keys it is.
#[derive(Debug, PartialEq)]
enum Part {
    Value,
    Lock,
    Fence,
}

fn entry_of(namespace: &str, key: &[u8]) -> Option<(String, Part)> {
    let key = std::str::from_utf8(key).ok()?;
    let rest = key.strip_prefix(namespace)?.strip_prefix(":{")?;
    let close = rest.find('}')?;
    let (entry, suffix) = (&rest[..close], &rest[close + 1..]);
    let part = match suffix {
        "" => Part::Value,
        "_lock" => Part::Lock,
        "_fence" => Part::Fence,
        _ => return None,
    };
    Some((entry.to_string(), part))
}

/// The entry's name if `key` is the value key of an entry in `namespace` (`ns:{name}`).
pub fn value_name(namespace: &str, key: &str) -> Option<String> {
    match entry_of(namespace, key.as_bytes())? {
        (name, Part::Value) => Some(name),
        _ => None,
    }
}

/// The lock's name if `key` is the lock key of an entry in `namespace` (`ns:{name}_lock`).
pub fn lock_name(namespace: &str, key: &str) -> Option<String> {
    match entry_of(namespace, key.as_bytes())? {
        (name, Part::Lock) => Some(name),
        _ => None,
    }
}

/// The envelope's fence and the payload string (a bincode `String`) of stored value bytes.
fn decode_value(bytes: &[u8]) -> Option<(u64, String)> {
    // Format 2: magic, version, codec, flags, fresh until, compute ms, fence, shape.
    const HEADER: usize = 33;
    let fence = u64::from_be_bytes(bytes.get(17..25)?.try_into().ok()?);
    let payload = bytes.get(HEADER..)?;
    let (len, skip) = match *payload.first()? {
        n @ 0..=250 => (n as usize, 1),
        251 => (
            u16::from_le_bytes(payload.get(1..3)?.try_into().ok()?) as usize,
            3,
        ),
        _ => return None,
    };
    let text = std::str::from_utf8(payload.get(skip..skip + len)?).ok()?;
    Some((fence, text.to_string()))
}

/// Replays one server life's MONITOR lines: the fencing counters from their seeds, and every
/// acquisition, bump and write that the scripts performed. Script commands (`[0 lua]`) of one
/// script are contiguous and follow the client's EVALSHA line, so client lines separate scripts.
pub fn replay_monitor(namespace: &str, life: u32, lines: &[String]) -> Vec<ServerEvent> {
    replay(namespace, life, lines).0
}

/// [`replay_monitor`], and the changes of values with their times for rule (f). The log marks
/// each client line with a `C`.
pub fn replay(namespace: &str, life: u32, lines: &[String]) -> (Vec<ServerEvent>, Vec<Change>) {
    let mut events = vec![ServerEvent::Life(life)];
    let mut changes = Vec::new();
    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut script: Vec<Vec<Vec<u8>>> = Vec::new();
    // When the current script ran.
    let mut script_at = 0u64;
    let mut flush = |script: &mut Vec<Vec<Vec<u8>>>,
                     at_us: u64,
                     events: &mut Vec<ServerEvent>,
                     changes: &mut Vec<Change>| {
        // A batch's script (a read-or-lock or an invalidation of many keys) works on several
        // entries, each as a single key's script would: each entry's commands are replayed as
        // a script of their own, in the order the entries first appear.
        let mut entries: Vec<(String, Vec<Vec<Vec<u8>>>)> = Vec::new();
        for args in script.drain(..) {
            let Some((entry, _)) = args.get(1).and_then(|key| entry_of(namespace, key)) else {
                continue;
            };
            match entries.iter_mut().find(|(e, _)| *e == entry) {
                Some((_, commands)) => commands.push(args),
                None => entries.push((entry, vec![args])),
            }
        }
        for (_, commands) in entries {
            replay_script(namespace, &mut counters, commands, at_us, events, changes);
        }
    };
    for line in lines {
        // Anything but a script command (a client's command, or the `C` that stands for one)
        // ends the script before it.
        match parse_monitor_line(line) {
            Some((true, args)) => {
                if script.is_empty() {
                    script_at = monitor_time_us(line).unwrap_or(0);
                }
                script.push(args);
            }
            _ => flush(&mut script, script_at, &mut events, &mut changes),
        }
    }
    flush(&mut script, script_at, &mut events, &mut changes);
    (events, changes)
}

/// Replays the commands one script ran on one entry: an acquisition, a bump (invalidation or
/// `set`), a fenced delete, a write, and the change of value it made.
fn replay_script(
    namespace: &str,
    counters: &mut HashMap<String, u64>,
    script: Vec<Vec<Vec<u8>>>,
    at_us: u64,
    events: &mut Vec<ServerEvent>,
    changes: &mut Vec<Change>,
) {
    let mut bumped: Option<(String, u64)> = None;
    let mut locked = false;
    let mut deleted: Option<String> = None;
    let mut written: Option<(String, Vec<u8>)> = None;
    for args in script {
        let [cmd, key, rest @ ..] = args.as_slice() else {
            continue;
        };
        let Some((entry, part)) = entry_of(namespace, key) else {
            continue;
        };
        match (cmd.to_ascii_uppercase().as_slice(), part) {
            (b"SET", Part::Fence) => {
                // A counter that INCR just created (1) is seeded from the clock right after,
                // in the same script: the seed is the number that bump handed out.
                let seed = rest
                    .first()
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse().ok())
                    .expect("a numeric fence seed");
                if bumped.as_ref().is_some_and(|(k, _)| *k == entry) {
                    bumped = Some((entry.clone(), seed));
                }
                counters.insert(entry, seed);
            }
            (b"INCR", Part::Fence) => {
                // A counter the replay has not seen (or that lapsed) starts at 1, as in Redis.
                let n = counters.entry(entry.clone()).or_insert(0);
                *n += 1;
                bumped = Some((entry, *n));
            }
            (b"SET", Part::Lock) => locked = true,
            (b"DEL", Part::Value) => deleted = Some(entry),
            (b"SET", Part::Value) => {
                written = Some((entry, rest.first().cloned().unwrap_or_default()))
            }
            _ => {}
        }
    }
    let changed = match (&bumped, &deleted, &written) {
        (_, _, Some((key, _))) => Some(key.clone()),
        (Some((key, _)), _, _) if !locked => Some(key.clone()),
        (None, Some(key), None) => Some(key.clone()),
        _ => None,
    };
    if let Some((key, n)) = bumped {
        if locked {
            events.push(ServerEvent::Acquire { key, token: n });
        } else if deleted.is_some() {
            events.push(ServerEvent::Bump {
                key,
                cause: BumpCause::Invalidate,
            });
        } else {
            events.push(ServerEvent::Bump {
                key,
                cause: BumpCause::Set,
            });
        }
    } else if let Some(key) = deleted {
        // A delete without a bump: the fenced delete of a failed refresh.
        events.push(ServerEvent::Delete { key });
    }
    if let Some((key, bytes)) = written {
        let (fence, value) = decode_value(&bytes).unwrap_or((0, String::new()));
        changes.push(Change {
            key: key.clone(),
            at_us,
            value: Some(value.clone()),
        });
        let parts = parse_value(&value);
        events.push(ServerEvent::Write(Write {
            counter: counters.get(&key).copied(),
            // Judged by what was written, not by the script's shape, so that a script that
            // skipped its fence check is still held to the rules of a computed write.
            computed: parts.as_ref().is_none_or(|p| p.computed),
            token: parts.map(|p| p.token).unwrap_or(0),
            key,
            fence,
            value,
        }));
    } else if let Some(key) = changed {
        changes.push(Change {
            key,
            at_us,
            value: None,
        });
    }
}

/// The timestamp that starts a MONITOR line (`1700000000.123456 ...`), in µs.
fn monitor_time_us(line: &str) -> Option<u64> {
    let (secs, micros) = line.split(' ').next()?.split_once('.')?;
    let micros = format!("{micros:0<6}");
    Some(secs.parse::<u64>().ok()? * 1_000_000 + micros.get(..6)?.parse::<u64>().ok()?)
}
