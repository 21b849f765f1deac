//! The checker of the Redlock schedule (`redlock.rs`): what a run over five independent nodes,
//! restarted without persistence, must keep.
//!
//! - (a) no two critical sections of one lock overlap (a section counts once its holder found
//!   its lease valid and wrote to the sink, as in rule (a) of `checker.rs`). With restarts
//!   delayed by at least one lease, every overlap is a violation. With no delay an overlap is a
//!   documented kind, *explained by restarts*, when a node that may have granted the earlier
//!   holder restarted after that holder asked and before the later holder was granted, and the
//!   later holder was granted by that node: the case the Redis docs' Redlock page describes
//!   (a node that forgets a lock it granted lets a second client build a majority). Any other
//!   overlap is a violation;
//! - (b) a later request gets a higher token (`checker.rs`'s rule (b), holders' side), and the
//!   fenced sink refuses every stale token even when two holders overlap: no write is accepted
//!   with a token lower than one accepted before, and no two sections are accepted under the
//!   same token (the sink takes a token equal to its highest, so two holders sharing a token
//!   would both get through);
//! - (e) nothing stranded: every worker not killed exits cleanly, and no lock key is left on any
//!   node one lease after the run.
//!
//! Which nodes granted a section is read by its holder right after the acquisition (the nodes
//! whose lock key holds the value most nodes hold: its own); a node that restarted between the
//! request and that read may have granted it too, and counts as if it had.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::checker::later_requests_get_higher_tokens;
use crate::history::{Ending, History, Section, Violation};

/// The checker's tests, on hand-made histories (`cargo test --test chaos redlock_checker`).
pub const TESTS: &[(&str, fn())] = &[
    (
        "redlock_checker_passes_a_good_history",
        redlock_checker_passes_a_good_history,
    ),
    (
        "redlock_checker_refuses_every_overlap_when_restarts_are_delayed",
        redlock_checker_refuses_every_overlap_when_restarts_are_delayed,
    ),
    (
        "redlock_checker_explains_an_overlap_only_by_a_restart_of_a_shared_node",
        redlock_checker_explains_an_overlap_only_by_a_restart_of_a_shared_node,
    ),
    (
        "redlock_checker_finds_stale_or_shared_tokens_accepted",
        redlock_checker_finds_stale_or_shared_tokens_accepted,
    ),
];

/// One restart of a node, by the controller's clock: from the kill (every lock it held is
/// forgotten) to the moment the new, empty server answered.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRestart {
    pub node: usize,
    pub down_us: u64,
    pub up_us: u64,
}

/// The nodes a holder found holding its lock right after its acquisition, and when it read them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Granted {
    pub read_us: u64,
    pub nodes: Vec<usize>,
    /// The holder renewed its lease (the other holders take it once).
    pub renewed: bool,
}

/// One write to the fenced sink, in the sink's order.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkWrite {
    pub instance: String,
    pub section: u64,
    pub lock: String,
    pub token: u64,
    pub accepted: bool,
}

/// What a Redlock run recorded beyond the common history (whose sections, endings, lease and
/// lock keys left after the run it uses).
#[derive(Debug, Clone, Default)]
pub struct RedlockHistory {
    pub history: History,
    /// By section: (instance, id).
    pub granted: HashMap<(String, u64), Granted>,
    pub restarts: Vec<NodeRestart>,
    pub sink: Vec<SinkWrite>,
    /// Every restart kept its node down for at least one lease.
    pub delayed: bool,
    /// Failed acquisitions, by error kind (evidence, not judged).
    pub errors: BTreeMap<String, u64>,
}

/// An overlap of two sections (instance, id, token), the earlier-started first, the nodes that
/// may have granted each, and the node whose restart explains it (`None`: unexplained).
#[derive(Debug, Clone, PartialEq)]
pub struct Overlap {
    pub lock: String,
    pub earlier: (String, u64, u64),
    pub later: (String, u64, u64),
    pub earlier_nodes: BTreeSet<usize>,
    pub later_nodes: BTreeSet<usize>,
    pub node: Option<usize>,
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b) = (&self.earlier, &self.later);
        write!(
            f,
            "lock {}: section {}#{} token {} and section {}#{} token {} overlap",
            self.lock, a.0, a.1, a.2, b.0, b.1, b.2
        )?;
        match self.node {
            Some(n) => write!(f, " (node {n} restarted between them and granted both")?,
            None => write!(f, " (no restart of a node that granted both explains it")?,
        }
        write!(
            f,
            "; granted by nodes {:?} and {:?} at most)",
            self.earlier_nodes, self.later_nodes
        )
    }
}

/// What the sink saw: writes, accepted, refused, and refused writes by the earlier holder of an
/// overlap after the later holder's first accepted write (the stale writes fencing caught).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fencing {
    pub writes: usize,
    pub accepted: usize,
    pub refused: usize,
    pub refused_in_overlaps: usize,
}

/// The checker's verdict: violations, every overlap found, and the sink's counts.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub overlaps: Vec<Overlap>,
    pub fencing: Fencing,
}

/// Every rule's findings, and the counts the run reports.
pub fn check(r: &RedlockHistory) -> Verdict {
    let overlaps = overlaps(r);
    let mut violations = Vec::new();
    for o in &overlaps {
        if r.delayed || o.node.is_none() {
            violations.push(Violation {
                rule: 'a',
                detail: o.to_string(),
            });
        }
    }
    violations.extend(later_requests_get_higher_tokens(&r.history));
    let (sink_violations, fencing) = sink_refuses_stale_tokens(r, &overlaps);
    violations.extend(sink_violations);
    violations.extend(nothing_stranded(&r.history));
    Verdict {
        violations,
        overlaps,
        fencing,
    }
}

/// The overlapping pairs of sections (with writes) of each lock, each with its explanation.
fn overlaps(r: &RedlockHistory) -> Vec<Overlap> {
    let mut by_lock: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for s in r.history.sections.iter().filter(|s| s.writes > 0) {
        by_lock.entry(&s.lock).or_default().push(s);
    }
    let mut out = Vec::new();
    for (lock, mut sections) in by_lock {
        sections.sort_by_key(|s| s.start_us);
        for (i, b) in sections.iter().enumerate() {
            for a in &sections[..i] {
                if a.end_us > b.start_us {
                    out.push(Overlap {
                        lock: lock.to_string(),
                        earlier: (a.instance.clone(), a.id, a.token),
                        later: (b.instance.clone(), b.id, b.token),
                        earlier_nodes: may_have_granted(r, a),
                        later_nodes: may_have_granted(r, b),
                        node: explaining_restart(r, a, b),
                    });
                }
            }
        }
    }
    out
}

/// The nodes that may have granted `s`: those found holding its lock right after, and those that
/// restarted between its request and that read (they may have granted it and forgotten).
fn may_have_granted(r: &RedlockHistory, s: &Section) -> BTreeSet<usize> {
    let granted = r.granted.get(&(s.instance.clone(), s.id));
    let read_us = granted.map_or(s.start_us, |g| g.read_us);
    let mut nodes: BTreeSet<usize> = granted
        .map(|g| g.nodes.iter().copied().collect())
        .unwrap_or_default();
    nodes.extend(
        r.restarts
            .iter()
            .filter(|k| k.down_us >= s.asked_us && k.down_us <= read_us)
            .map(|k| k.node),
    );
    nodes
}

/// A node that may have granted both `a` (the earlier) and `b`, and restarted after `a` asked and
/// before `b` was granted: it forgot `a`'s lock and gave it to `b`.
fn explaining_restart(r: &RedlockHistory, a: &Section, b: &Section) -> Option<usize> {
    let shared: BTreeSet<usize> = may_have_granted(r, a)
        .intersection(&may_have_granted(r, b))
        .copied()
        .collect();
    r.restarts
        .iter()
        .filter(|k| shared.contains(&k.node))
        .find(|k| k.down_us >= a.asked_us && k.down_us <= b.start_us)
        .map(|k| k.node)
}

/// Rule (b), the sink's side: in the sink's order, an accepted write never carries a token lower
/// than one accepted before, nor the same token as another section's accepted write. Counts
/// the refused writes, and those of an overlap's earlier holder after the later one's first
/// accepted write.
fn sink_refuses_stale_tokens(
    r: &RedlockHistory,
    overlaps: &[Overlap],
) -> (Vec<Violation>, Fencing) {
    let mut out = Vec::new();
    let mut fencing = Fencing::default();
    // Per lock: the highest token accepted, and the section it was accepted for.
    let mut highest: HashMap<&str, (u64, (&str, u64))> = HashMap::new();
    // Per section: the position of its first accepted write.
    let mut first_accepted: HashMap<(&str, u64), usize> = HashMap::new();
    for (at, w) in r.sink.iter().enumerate() {
        fencing.writes += 1;
        if !w.accepted {
            fencing.refused += 1;
            continue;
        }
        fencing.accepted += 1;
        let me = (w.instance.as_str(), w.section);
        first_accepted.entry(me).or_insert(at);
        if let Some((token, by)) = highest.get(w.lock.as_str()) {
            if w.token < *token || (w.token == *token && *by != me) {
                out.push(Violation {
                    rule: 'b',
                    detail: format!(
                        "lock {}: the sink accepted token {} from {}#{} after token {token} from {}#{}",
                        w.lock, w.token, w.instance, w.section, by.0, by.1
                    ),
                });
            }
        }
        if highest
            .get(w.lock.as_str())
            .is_none_or(|(t, _)| w.token >= *t)
        {
            highest.insert(&w.lock, (w.token, me));
        }
    }
    for o in overlaps {
        let Some(&later_first) = first_accepted.get(&(o.later.0.as_str(), o.later.1)) else {
            continue;
        };
        fencing.refused_in_overlaps += r
            .sink
            .iter()
            .skip(later_first)
            .filter(|w| !w.accepted && w.instance == o.earlier.0 && w.section == o.earlier.1)
            .count();
    }
    (out, fencing)
}

/// Rule (e): every worker not killed exited cleanly, and no lock key outlived the run by a lease.
fn nothing_stranded(h: &History) -> Vec<Violation> {
    let unclean = h
        .endings
        .iter()
        .filter(|e: &&Ending| !e.killed && !e.clean_exit)
        .map(|e| format!("{} did not shut down cleanly", e.instance));
    let stranded = h
        .locks_after_lease
        .iter()
        .map(|key| format!("lock key {key} outlived its lease after the run"));
    unclean
        .chain(stranded)
        .map(|detail| Violation { rule: 'e', detail })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The tests, on hand-made histories.

fn section(instance: &str, id: u64, token: u64, (asked, start, end): (u64, u64, u64)) -> Section {
    Section {
        instance: instance.into(),
        id,
        lock: "R0".into(),
        token,
        asked_us: asked,
        start_us: start,
        end_us: end,
        writes: 1,
        accepted: 1,
    }
}

fn sink_write(instance: &str, section: u64, token: u64, accepted: bool) -> SinkWrite {
    SinkWrite {
        instance: instance.into(),
        section,
        lock: "R0".into(),
        token,
        accepted,
    }
}

/// Two holders one after the other, each granted by all five nodes, one node restarted between
/// them, restarts delayed.
fn good_history() -> RedlockHistory {
    let mut r = RedlockHistory {
        delayed: true,
        ..RedlockHistory::default()
    };
    r.history.lease_ms = 300;
    r.history.sections = vec![
        section("w0.1", 1, 100, (0, 10, 200)),
        section("w1.1", 1, 200, (150, 400, 500)),
    ];
    for (instance, read_us) in [("w0.1", 11), ("w1.1", 401)] {
        let granted = Granted {
            read_us,
            nodes: vec![0, 1, 2, 3, 4],
            renewed: true,
        };
        r.granted.insert((instance.into(), 1), granted);
    }
    r.restarts.push(NodeRestart {
        node: 2,
        down_us: 300,
        up_us: 310,
    });
    r.sink = vec![
        sink_write("w0.1", 1, 100, true),
        sink_write("w0.1", 1, 100, true),
        sink_write("w1.1", 1, 200, true),
        // A stale write of the first holder, resumed late: refused.
        sink_write("w0.1", 1, 100, false),
    ];
    r.history.endings = vec![Ending {
        instance: "w0.1".into(),
        killed: false,
        clean_exit: true,
        in_flight: None,
    }];
    r
}

fn redlock_checker_passes_a_good_history() {
    let verdict = check(&good_history());
    assert_eq!(verdict.violations, vec![]);
    assert_eq!(verdict.overlaps, vec![]);
    let fencing = Fencing {
        writes: 4,
        accepted: 3,
        refused: 1,
        refused_in_overlaps: 0,
    };
    assert_eq!(verdict.fencing, fencing);
}

/// The second holder granted while the first still wrote, on nodes 2, 3, 4; node 2 restarted
/// in between. Delayed restarts promise no overlap at all.
fn overlapping() -> RedlockHistory {
    let mut r = good_history();
    r.history.sections[1] = section("w1.1", 1, 200, (150, 180, 500));
    r.restarts[0].down_us = 160;
    r.granted.insert(
        ("w1.1".into(), 1),
        Granted {
            read_us: 181,
            nodes: vec![2, 3, 4],
            renewed: true,
        },
    );
    r
}

fn redlock_checker_refuses_every_overlap_when_restarts_are_delayed() {
    let verdict = check(&overlapping());
    assert_eq!(verdict.overlaps.len(), 1);
    assert_eq!(verdict.overlaps[0].node, Some(2));
    assert_eq!(verdict.violations.len(), 1, "{:?}", verdict.violations);
    assert_eq!(verdict.violations[0].rule, 'a');
    // The first holder's last write came after the second's first accepted one: refused.
    assert_eq!(verdict.fencing.refused_in_overlaps, 1);
    let mut broken = good_history();
    broken.history.endings[0].clean_exit = false;
    broken.history.locks_after_lease = vec!["chaos:{R0}_lock@node1".into()];
    let rules: Vec<char> = check(&broken).violations.iter().map(|v| v.rule).collect();
    assert_eq!(rules, vec!['e', 'e']);
}

fn redlock_checker_explains_an_overlap_only_by_a_restart_of_a_shared_node() {
    let mut r = overlapping();
    r.delayed = false;
    let verdict = check(&r);
    assert_eq!(verdict.violations, vec![], "explained by node 2's restart");
    assert_eq!(verdict.overlaps.len(), 1);

    // A restart of a node the later holder did not get (before it asked) explains nothing.
    let mut other_node = r.clone();
    other_node.restarts[0].node = 0;
    other_node.restarts[0].down_us = 140;
    assert_eq!(check(&other_node).violations.len(), 1);
    // Nor one before the earlier holder asked (it could not forget a lock not yet granted).
    let mut too_early = r.clone();
    too_early.restarts[0].down_us = 0;
    too_early.history.sections[0].asked_us = 5;
    assert_eq!(check(&too_early).violations.len(), 1);
    // Nor one after the later holder was granted.
    let mut too_late = r.clone();
    too_late.restarts[0].down_us = 190;
    assert_eq!(check(&too_late).violations.len(), 1);
    // A node the earlier holder was not seen on, but which restarted before its read, may have
    // granted it: explained.
    let mut unseen = r;
    unseen
        .granted
        .get_mut(&("w0.1".into(), 1))
        .expect("read")
        .nodes = vec![0, 1, 3];
    unseen
        .granted
        .get_mut(&("w0.1".into(), 1))
        .expect("read")
        .read_us = 170;
    unseen.restarts[0].down_us = 12;
    assert_eq!(check(&unseen).overlaps[0].node, Some(2));
    assert_eq!(check(&unseen).violations, vec![]);
}

fn redlock_checker_finds_stale_or_shared_tokens_accepted() {
    let mut stale = good_history();
    stale.sink[3].accepted = true;
    let found = check(&stale).violations;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].rule, 'b');

    let mut shared = good_history();
    shared.history.sections[1].token = 100;
    shared.sink[2] = sink_write("w1.1", 1, 100, true);
    let rules: Vec<char> = check(&shared).violations.iter().map(|v| v.rule).collect();
    // Two sections accepted under one token, and the later request did not get a higher one.
    assert_eq!(rules, vec!['b', 'b'], "{:?}", check(&shared).violations);
}
