//! A schedule's plan, drawn from its seed: which instance calls what when, and which faults
//! strike when. A plan is data, so a failing one can be shrunk step by step and printed.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// The instances (caches, each with its own in-process flights and locks) of a schedule.
pub const INSTANCES: usize = 3;
const KEYS: u64 = 3;
const TAGS: &[&str] = &["t0", "t1", "t2"];
const LOCKS: &[&str] = &["L0", "L1"];

/// One call of the cache API.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Fetch {
        key: String,
        compute_ms: u64,
        fail: bool,
        ttl_ms: u64,
        handle_tags: Vec<String>,
        computed_tags: Vec<String>,
    },
    Batch {
        keys: Vec<String>,
        compute_ms: u64,
        leave_out: bool,
        ttl_ms: u64,
        handle_tags: Vec<String>,
    },
    Set {
        key: String,
        handle_tags: Vec<String>,
    },
    Invalidate {
        key: String,
    },
    InvalidateTag {
        tag: String,
    },
    Clear,
    /// A critical section under a `Lock`: a write to the fenced sink per hold, each after a
    /// check that the lease is still valid.
    Lock {
        name: String,
        holds_ms: Vec<u64>,
    },
    /// A `leader::Leader` on the lock [`LEADER`] from now to the end of the schedule (or the
    /// instance's kill): each run of its job writes to the fenced sink, one section per term.
    Lead,
}

/// The lock the leaders of a schedule elect by.
pub const LEADER: &str = "leader";

/// A fault of the server or the network.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The server runs nothing for this long.
    Freeze(u64),
    /// The server restarts empty.
    Restart,
    /// An instance's connection drops (what it had in flight is lost).
    Drop(usize),
    /// An instance is cut off for this long (its messages are lost; it sees time-outs).
    Cut(usize, u64),
    /// An instance's connection for calls is cut off for this long, its feed's not (one
    /// black-holed socket): its near tier goes on hearing the server while its calls fail.
    CutCalls(usize, u64),
    /// An instance is killed: its calls stop where they are (computations included), nothing
    /// more of it reaches the server, and it makes no further call.
    Kill(usize),
    /// Another program deletes a key's value (`DEL`): no fence bump, no wake-up.
    OutsideDelete(String),
    /// Another program writes bytes that are not the crate's under a key's value (`SET`, with
    /// `PX` if `ttl_ms`): read as a miss and replaced, never served.
    OutsideSet {
        key: String,
        bytes: String,
        ttl_ms: Option<u64>,
    },
    /// Another program shortens a key's value's life to this many ms (`PEXPIRE`).
    OutsideExpire(String, u64),
    /// The server fails over to a replica that lags by `lag_ms`: what it ran in those last ms
    /// is lost (values, locks, fencing counters, epochs go back), every connection closes.
    Failover { lag_ms: u64 },
    /// Another program flushes the database (`FLUSHDB`): values, locks, fencing counters and
    /// epochs gone, connections kept.
    FlushDb,
}

#[derive(Debug, Clone, PartialEq)]
pub enum What {
    Call { instance: usize, action: Action },
    Fault(Fault),
}

/// One step: at `at_ms` into the schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub at_ms: u64,
    pub what: What,
}

/// A schedule: its seed (the network's draws, the crate's own random draws, the instances'
/// clocks) and its steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub seed: u64,
    pub steps: Vec<Step>,
    /// Whether the instances' clocks drift (`run::skews`, from the seed). `false`: every
    /// instance reads the server's clock exactly, on tokio's monotonic clock, as every schedule
    /// did before clocks drifted; kept for the findings replayed from then.
    pub clocks_drift: bool,
}

/// The hash tags of every key a schedule may touch (entries, locks, epochs: `%t:<tag>`, `%c`),
/// as the checker names what a failover covers.
pub fn hash_tags() -> Vec<String> {
    let keys = (0..KEYS).map(|k| format!("k{k}"));
    let locks = LOCKS.iter().map(|l| l.to_string());
    let epochs = TAGS.iter().map(|t| format!("%t:{t}"));
    keys.chain(locks)
        .chain([LEADER.to_string()])
        .chain(epochs)
        .chain(["%c".to_string()])
        .collect()
}

impl Plan {
    /// When the replica catches up before each failover: its lag before it, in order.
    pub fn replica_syncs(&self) -> Vec<u64> {
        let mut syncs: Vec<u64> = self
            .steps
            .iter()
            .filter_map(|s| match s.what {
                What::Fault(Fault::Failover { lag_ms }) => Some(s.at_ms.saturating_sub(lag_ms)),
                _ => None,
            })
            .collect();
        syncs.sort_unstable();
        syncs
    }
}

fn key(rng: &mut StdRng) -> String {
    format!("k{}", rng.random_range(0..KEYS))
}

/// `n` distinct tags.
fn tags(rng: &mut StdRng, n: usize) -> Vec<String> {
    rand::seq::index::sample(rng, TAGS.len(), n)
        .into_iter()
        .map(|i| TAGS[i].to_string())
        .collect()
}

fn action(rng: &mut StdRng) -> Action {
    let handle_tags = {
        let n = rng.random_range(0..3);
        tags(rng, n)
    };
    // Mostly quick computations, some past the lease (the heartbeat must keep it).
    let compute_ms = match rng.random_range(0..100) {
        0..70 => rng.random_range(0..20),
        70..92 => rng.random_range(20..120),
        _ => rng.random_range(150..400),
    };
    let ttl_ms = rng.random_range(50..1000);
    match rng.random_range(0..100) {
        0..10 => Action::Invalidate { key: key(rng) },
        10..16 => Action::Set {
            key: key(rng),
            handle_tags,
        },
        16..30 => Action::Batch {
            keys: (0..rng.random_range(2..=3)).map(|_| key(rng)).collect(),
            compute_ms,
            leave_out: rng.random_range(0..100) < 5,
            ttl_ms,
            handle_tags,
        },
        30..36 => Action::InvalidateTag {
            tag: tags(rng, 1).remove(0),
        },
        36..38 => Action::Clear,
        38..46 => Action::Lock {
            name: LOCKS[rng.random_range(0..LOCKS.len())].to_string(),
            holds_ms: (0..rng.random_range(1..=3))
                .map(|_| rng.random_range(0..150))
                .collect(),
        },
        _ => Action::Fetch {
            key: key(rng),
            compute_ms,
            fail: rng.random_range(0..100) < 5,
            ttl_ms,
            handle_tags,
            computed_tags: {
                let n = usize::from(rng.random_range(0..10) < 3);
                tags(rng, n)
            },
        },
    }
}

fn fault(rng: &mut StdRng) -> Fault {
    match rng.random_range(0..100) {
        0..20 => Fault::Freeze(rng.random_range(20..300)),
        20..25 => Fault::Failover {
            lag_ms: rng.random_range(0..300),
        },
        25..38 => Fault::Restart,
        38..58 => Fault::Drop(rng.random_range(0..INSTANCES)),
        58..66 => Fault::Kill(rng.random_range(0..INSTANCES)),
        66..78 => outside_write(rng),
        kind => {
            let (instance, ms) = (rng.random_range(0..INSTANCES), rng.random_range(50..500));
            match kind {
                78..91 => Fault::Cut(instance, ms),
                _ => Fault::CutCalls(instance, ms),
            }
        }
    }
}

/// What another program may write under a value key: nothing the crate wrote (none is its
/// envelope), some of it nearly so.
const FOREIGN: &[&str] = &["from another program", "", "\u{1}\u{0}\u{0}", "{\"v\":1}"];

/// Another program's write, straight to the server (as the chaos test's outside writer).
fn outside_write(rng: &mut StdRng) -> Fault {
    match rng.random_range(0..100) {
        0..40 => Fault::OutsideDelete(key(rng)),
        40..70 => Fault::OutsideSet {
            key: key(rng),
            bytes: FOREIGN[rng.random_range(0..FOREIGN.len())].to_string(),
            ttl_ms: (rng.random_range(0..2) == 0).then(|| rng.random_range(1..1000)),
        },
        70..90 => Fault::OutsideExpire(key(rng), rng.random_range(0..200)),
        _ => Fault::FlushDb,
    }
}

/// One or two instances that run a leader from the start.
fn leaders(seed: u64) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1ead_e125);
    let n = rng.random_range(1..=2);
    rand::seq::index::sample(&mut rng, INSTANCES, n)
        .into_iter()
        .map(|instance| Step {
            at_ms: 0,
            what: What::Call {
                instance,
                action: Action::Lead,
            },
        })
        .collect()
}

/// One schedule in [`OUTAGE_ONE_IN`] has an outage of a near tier's own: the random mix
/// rarely lines up what a near tier's bounds need to be tested (docs/history/simulation.md):
/// a copy (filled only by a hit read from the server), a change of its key by another
/// instance while the copy's owner hears nothing, and a read of that key by the owner later
/// than `max_staleness` after the change, before its feed gives up (rule (f)), or later than
/// `serve_while_down` + `max_staleness` while it is still cut off (rule (g)).
const OUTAGE_ONE_IN: u64 = 4;

/// A near tier's outage, drawn apart from the plan's own draws (so the rest of the plan, and
/// every schedule without one, is what it was): another instance `set`s a key, the near
/// instance reads it (a hit: its copy), is cut off for 50 ms to past both of its bounds and
/// the feed's giving up, while another instance changes the key; the near instance reads it
/// three times, 0.1 to 1.4 s after the change. It begins before `until_ms`, among the plan's
/// own calls.
fn near_outage(seed: u64, until_ms: u64) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0a7a_9e00_0039);
    if rng.random_range(0..OUTAGE_ONE_IN) != 0 {
        return Vec::new();
    }
    let near = crate::run::NEAR[rng.random_range(0..crate::run::NEAR.len())];
    let other = |rng: &mut StdRng| (near + rng.random_range(1..INSTANCES)) % INSTANCES;
    let key = key(&mut rng);
    let set = || Action::Set {
        key: key.clone(),
        handle_tags: Vec::new(),
    };
    let read = |rng: &mut StdRng| Action::Fetch {
        key: key.clone(),
        compute_ms: rng.random_range(0..20),
        fail: false,
        ttl_ms: rng.random_range(50..1000),
        handle_tags: Vec::new(),
        computed_tags: Vec::new(),
    };
    let call = |at_ms, instance, action| Step {
        at_ms,
        what: What::Call { instance, action },
    };
    let filled = rng.random_range(0..until_ms.max(1));
    let read_at = filled + rng.random_range(10..40);
    let cut_at = read_at + rng.random_range(10..60);
    let longest = (crate::run::FEED_GIVES_UP.as_millis() as u64) * 3 / 2;
    let cut_ms = rng.random_range(50..longest);
    let changed_at = cut_at + rng.random_range(0..100);
    let change = match rng.random_range(0..10) {
        0..6 => set(),
        _ => Action::Invalidate { key: key.clone() },
    };
    let mut steps = vec![
        call(filled, other(&mut rng), set()),
        call(read_at, near, read(&mut rng)),
        Step {
            at_ms: cut_at,
            what: What::Fault(Fault::Cut(near, cut_ms)),
        },
        call(changed_at, other(&mut rng), change),
    ];
    for _ in 0..3 {
        let at_ms = changed_at + rng.random_range(100..1400);
        steps.push(call(at_ms, near, read(&mut rng)));
    }
    steps
}

impl Plan {
    /// The plan of `seed`: `calls` calls spread over the instances, now and then a fault, and
    /// in one schedule in [`OUTAGE_ONE_IN`] a near tier's outage ([`near_outage`]).
    pub fn draw(seed: u64, calls: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut steps = Vec::new();
        let mut at_ms = 0;
        for _ in 0..calls {
            at_ms += rng.random_range(0..40);
            if rng.random_range(0..100) < 8 {
                steps.push(Step {
                    at_ms,
                    what: What::Fault(fault(&mut rng)),
                });
            }
            steps.push(Step {
                at_ms,
                what: What::Call {
                    instance: rng.random_range(0..INSTANCES),
                    action: action(&mut rng),
                },
            });
        }
        // The leaders from a draw of their own: the rest of the plan is what it was before
        // schedules had leaders.
        steps.splice(0..0, leaders(seed));
        let until_ms = steps.last().map_or(0, |s| s.at_ms);
        steps.extend(near_outage(seed, until_ms));
        // In time order; steps at one instant keep the order they were drawn in.
        steps.sort_by_key(|s| s.at_ms);
        Plan {
            seed,
            steps,
            clocks_drift: true,
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.what {
            What::Call { instance, action } => {
                write!(f, "{:>6} ms  i{instance} {action:?}", self.at_ms)
            }
            What::Fault(fault) => write!(f, "{:>6} ms  FAULT {fault:?}", self.at_ms),
        }
    }
}
