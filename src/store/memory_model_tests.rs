//! The memory store against a reference model, under random sequences of operations and paused
//! tokio time; and the memory store against a real Redis, on the same sequences, so that the two
//! stores cannot drift apart (`the_memory_store_answers_like_redis`).
//!
//! The model is the Redis scripts' semantics written as plainly as possible: maps of expiring
//! entries, a fencing counter bumped by acquisitions, `set` and invalidations and kept at least
//! as long as what it guards, and the compare-and-set rules. Durations include [`FOREVER`]: no
//! expiry. Fencing tokens seeded from the clock are not predictable, so the model knows a counter
//! either exactly (after it saw a token) or only as "fresh": higher than every token handed out
//! so far, hence equal to none of them.
//!
//! Explained in the guide: `docs/testing-under-faults.md` (property tests).

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::store::op::{answer, FromReply};
use crate::store::Write;

const KEYS: [&str; 2] = ["a", "b"];
const TOKENS: [&str; 3] = ["A", "B", "C"];

/// A step the model knows: a pause, or an operation of the store (built by [`command`]).
#[derive(Debug, Clone)]
enum Action {
    Advance(u64),
    Get(usize),
    ReadOrLock {
        key: usize,
        token: usize,
        lease: u64,
        read_value: bool,
    },
    /// `own_fence`: the fence this token last acquired for this key; otherwise one never given.
    /// `value: None` is a fenced delete.
    StoreAndUnlock {
        key: usize,
        token: usize,
        own_fence: bool,
        value: Option<u8>,
        ttl: u64,
    },
    Extend {
        key: usize,
        token: usize,
        lease: u64,
    },
    Unlock {
        key: usize,
        token: usize,
    },
    Set {
        key: usize,
        value: u8,
        ttl: u64,
        lease: u64,
    },
    Invalidate {
        key: usize,
        lease: u64,
    },
}

/// Durations in the model are milliseconds; this one stands for [`FOREVER`] (no expiry).
const FOREVER_MS: u64 = u64::MAX;

fn duration(ms: u64) -> Duration {
    if ms == FOREVER_MS {
        FOREVER
    } else {
        Duration::from_millis(ms)
    }
}

/// When something kept `ms` from `now` expires; never (`u64::MAX`) for [`FOREVER_MS`].
fn until(now: u64, ms: u64) -> u64 {
    now.saturating_add(ms)
}

fn action() -> impl Strategy<Value = Action> {
    ops_with(
        (0u64..300).boxed(),
        prop_oneof![9 => 1u64..400, 1 => Just(FOREVER_MS)].boxed(),
    )
}

/// Operations whose pauses are `advance` and whose durations are `ms`.
fn ops_with(advance: BoxedStrategy<u64>, ms: BoxedStrategy<u64>) -> impl Strategy<Value = Action> {
    let key = 0..KEYS.len();
    let token = 0..TOKENS.len();
    let value = prop_oneof![9 => any::<u8>().prop_map(Some), 1 => Just(None)];
    prop_oneof![
        3 => advance.prop_map(Action::Advance),
        2 => key.clone().prop_map(Action::Get),
        4 => (key.clone(), token.clone(), ms.clone(), any::<bool>()).prop_map(
            |(key, token, lease, read_value)| Action::ReadOrLock { key, token, lease, read_value }
        ),
        3 => (key.clone(), token.clone(), prop::bool::weighted(0.8), value, ms.clone())
            .prop_map(|(key, token, own_fence, value, ttl)| Action::StoreAndUnlock {
                key, token, own_fence, value, ttl
            }),
        2 => (key.clone(), token.clone(), ms.clone())
            .prop_map(|(key, token, lease)| Action::Extend { key, token, lease }),
        2 => (key.clone(), token.clone()).prop_map(|(key, token)| Action::Unlock { key, token }),
        1 => (key.clone(), any::<u8>(), ms.clone(), ms.clone())
            .prop_map(|(key, value, ttl, lease)| Action::Set { key, value, ttl, lease }),
        1 => (key, ms).prop_map(|(key, lease)| Action::Invalidate { key, lease }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Counter {
    Known(u64),
    /// Re-seeded from the clock: above every token handed out so far.
    Fresh,
}

#[derive(Debug, Default)]
struct Entry {
    value: Option<(Vec<u8>, u64)>,
    lock: Option<(usize, u64)>,
    fence: Option<(Counter, u64)>,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    entries: HashMap<usize, Entry>,
    /// Per key, the highest token the store has handed out (tokens are ordered per key only).
    high_water: HashMap<usize, u64>,
    /// (key, token) → the fence that token last acquired.
    acquired: HashMap<(usize, usize), u64>,
}

fn live<T: Clone>(slot: &Option<(T, u64)>, now: u64) -> Option<T> {
    slot.as_ref()
        .filter(|(_, until)| *until > now)
        .map(|(t, _)| t.clone())
}

impl Model {
    /// Bumps the counter, keeping it two leases longer, never shorter than it was.
    fn bump(&mut self, key: usize, lease: u64) -> Counter {
        let now = self.now;
        let e = self.entries.entry(key).or_default();
        let retained = until(now, lease.saturating_mul(2));
        let (next, kept) = match e.fence.filter(|(_, u)| *u > now) {
            Some((Counter::Known(n), u)) => (Counter::Known(n + 1), u.max(retained)),
            Some((Counter::Fresh, u)) => (Counter::Fresh, u.max(retained)),
            None => (Counter::Fresh, retained),
        };
        e.fence = Some((next, kept));
        next
    }
}

impl Entry {
    /// Writes a value until `u`; the live counter is kept at least as long.
    fn put(&mut self, value: u8, u: u64, now: u64) {
        self.value = Some((vec![value], u));
        if let Some((_, fence_until)) = self.fence.as_mut().filter(|(_, f)| *f > now) {
            *fence_until = (*fence_until).max(u);
        }
    }
}

fn keys(i: usize) -> EntryKeys {
    EntryKeys::new("m", KEYS[i]).unwrap()
}

/// A store operation as the tests send it: to a store's lock side or to its value side.
#[derive(Debug, Clone)]
enum Command<'a> {
    Lock(LockOp<'a>),
    Run(Op<'a>),
}

/// The store operation of `action` over `keys`, a fenced write offering `fence`; none for a
/// pause. Every store under test is sent what this builds, through its seam.
fn command<'a>(action: &Action, keys: &'a [EntryKeys], fence: u64) -> Option<Command<'a>> {
    Some(match *action {
        Action::Advance(_) => return None,
        Action::Get(key) => Command::Run(Op::Get { keys: &keys[key] }),
        Action::ReadOrLock {
            key,
            token,
            lease,
            read_value,
        } => Command::Run(Op::ReadOrLock {
            keys: &keys[key],
            token: TOKENS[token],
            lease: duration(lease),
            read_value,
            trace: None,
        }),
        Action::StoreAndUnlock {
            key,
            token,
            value,
            ttl,
            ..
        } => Command::Run(Op::StoreAndUnlock {
            keys: &keys[key],
            token: TOKENS[token],
            fence,
            write: write(value, ttl),
        }),
        Action::Extend { key, token, lease } => Command::Lock(LockOp::Extend {
            keys: &keys[key],
            token: TOKENS[token],
            lease: duration(lease),
        }),
        Action::Unlock { key, token } => Command::Lock(LockOp::Unlock {
            keys: &keys[key],
            token: TOKENS[token],
        }),
        Action::Set {
            key,
            value,
            ttl,
            lease,
        } => Command::Run(Op::Set {
            keys: &keys[key],
            value: vec![value],
            ttl: duration(ttl),
            lease: duration(lease),
        }),
        Action::Invalidate { key, lease } => Command::Run(Op::Invalidate {
            keys: &keys[key],
            lease: duration(lease),
        }),
    })
}

/// Sends `command` through the store's seam; its reply (the tests' stores do not fail).
async fn send(store: &dyn Store, command: Command<'_>) -> Reply {
    match command {
        Command::Lock(op) => store.lock(op).await,
        Command::Run(op) => store.run(op).await,
    }
    .unwrap()
}

/// The answer a reply carries, of the type its operation names.
fn take<T: FromReply>(reply: Reply) -> T {
    answer("a test's operation", Ok(reply)).unwrap()
}

/// The fence a [`Action::StoreAndUnlock`] offers: the one its token last acquired for its key
/// (`acquired`), or one never handed out.
fn offered(action: &Action, acquired: &HashMap<(usize, usize), u64>) -> u64 {
    match *action {
        Action::StoreAndUnlock {
            key,
            token,
            own_fence: true,
            ..
        } => acquired.get(&(key, token)).copied().unwrap_or(7),
        // A token never handed out: the clock-seeded counter is far above it.
        _ => 7,
    }
}

fn write(value: Option<u8>, ttl: u64) -> Write {
    match value {
        Some(v) => Write::Value {
            bytes: vec![v],
            ttl: duration(ttl),
        },
        None => Write::Delete,
    }
}

async fn run(ops: Vec<Action>) -> Result<(), TestCaseError> {
    let store = MemoryStore::default();
    let keys: Vec<EntryKeys> = (0..KEYS.len()).map(keys).collect();
    let mut m = Model::default();
    for (step, op) in ops.into_iter().enumerate() {
        let now = m.now;
        let fence = offered(&op, &m.acquired);
        let Some(command) = command(&op, &keys, fence) else {
            if let Action::Advance(ms) = op {
                tokio::time::advance(Duration::from_millis(ms)).await;
                m.now += ms;
            }
            continue;
        };
        let reply = send(&store, command).await;
        match op {
            Action::Advance(_) => {}
            Action::Get(k) => {
                let got = take::<Option<Blob>>(reply).map(|b| b.to_vec());
                let want = live(&m.entries.entry(k).or_default().value, now);
                prop_assert_eq!(got, want, "step {}", step);
            }
            Action::ReadOrLock {
                key,
                token,
                lease,
                read_value,
            } => {
                let got: ReadOrLock = take(reply);
                let e = m.entries.entry(key).or_default();
                let value = live(&e.value, now).filter(|_| read_value);
                let holder = e.lock.filter(|(_, until)| *until > now);
                if let Some(v) = value {
                    prop_assert_eq!(got, ReadOrLock::Value(v), "step {}", step);
                } else if let Some((_, until)) = holder {
                    prop_assert_eq!(
                        got,
                        ReadOrLock::Held {
                            expires_in: (until != u64::MAX)
                                .then(|| Duration::from_millis(until - now))
                        },
                        "step {}",
                        step
                    );
                } else {
                    let ReadOrLock::Acquired { fence, .. } = got else {
                        return Err(TestCaseError::fail(format!(
                            "step {step}: a free lock was not granted: {got:?}"
                        )));
                    };
                    e.lock = Some((token, until(now, lease)));
                    match m.bump(key, lease) {
                        Counter::Known(n) => prop_assert_eq!(fence, n, "step {}", step),
                        Counter::Fresh => {
                            let high = m.high_water.get(&key).copied().unwrap_or(0);
                            prop_assert!(
                                fence > high,
                                "step {step}: re-seeded token {fence} not above {high}"
                            );
                        }
                    }
                    let e = m.entries.entry(key).or_default();
                    if let Some((counter, _)) = e.fence.as_mut() {
                        *counter = Counter::Known(fence);
                    }
                    let high = m.high_water.entry(key).or_default();
                    *high = (*high).max(fence);
                    m.acquired.insert((key, token), fence);
                }
            }
            Action::StoreAndUnlock {
                key,
                token,
                value,
                ttl,
                ..
            } => {
                let got: Stored = take(reply);
                let e = m.entries.entry(key).or_default();
                let written = live(&e.fence, now) == Some(Counter::Known(fence));
                if written {
                    match value {
                        Some(v) => e.put(v, until(now, ttl), now),
                        None => e.value = None,
                    }
                }
                let released = live(&e.lock, now) == Some(token);
                if released {
                    e.lock = None;
                }
                prop_assert_eq!(got, Stored { written, released }, "step {}", step);
            }
            Action::Extend { key, token, lease } => {
                let got: bool = take(reply);
                let e = m.entries.entry(key).or_default();
                let ours = live(&e.lock, now) == Some(token);
                if ours {
                    e.lock = Some((token, until(now, lease)));
                    if let Some((_, u)) = e.fence.as_mut().filter(|(_, u)| *u > now) {
                        *u = (*u).max(until(now, lease.saturating_mul(2)));
                    }
                }
                prop_assert_eq!(got, ours, "step {}", step);
            }
            Action::Unlock { key, token } => {
                let got: bool = take(reply);
                let e = m.entries.entry(key).or_default();
                let ours = live(&e.lock, now) == Some(token);
                if ours {
                    e.lock = None;
                }
                prop_assert_eq!(got, ours, "step {}", step);
            }
            Action::Set {
                key,
                value,
                ttl,
                lease,
            } => {
                take::<()>(reply);
                m.bump(key, lease);
                m.entries
                    .entry(key)
                    .or_default()
                    .put(value, until(now, ttl), now);
            }
            Action::Invalidate { key, lease } => {
                take::<()>(reply);
                m.bump(key, lease);
                m.entries.entry(key).or_default().value = None;
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_memory_store_behaves_like_the_model(ops in proptest::collection::vec(action(), 1..80)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(run(ops))?;
    }
}

// ---- The memory store against a real Redis ----
//
// The same operation sequences run on the memory store (paused time) and on a redis-server the
// test starts (real time), and their answers must agree. Durations come from three that cannot
// sit on an expiry boundary when both run: short (150 ms, which every pause outlasts, and which
// outlasts the operations between two pauses), long (10 minutes) and FOREVER; pauses are 600 ms,
// longer than a short lease's fence retention. Fencing tokens differ between the stores (each
// seeds from its own clock, and Redis hands out its clock whenever that is above counter + 1),
// so answers compare them as "higher than the previous" or "not higher".

#[allow(unreachable_pub, missing_debug_implementations)]
#[path = "../../tests/support/server.rs"]
mod support;

/// The step of a fenced write's or a raise's fence above the last token, in µs: 10^12 (11
/// days), far above any clock the Redis counter reaches in a run, and a few of them stay exact
/// in Lua's doubles (below 2^53).
const ABOVE: u64 = 1_000_000_000_000;
const SHORT_MS: u64 = 150;
const PAUSE_MS: u64 = 600;

/// A step of a compared sequence: an operation of the model, or one of those the model does not
/// cover (the fenced writes of a store whose tokens come from a Redlock quorum), whose fences are
/// chosen relative to the last token the store handed out for the key.
#[derive(Debug, Clone)]
enum Step {
    Op(Action),
    NextFence {
        key: usize,
        lease: u64,
    },
    RaiseFence {
        key: usize,
        rel: i64,
        lease: u64,
    },
    /// `raise_fence` to 0: keeps a live counter, creates none.
    KeepFence {
        key: usize,
        lease: u64,
    },
    WriteFenced {
        key: usize,
        rel: i64,
        value: Option<u8>,
        ttl: u64,
        lease: u64,
    },
    /// `write_fenced` of the fail-safe's throttled copy: new bytes, a life never shortened and
    /// at least `at_least`.
    KeepFenced {
        key: usize,
        rel: i64,
        value: u8,
        at_least: u64,
        lease: u64,
    },
    /// `born`: the namespace's clock now, as a computation starting now records it.
    Born,
    /// `invalidate_tag`: `born` as the floor, then `raise_epochs` of tag `tag` (`None`: clear).
    Raise {
        tag: Option<usize>,
    },
    /// Reads the epoch of `tag` (`None`: clear) and judges the last birth by it.
    Judge {
        tag: Option<usize>,
    },
    /// `peek`: the lock's holder, its lease left and the counter, read without a change.
    Peek {
        key: usize,
    },
}

fn comparable_ops() -> impl Strategy<Value = Vec<Step>> {
    let ms = || prop_oneof![2 => Just(SHORT_MS), 1 => Just(600_000u64), 1 => Just(FOREVER_MS)];
    let key = || 0..KEYS.len();
    let value = prop_oneof![9 => any::<u8>().prop_map(Some), 1 => Just(None)];
    let step = prop_oneof![
        12 => ops_with(Just(PAUSE_MS).boxed(), ms().boxed()).prop_map(Step::Op),
        1 => (key(), ms()).prop_map(|(key, lease)| Step::NextFence { key, lease }),
        1 => (key(), -2i64..4, ms()).prop_map(|(key, rel, lease)| Step::RaiseFence { key, rel, lease }),
        1 => (key(), ms()).prop_map(|(key, lease)| Step::KeepFence { key, lease }),
        3 => (key(), -2i64..3, value, ms(), ms()).prop_map(|(key, rel, value, ttl, lease)| {
            Step::WriteFenced { key, rel, value, ttl, lease }
        }),
        2 => (key(), -2i64..3, any::<u8>(), ms(), ms()).prop_map(|(key, rel, value, at_least, lease)| {
            Step::KeepFenced { key, rel, value, at_least, lease }
        }),
        1 => Just(Step::Born),
        1 => proptest::option::of(0..2usize).prop_map(|tag| Step::Raise { tag }),
        2 => proptest::option::of(0..2usize).prop_map(|tag| Step::Judge { tag }),
        2 => key().prop_map(|key| Step::Peek { key }),
    ];
    proptest::collection::vec(step, 24)
}

/// Sequences written for the rules a random draw rarely reaches: a counter kept by a raise, a
/// value written for ever, a lock extended for ever, a fenced delete.
fn directed() -> Vec<Vec<Step>> {
    use Action::*;
    let lock = |key, token, lease, read_value| {
        Step::Op(ReadOrLock {
            key,
            token,
            lease,
            read_value,
        })
    };
    let pause = || Step::Op(Advance(PAUSE_MS));
    let next_fence = |key, lease| Step::NextFence { key, lease };
    let keep_fence = |key, lease| Step::KeepFence { key, lease };
    let fenced = |key, rel, value, ttl, lease| Step::WriteFenced {
        key,
        rel,
        value,
        ttl,
        lease,
    };
    let long = 600_000;
    let keep = |value, at_least| Step::KeepFenced {
        key: 0,
        rel: 0,
        value,
        at_least,
        lease: SHORT_MS,
    };
    let peek = |key| Step::Peek { key };
    vec![
        // A peek: nothing, then a holder with its token and the counter, a lease that runs
        // out (the counter outlives it), a `set` that moves the counter, a lock for ever.
        vec![
            peek(0),
            lock(0, 0, long, false),
            peek(0),
            peek(1),
            lock(1, 1, SHORT_MS, false),
            pause(),
            peek(1),
            Step::Op(Set {
                key: 0,
                value: 1,
                ttl: long,
                lease: long,
            }),
            peek(0),
            lock(1, 2, FOREVER_MS, false),
            peek(1),
        ],
        // Epochs: a birth before a raise is judged gone by it, one after it outlives it; a raise
        // twice in a row rises still; an epoch never raised reads 0.
        vec![
            Step::Born,
            Step::Raise { tag: Some(0) },
            Step::Judge { tag: Some(0) },
            Step::Born,
            Step::Judge { tag: Some(0) },
            Step::Raise { tag: None },
            Step::Raise { tag: None },
            Step::Judge { tag: None },
            Step::Born,
            Step::Judge { tag: None },
            Step::Judge { tag: Some(1) },
        ],
        // A throttled copy: over a short-lived value it lives its throttle; over a long-lived
        // one, or one kept for ever, its life is not shortened; over nothing, it is written.
        vec![
            keep(1, long),
            next_fence(0, long),
            fenced(0, 0, Some(2), SHORT_MS, long),
            keep(3, long),
            pause(),
            Step::Op(Get(0)),
            fenced(0, 0, Some(4), long, long),
            keep(5, SHORT_MS),
            pause(),
            Step::Op(Get(0)),
            fenced(0, 0, Some(6), FOREVER_MS, long),
            keep(7, SHORT_MS),
            pause(),
            pause(),
            Step::Op(Get(0)),
        ],
        vec![
            keep_fence(1, long),
            next_fence(1, SHORT_MS),
            lock(0, 0, SHORT_MS, false),
            keep_fence(0, long),
            pause(),
            next_fence(0, SHORT_MS),
        ],
        vec![
            lock(0, 0, SHORT_MS, false),
            Step::RaiseFence {
                key: 0,
                rel: 2,
                lease: long,
            },
            pause(),
            next_fence(0, SHORT_MS),
        ],
        vec![
            Step::Op(Set {
                key: 0,
                value: 1,
                ttl: FOREVER_MS,
                lease: SHORT_MS,
            }),
            pause(),
            pause(),
            lock(0, 1, SHORT_MS, false),
            Step::Op(Get(0)),
        ],
        vec![
            lock(1, 0, SHORT_MS, false),
            Step::Op(StoreAndUnlock {
                key: 1,
                token: 0,
                own_fence: true,
                value: Some(3),
                ttl: long,
            }),
            pause(),
            lock(1, 1, SHORT_MS, false),
            Step::Op(StoreAndUnlock {
                key: 1,
                token: 1,
                own_fence: true,
                value: None,
                ttl: long,
            }),
            Step::Op(Get(1)),
        ],
        vec![
            next_fence(0, SHORT_MS),
            fenced(0, 1, Some(4), FOREVER_MS, SHORT_MS),
            pause(),
            next_fence(0, SHORT_MS),
            fenced(0, -1, None, SHORT_MS, SHORT_MS),
            Step::Op(Get(0)),
        ],
        vec![
            lock(0, 0, SHORT_MS, false),
            Step::Op(Extend {
                key: 0,
                token: 0,
                lease: FOREVER_MS,
            }),
            pause(),
            lock(0, 1, SHORT_MS, true),
            Step::Op(Extend {
                key: 0,
                token: 0,
                lease: SHORT_MS,
            }),
            pause(),
            lock(0, 1, SHORT_MS, true),
        ],
    ]
}

/// A token as it compares across stores: above the key's previous one or not. Not by how much,
/// nor whether it is low: Redis hands out its clock whenever that is above counter + 1, the
/// memory store counter + 1 (after a fenced write set a counter to a low fence: a low token).
fn relative(last_token: &mut HashMap<usize, u64>, key: usize, token: u64) -> String {
    match last_token.insert(key, token) {
        Some(last) if token > last => "higher than the previous".to_owned(),
        Some(_) => "not higher than the previous".to_owned(),
        None => "first".to_owned(),
    }
}

/// One answer per operation, with tokens relative to the previous one of the key. Every
/// operation is a [`Command`], sent through the store's seam.
async fn answers(store: &dyn Store, ns: &str, steps: &[Step], paused: bool) -> Vec<String> {
    let keys: Vec<EntryKeys> = KEYS
        .iter()
        .map(|k| EntryKeys::new(ns, k).unwrap())
        .collect();
    let mut last_token: HashMap<usize, u64> = HashMap::new();
    let mut acquired: HashMap<(usize, usize), u64> = HashMap::new();
    let mut out = Vec::new();
    // Epochs: the clock's name is the namespace's clear key, as the cache gives it.
    let epoch = |tag: Option<usize>| match tag {
        None => crate::wire::key::clear_key(ns),
        Some(tag) => crate::wire::key::tag_key(ns, KEYS[tag]).unwrap(),
    };
    let clock = crate::wire::key::clear_key(ns);
    let born_now = Command::Run(Op::Born { clock: &clock });
    let mut born = 0;
    for step in steps {
        // A fence above the last token is `rel` steps of `ABOVE` above it: the bumps since
        // (a `set`, an invalidation) move a Redis counter to its clock, a memory one by 1, and
        // a fence a few above the last token would be above one counter and below the other.
        let fence_at = |key: usize, rel: i64| {
            last_token
                .get(&key)
                .map_or(7, |l| match u64::try_from(rel) {
                    Ok(up) if up > 0 => l.saturating_add(up * ABOVE),
                    _ => l.saturating_add_signed(rel),
                })
        };
        let answer = match *step {
            Step::Op(ref action) => {
                let Some(command) = command(action, &keys, offered(action, &acquired)) else {
                    if let Action::Advance(ms) = *action {
                        pause(ms, paused).await;
                    }
                    out.push(String::new());
                    continue;
                };
                let reply = send(store, command).await;
                describe(action, reply, &mut acquired, &mut last_token)
            }
            Step::NextFence { key, lease } => {
                let next = LockOp::NextFence {
                    keys: &keys[key],
                    lease: duration(lease),
                };
                let token: u64 = take(send(store, Command::Lock(next)).await);
                format!("next fence, {}", relative(&mut last_token, key, token))
            }
            Step::RaiseFence { key, rel, lease } => {
                let raise = LockOp::RaiseFence {
                    keys: &keys[key],
                    floor: fence_at(key, rel),
                    lease: duration(lease),
                };
                take::<()>(send(store, Command::Lock(raise)).await);
                String::new()
            }
            Step::KeepFence { key, lease } => {
                let keep = LockOp::RaiseFence {
                    keys: &keys[key],
                    floor: 0,
                    lease: duration(lease),
                };
                take::<()>(send(store, Command::Lock(keep)).await);
                String::new()
            }
            Step::WriteFenced {
                key,
                rel,
                value,
                ttl,
                lease,
            } => {
                let fenced = Op::WriteFenced {
                    keys: &keys[key],
                    fence: fence_at(key, rel),
                    write: write(value, ttl),
                    lease: duration(lease),
                };
                let written: bool = take(send(store, Command::Run(fenced)).await);
                format!("written {written}")
            }
            Step::Born => {
                let now: u64 = take(send(store, born_now.clone()).await);
                let answer = format!("born after the last: {}", now > born);
                born = now;
                answer
            }
            Step::Raise { tag } => {
                let floor: u64 = take(send(store, born_now.clone()).await);
                let names = [epoch(tag)];
                let raise = Op::RaiseEpochs {
                    names: &names,
                    floor,
                };
                take::<()>(send(store, Command::Run(raise)).await);
                String::new()
            }
            Step::Judge { tag } => {
                let names = [epoch(tag)];
                let read = Op::Epochs { names: &names };
                let read = take::<Vec<u64>>(send(store, Command::Run(read)).await)[0];
                // Births are the clock's; what compares across stores is the order.
                format!(
                    "raised {}, the last birth outlived it {}",
                    read > 0,
                    born > read
                )
            }
            Step::KeepFenced {
                key,
                rel,
                value,
                at_least,
                lease,
            } => {
                let kept = Op::WriteFenced {
                    keys: &keys[key],
                    fence: fence_at(key, rel),
                    write: Write::Keep {
                        bytes: vec![value],
                        at_least: duration(at_least),
                    },
                    lease: duration(lease),
                };
                let written: bool = take(send(store, Command::Run(kept)).await);
                format!("kept {written}")
            }
            Step::Peek { key } => {
                let peek = LockOp::Peek { keys: &keys[key] };
                peeked(
                    take(send(store, Command::Lock(peek)).await),
                    last_token.get(&key),
                )
            }
        };
        out.push(answer);
    }
    out
}

/// A peek as it compares across stores: the holder, its lease as short, long or for ever, and
/// the counter as absent, the key's last token seen, or another (a `set` or an invalidation
/// moved it: to the clock on Redis, by one in memory).
fn peeked(peek: LockPeek, last: Option<&u64>) -> String {
    let lease = |left: Option<Duration>| match left {
        None => "for ever",
        Some(d) if d.as_secs() < 1 => "short",
        Some(_) => "long",
    };
    let holder = peek
        .holder
        .map(|(token, left)| format!("{token} {}", lease(left)));
    let fence = match peek.fence {
        None => "none",
        Some(fence) if Some(&fence) == last => "the last token",
        Some(_) => "another",
    };
    format!("peek: held by {holder:?}, fence {fence}")
}

/// A pause of `ms`: tokio's paused clock moved on, or real time slept.
async fn pause(ms: u64, paused: bool) {
    if paused {
        tokio::time::advance(Duration::from_millis(ms)).await;
    } else {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// The answer to `action`, as it compares across stores (tokens relative to the previous one
/// of the key, which it records, as it records the fences acquired).
fn describe(
    action: &Action,
    reply: Reply,
    acquired: &mut HashMap<(usize, usize), u64>,
    last_token: &mut HashMap<usize, u64>,
) -> String {
    match *action {
        Action::Advance(_) | Action::Set { .. } | Action::Invalidate { .. } => {
            take::<()>(reply);
            String::new()
        }
        Action::Get(_) => format!("{:?}", take::<Option<Blob>>(reply).as_deref()),
        Action::ReadOrLock { key, token, .. } => match take(reply) {
            ReadOrLock::Value(v) => format!("value {v:?}"),
            ReadOrLock::Held { expires_in: None } => "held for ever".into(),
            ReadOrLock::Held {
                expires_in: Some(d),
            } => format!("held {}", if d.as_secs() < 1 { "short" } else { "long" }),
            ReadOrLock::Acquired { fence, born } => {
                acquired.insert((key, token), fence);
                // Both stores read the birth with the grant (the clock differs: µs, a counter).
                let fence = relative(last_token, key, fence);
                format!("acquired, {fence}, born with it: {}", born.is_some())
            }
        },
        Action::StoreAndUnlock { .. } => format!("{:?}", take::<Stored>(reply)),
        Action::Extend { .. } => format!("extended {}", take::<bool>(reply)),
        Action::Unlock { .. } => format!("unlocked {}", take::<bool>(reply)),
    }
}

/// Fixed sequences (written out, and from a seeded generator), all run on one server at once, each in its own
/// namespace, so the pauses overlap and the test takes a few seconds.
#[test]
fn the_memory_store_answers_like_redis() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]),
    );
    let mut sequences = directed();
    sequences.extend((0..32).map(|_| comparable_ops().new_tree(&mut runner).unwrap().current()));

    // Each sequence in the namespace it has on Redis: its operations are the same values.
    let memory: Vec<Vec<String>> = sequences
        .iter()
        .enumerate()
        .map(|(i, ops)| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(answers(
                &MemoryStore::default(),
                &format!("r{i}"),
                ops,
                true,
            ))
        })
        .collect();

    let server = support::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis: Vec<Vec<String>> = runtime.block_on(async {
        let client = ::redis::Client::open(server.url()).unwrap();
        let store = Arc::new(
            super::super::redis::RedisStore::connect(client, &crate::ConnectionOptions::default())
                .unwrap(),
        );
        let runs = sequences.iter().enumerate().map(|(i, ops)| {
            let store = Arc::clone(&store);
            let ops = ops.clone();
            tokio::spawn(
                async move { answers(store.as_ref(), &format!("r{i}"), &ops, false).await },
            )
        });
        let mut all = Vec::new();
        for run in runs.collect::<Vec<_>>() {
            all.push(run.await.unwrap());
        }
        all
    });

    for (i, ops) in sequences.iter().enumerate() {
        for (step, op) in ops.iter().enumerate() {
            assert_eq!(
                memory[i][step],
                redis[i][step],
                "sequence {i}, step {step}: {op:?}\nmemory: {:?}\nredis:  {:?}\nops: {ops:?}",
                &memory[i][..=step],
                &redis[i][..=step]
            );
        }
    }
}
