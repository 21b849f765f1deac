//! The checker: the rules a chaos run's [`History`] must keep, one function per rule (or per
//! half of one), each with its tests on hand-made histories below it.
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
//!   write, or another program's raw `SET`, `DEL`, `UNLINK`, `PEXPIRE` or `FLUSHDB`) that the
//!   server ran more than that worker's `max_staleness` before the call began.
//!   Every value such a worker gets as `Source::Hit` counts as possibly served from its near
//!   tier (a near copy is served as a hit, and the API does not say which hits were near ones;
//!   a value this call read from Redis is never older than what the server ran before the call,
//!   so it always passes). A value got by following another call of the process (`Waited`) is
//!   not judged: its leader read it, possibly before this call began (two 10,000-round runs each
//!   found one such follower, of a flight that spanned a stopped process, before this was so). Every instance announces
//!   its changes, and the near tiers track their keys (`CLIENT TRACKING`), so every change
//!   counts, whoever made it: a fill after Redis evicted the value too (no excuse since
//!   tracking). A value served from a held copy is judged by rule (g) instead;
//! - (g) the relaxed bound of `serve_while_down`: a value a worker was served from a copy its
//!   near tier held while the backend was unreachable (`Source::Held`) is never older than a
//!   change of its key that the server ran more than that worker's bound plus its
//!   `max_staleness` before the call began; only a worker that serves while down gets such
//!   values;
//! - (h) tags and clear: no call that began after a tag invalidation or a clear returned (plus
//!   the near tier's bound, for a worker that runs one) gets a value born before that
//!   invalidation began that carries one of its tags (a clear: any value), by whatever path
//!   (Redis, a near copy, a held copy, an in-process follower), unless every epoch that judges
//!   it was lost on the server in between (a restart, a flush, an eviction of the epoch key);
//!   and the server's side of it: each invalidation that returned `Ok` raised and announced
//!   its epochs while it ran, epochs only go up, and each stored value records the tags it
//!   was given and a birth no later than its computation's start;
//! - (i) a queued write wins in its own instance: after a `set`, an `invalidate`, a tag
//!   invalidation or a clear returned `Written::Queued` (auto-recovery), no call of that
//!   instance that began later reads (as a hit or a stale value) a value the write replaces:
//!   for a key, one the server had before the write began; for a tag or a clear, one born
//!   before it that carries the tag (any value for a clear), unless every epoch that judges
//!   it was lost on the server before the read ended, as in (h). The replay comes before the
//!   read (docs/after-commit.md). A key's write undone by a failover of its master before the
//!   read ended is a documented kind of the failover.

//!
//! Each rule's function returns its own findings; [`check`] collects them. A write the replay
//! could not read is a finding of rule (b), whose evidence (the fence) it lacks.
//!
//! On a cluster that fails over (docs/guarantees.md, "When the cluster fails over"), some
//! findings are the documented price of asynchronous replication, and are counted by kind
//! ([`documented`]) instead of passing silently or failing the run: a finding of rule (a) or
//! (b) whose earlier event the replay proves lost with the old master (a [`Rollback`] lists
//! the bumps the new master never had: an acquisition lost there hands its token out again),
//! and lock sections that overlap across a failover of their key's master. They carry the
//! rule's letter in upper case and their kind in brackets.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{
    epoch_tag, parse_value, raised_by, BumpCause, Call, Change, Compute, Ending, Epoch,
    FailoverWindow, History, Outcome, Pause, Raise, Rollback, Section, ServerEvent, Violation,
    Write,
};

/// The error kinds a call may end with under faults; anything else is a bug.
const EXPECTED_ERRORS: &[&str] = &["Backend", "WaitTimeout", "Compute", "NotHeld"];

/// Whether a call of `op` may end with the error `kind`: a batch also with `MissingFromBatch`
/// (its computation left the key out, as the workers do on purpose), and only a batch: a
/// single-key caller that followed such a key computes it itself.
fn expected_error(op: &str, kind: &str) -> bool {
    EXPECTED_ERRORS.contains(&kind) || (op == "batch" && kind == "MissingFromBatch")
}

/// The checker's tests, on hand-made histories; the binary's `main` runs them (the chaos test
/// has its own harness), and `cargo test --test chaos checker` runs them alone.
pub const TESTS: &[(&str, fn())] = &[
    (
        "checker_passes_a_good_history",
        checker_passes_a_good_history,
    ),
    (
        "checker_rule_a_finds_overlaps_unless_the_lock_was_lost",
        checker_rule_a_finds_overlaps_unless_the_lock_was_lost,
    ),
    (
        "checker_rule_b_finds_tokens_out_of_order",
        checker_rule_b_finds_tokens_out_of_order,
    ),
    (
        "checker_rule_c_finds_writes_after_an_invalidation",
        checker_rule_c_finds_writes_after_an_invalidation,
    ),
    (
        "checker_rule_d_finds_bad_calls_but_excuses_pauses_and_kills",
        checker_rule_d_finds_bad_calls_but_excuses_pauses_and_kills,
    ),
    (
        "checker_rule_e_finds_what_was_stranded",
        checker_rule_e_finds_what_was_stranded,
    ),
    (
        "checker_holds_near_reads_to_max_staleness",
        checker_holds_near_reads_to_max_staleness,
    ),
    (
        "checker_holds_held_reads_to_the_relaxed_bound",
        checker_holds_held_reads_to_the_relaxed_bound,
    ),
    (
        "checker_rule_h_finds_values_served_after_their_invalidation",
        checker_rule_h_finds_values_served_after_their_invalidation,
    ),
    (
        "checker_rule_h_holds_the_server_to_the_invalidations",
        checker_rule_h_holds_the_server_to_the_invalidations,
    ),
    (
        "checker_rule_i_finds_reads_that_beat_a_queued_write",
        checker_rule_i_finds_reads_that_beat_a_queued_write,
    ),
    (
        "checker_counts_what_a_failover_may_break_and_nothing_else",
        checker_counts_what_a_failover_may_break_and_nothing_else,
    ),
];

/// Every rule's findings, rule by rule: the violations (the documented kinds of a failover
/// are counted apart, by [`documented`]).
pub fn check(h: &History) -> Vec<Violation> {
    findings(h)
        .into_iter()
        .filter(|f| f.rule.is_ascii_lowercase())
        .collect()
}

/// The findings a cluster's failovers may cause, as docs/guarantees.md states them ("When the
/// cluster fails over"): each proven by the replay or the controller's record, counted by kind.
pub fn documented(h: &History) -> Vec<Violation> {
    findings(h)
        .into_iter()
        .filter(|f| f.rule.is_ascii_uppercase())
        .collect()
}

/// The documented findings by kind (the bracketed label that starts each).
pub fn documented_kinds(found: &[Violation]) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for f in found {
        let kind = f
            .detail
            .strip_prefix('[')
            .and_then(|d| d.split_once(']'))
            .map_or("unlabelled", |(kind, _)| kind);
        *kinds
            .entry(format!("({}) {kind}", f.rule.to_ascii_lowercase()))
            .or_default() += 1;
    }
    kinds
}

/// A documented finding of `rule` (upper case), of `kind`.
fn documented_finding(rule: char, kind: &str, detail: String) -> Violation {
    violation(rule.to_ascii_uppercase(), format!("[{kind}] {detail}"))
}

/// The acquisitions the replay proves lost with an old master ([`Rollback::lost`]), by key and
/// token: the new master's counter never had them, so it may hand their tokens out again, or
/// (an old master that granted after its replica took over) go on below them.
fn lost_acquisitions(h: &History) -> HashSet<(&str, u64)> {
    h.server
        .iter()
        .filter_map(|e| match e {
            ServerEvent::Rollback(r) => Some(r),
            _ => None,
        })
        .flat_map(|r: &Rollback| {
            r.lost
                .iter()
                .filter(|(_, what)| *what == "acquisition")
                .map(|(token, _)| (r.key.as_str(), *token))
        })
        .collect()
}

/// Every rule's findings, violations and documented kinds alike.
fn findings(h: &History) -> Vec<Violation> {
    [
        accepted_computations_never_overlap(h),
        lock_sections_never_overlap(h),
        tokens_only_increase(h),
        no_write_after_an_invalidation(h),
        later_requests_get_higher_tokens(h),
        calls_end_in_time_with_a_good_outcome(h),
        nothing_stranded(h),
        near_reads_within_max_staleness(h),
        held_reads_within_the_relaxed_bound(h),
        no_value_served_after_its_invalidation(h),
        invalidations_reach_the_server(h),
        stored_values_carry_their_tags(h),
        queued_writes_win(h),
    ]
    .concat()
}

/// A finding of `rule`.
fn violation(rule: char, detail: String) -> Violation {
    Violation { rule, detail }
}

/// The values the server accepted: the ground truth of rules (a) and (d).
fn accepted_values(h: &History) -> HashSet<&str> {
    h.server
        .iter()
        .filter_map(|e| match e {
            ServerEvent::Write(w) => Some(w.value.as_str()),
            _ => None,
        })
        .collect()
}

/// Rule (a), computations: accepted computations of one key never overlap.
fn accepted_computations_never_overlap(h: &History) -> Vec<Violation> {
    let accepted_values = accepted_values(h);
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
    let reissued = lost_acquisitions(h);
    let mut out = Vec::new();
    for (key, spans) in &mut by_key {
        for (a, b) in overlaps(spans, |_, _| false) {
            let detail = format!("key {key}: accepted critical sections overlap: {a} and {b}");
            // Both under one token that a failover handed out twice.
            let token = |label: &str| {
                label
                    .split(" token ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            };
            match (token(&a), token(&b)) {
                (Some(ta), Some(tb)) if ta == tb && reissued.contains(&(key, ta)) => {
                    out.push(documented_finding(
                        'a',
                        "two holders of a token reissued after a failover",
                        detail,
                    ))
                }
                // One holder's grant was lost with the old master: the new master still had
                // the other's lock and counter, and took its write.
                (Some(ta), Some(tb))
                    if reissued.contains(&(key, ta)) || reissued.contains(&(key, tb)) =>
                {
                    out.push(documented_finding(
                        'a',
                        "a holder whose acquisition a failover lost",
                        detail,
                    ))
                }
                _ => out.push(violation('a', detail)),
            }
        }
    }
    out
}

/// Rule (a), locks: lock sections of one lock never overlap, unless the lock was lost on the
/// server in between: by a restart (which loses every lock) or by an eviction of the lock key
/// under memory pressure (the documented limits of a lock on a server without persistence, or
/// whose policy can evict it). The earlier-granted holder of the two then learns of the loss
/// at its next renewal. Which of the two was granted first is not always the one whose
/// section started first (a leader's first run may come well after its grant), so the loss
/// counts from the earlier of the two requests to the later section's start. An eviction is
/// seen through a notification on another connection, read by a thread of a busy controller,
/// which may come after the later grant reached its holder: it counts up to two leases later.
/// Stricter than "accepted sections": every section in which the holder checked its lease,
/// found it valid and wrote counts, accepted by the sink or not, because the lease promises
/// that the holder's own view never outlasts the lock in the backend; the sink's verdict
/// only says whether fencing also caught a late write.
fn lock_sections_never_overlap(h: &History) -> Vec<Violation> {
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
    let mut out = Vec::new();
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
        // On a cluster: a failover of the lock key's master can lose it (asynchronous
        // replication), as a restart does; counted, not passed silently.
        let failed_over = |a: &(u64, u64, String), b: &(u64, u64, String)| {
            let asked_a = asked.get(&a.2).copied().unwrap_or(a.0);
            let asked_b = asked.get(&b.2).copied().unwrap_or(b.0);
            let from = asked_a.min(asked_b);
            h.failovers.iter().any(|f| f.covers(lock, from, b.0))
        };
        for (a, b) in overlaps(spans, lock_lost) {
            let detail = format!("lock {lock}: critical sections overlap: {a} and {b}");
            let (sa, sb) = (
                spans.iter().find(|s| s.2 == a),
                spans.iter().find(|s| s.2 == b),
            );
            match (sa, sb) {
                (Some(sa), Some(sb)) if failed_over(sa, sb) => out.push(documented_finding(
                    'a',
                    "lock lost in a failover of its master",
                    detail,
                )),
                _ => out.push(violation('a', detail)),
            }
        }
    }
    out
}

/// What last bumped a key's fencing counter in the current server life: the token of an
/// acquisition (`None` for an invalidation or a `set`) and its name.
type LastBump = (Option<u64>, &'static str);

/// The name of a counter's state after a failover that the replay could not prove (no bump it
/// saw matches the new master's counter): no write can be matched against it.
const FAILED_OVER: &str = "failover";

/// Each server event with what last bumped its key's counter before it, in the server's order
/// (a restart forgets every counter): the evidence of rules (b) and (c).
fn with_last_bump(h: &History) -> Vec<(&ServerEvent, Option<LastBump>)> {
    let mut last_bump: HashMap<&str, LastBump> = HashMap::new();
    let mut out = Vec::new();
    for e in &h.server {
        let key = match e {
            ServerEvent::Life(_) | ServerEvent::Raise(_) | ServerEvent::Rollback(_) => None,
            ServerEvent::Acquire { key, .. }
            | ServerEvent::Bump { key, .. }
            | ServerEvent::Delete { key }
            | ServerEvent::Unreadable { key, .. } => Some(key.as_str()),
            ServerEvent::Write(w) => Some(w.key.as_str()),
        };
        out.push((e, key.and_then(|k| last_bump.get(k).copied())));
        match e {
            ServerEvent::Life(_) => last_bump.clear(),
            // After a failover the counter is what the new master had: its last bump that the
            // replay saw, or, unproven, a state no write can be matched against.
            ServerEvent::Rollback(r) => {
                let state = match (r.to, r.survivor) {
                    (Some(_), Some(survivor)) if !r.reseeded => survivor,
                    _ => (None, FAILED_OVER),
                };
                last_bump.insert(&r.key, state);
            }
            ServerEvent::Acquire { key, token } => {
                last_bump.insert(key, (Some(*token), "acquisition"));
            }
            ServerEvent::Bump { key, cause } => {
                let what = match cause {
                    BumpCause::Invalidate => "invalidation",
                    BumpCause::Set => "set",
                };
                last_bump.insert(key, (None, what));
            }
            _ => {}
        }
    }
    out
}

/// Rule (b), from the server's own order: acquisitions hand out strictly increasing tokens,
/// a computed write carries its own token as its fence, accepted writes carry strictly
/// increasing tokens, and a write is accepted only under its own acquisition, not after a newer
/// one or a `set` (after an invalidation it is rule (c)). A write the replay could not read
/// cannot be judged: it is a finding too.
fn tokens_only_increase(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut last_write: HashMap<&str, u64> = HashMap::new();
    let mut last_acquire: HashMap<&str, u64> = HashMap::new();
    let reissued = lost_acquisitions(h);
    for (e, last_bump) in with_last_bump(h) {
        match e {
            // The new master's first bump set its counter to its clock: every token it hands
            // out from there is above everything the old one handed out (`bump_fence`), so
            // the old bounds stand.
            ServerEvent::Rollback(r) if r.raised => {}
            ServerEvent::Rollback(r) => {
                // The new master goes on from its own counter: what the old one handed out
                // above it is no longer a bound (lost), and an unproven start bounds nothing.
                // When the counter's survivor is an acquisition, a write under its token is
                // that holder's own (one write, which releases the lock), not a repeat of a
                // write the old master took above it: the bound on writes is one below.
                let granted_to =
                    matches!(r.survivor, Some((Some(t), "acquisition")) if Some(t) == r.to);
                for (last, writes) in [(&mut last_write, true), (&mut last_acquire, false)] {
                    match r.to.filter(|_| !r.reseeded) {
                        Some(to) => {
                            let to = if writes && granted_to {
                                to.saturating_sub(1)
                            } else {
                                to
                            };
                            if let Some(prev) = last.get_mut(r.key.as_str()) {
                                *prev = (*prev).min(to);
                            }
                        }
                        None => {
                            last.remove(r.key.as_str());
                        }
                    }
                }
            }
            ServerEvent::Acquire { key, token } => {
                if let Some(prev) = last_acquire.get(key.as_str()) {
                    if token <= prev {
                        out.push(violation(
                            'b',
                            format!("key {key}: acquisition got token {token} after {prev}"),
                        ));
                    }
                }
                last_acquire.insert(key, *token);
            }
            ServerEvent::Write(w) if w.computed => {
                if w.token != w.fence {
                    out.push(violation(
                        'b',
                        format!(
                            "key {}: value {} computed under token {} stored with fence {}",
                            w.key, w.value, w.token, w.fence
                        ),
                    ));
                }
                if let Some(prev) = last_write.get(w.key.as_str()) {
                    if w.token <= *prev {
                        let detail = format!(
                            "key {}: write with token {} accepted after one with {}",
                            w.key, w.token, prev
                        );
                        if w.token == *prev && reissued.contains(&(w.key.as_str(), w.token)) {
                            out.push(documented_finding(
                                'b',
                                "a second write under a token reissued after a failover",
                                detail,
                            ));
                        } else {
                            out.push(violation('b', detail));
                        }
                    }
                }
                last_write.insert(&w.key, w.token);
                match last_bump {
                    Some((Some(t), _)) if t == w.token => {}
                    Some((_, "invalidation")) => {}
                    Some((_, FAILED_OVER)) => out.push(documented_finding(
                        'b',
                        "a write after a failover the replay could not prove",
                        format!(
                            "key {}: write with token {} accepted by a new master whose counter \
                             at the switch is unknown",
                            w.key, w.token
                        ),
                    )),
                    Some((other, what)) => out.push(violation(
                        'b',
                        format!(
                            "key {}: write with token {} accepted after a newer {what} ({other:?})",
                            w.key, w.token
                        ),
                    )),
                    None => out.push(violation(
                        'b',
                        format!(
                            "key {}: write with token {} accepted by a server that never granted it",
                            w.key, w.token
                        ),
                    )),
                }
            }
            ServerEvent::Unreadable { key, reason } => out.push(violation(
                'b',
                format!("key {key}: the server accepted a value the crate cannot read: {reason}"),
            )),
            _ => {}
        }
    }
    out
}

/// Rule (c): no computed write is accepted after an invalidation that followed its
/// acquisition, and a failed refresh's fenced delete only while its own acquisition is the
/// counter's last bump.
fn no_write_after_an_invalidation(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for (e, last_bump) in with_last_bump(h) {
        match e {
            ServerEvent::Write(w) if w.computed => match last_bump {
                Some((Some(t), _)) if t == w.token => {}
                Some((_, "invalidation")) => out.push(violation(
                    'c',
                    format!(
                        "key {}: write with token {} accepted after an invalidation that followed its acquisition",
                        w.key, w.token
                    ),
                )),
                _ => {}
            },
            ServerEvent::Delete { key } => match last_bump {
                Some((Some(_), "acquisition")) | Some((_, FAILED_OVER)) => {}
                other => out.push(violation(
                    'c',
                    format!("key {key}: a fenced delete accepted after a newer bump ({other:?})"),
                )),
            },
            _ => {}
        }
    }
    out
}

/// Rule (b), from the holders' side: a lock acquisition that began after another was granted
/// gets a higher token.
pub(crate) fn later_requests_get_higher_tokens(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let lost = lost_acquisitions(h);
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
            let earlier = || granted.iter().filter(|(start, _)| *start < s.asked_us);
            let earlier_max = earlier().map(|(_, t)| *t).max();
            // Without the grants the replay proves lost with an old master (a failover): the
            // new master never had them, so its tokens only rise above the others.
            let kept_max = earlier()
                .map(|(_, t)| *t)
                .filter(|t| !lost.contains(&(lock, *t)))
                .max();
            if let Some(max) = earlier_max {
                if s.token <= max {
                    let detail = format!(
                        "lock {lock}: {}#{} asked after token {max} was granted but got {}",
                        s.instance, s.id, s.token
                    );
                    let kind = if s.token == max {
                        "a token reissued after a failover lost its acquisition"
                    } else {
                        "a token below one granted by an old master and lost with it"
                    };
                    if kept_max.is_none_or(|kept| s.token > kept) {
                        out.push(documented_finding('b', kind, detail));
                    } else {
                        out.push(violation('b', detail));
                    }
                }
            }
            granted.push((s.start_us, s.token));
        }
    }
    out
}

/// Rule (d): every call ended, within its bound (time paused by SIGSTOP not counted), with a
/// value of its own key that the server accepted or its own process computed, or with a typed
/// error of an expected kind. An unfinished call of a killed process is excused.
fn calls_end_in_time_with_a_good_outcome(h: &History) -> Vec<Violation> {
    let accepted_values = accepted_values(h);
    let mut out = Vec::new();
    let mut violation = |rule: char, detail: String| out.push(Violation { rule, detail });
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
    out
}

/// Rule (e): nothing stranded: every process not killed shut down cleanly with no in-process
/// entry left, and no lock key is left without expiry or beyond its lease after the run, nor
/// at all one lease later.
fn nothing_stranded(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut violation = |rule: char, detail: String| out.push(Violation { rule, detail });
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
    out
}

/// Each key's changes in the server's order, and where each written value sits among them:
/// the evidence of rules (f) and (g).
struct Changes<'h> {
    by_key: HashMap<&'h str, Vec<&'h Change>>,
    written: HashMap<&'h str, (&'h str, usize)>,
}

impl<'h> Changes<'h> {
    fn of(h: &'h History) -> Self {
        let mut by_key: HashMap<&str, Vec<&Change>> = HashMap::new();
        let mut written: HashMap<&str, (&str, usize)> = HashMap::new();
        for c in &h.changes {
            let list = by_key.entry(&c.key).or_default();
            if let Some(v) = &c.value {
                written.insert(v, (&c.key, list.len()));
            }
            list.push(c);
        }
        Changes { by_key, written }
    }

    /// The first change of the key of `v`, after the write of `v`, that the server ran more
    /// than `bound_us` before `at_us`: the change a copy of `v` served at `at_us` missed,
    /// beyond `bound_us`. `None` for a value the server never took (the caller's own
    /// computation, not a copy).
    fn missed(&self, v: &str, at_us: u64, bound_us: u64) -> Option<&'h Change> {
        let &(key, at) = self.written.get(v)?;
        let changes = &self.by_key[key];
        // Every change counts, a computed write into a key Redis emptied by evicting its value
        // included: the near tiers track the keys (`CLIENT TRACKING`), so Redis reports the
        // eviction and the fill that follows it, like any other write. (Before tracking, such a
        // fill went unannounced and was excused here.)
        changes[at + 1..]
            .iter()
            .copied()
            .find(|c| c.at_us.saturating_add(bound_us) < at_us)
    }
}

/// What a stale read missed, for a finding of rule (f) or (g).
fn missed_change(call: &Call, v: &str, newer: &Change, bound: &str) -> String {
    format!(
        "{} call #{} for {} began at {} and returned {v} ({}), older than {} the server ran at \
         {} ({} ms before the call; {bound})",
        call.instance,
        call.id,
        call.key,
        call.start_us,
        call.source,
        match &newer.value {
            Some(w) => format!("the write of {w}"),
            None => "a delete".to_string(),
        },
        newer.at_us,
        (call.start_us - newer.at_us) / 1000,
    )
}

/// Rule (f): each value a near-tier worker was served as a hit, against the changes of its key
/// that the server ran after writing it; one finding per call at most. A value served from a held copy
/// (rule (g)) is not judged here: only it gets the relaxed bound.
fn near_reads_within_max_staleness(h: &History) -> Vec<Violation> {
    let changes = Changes::of(h);
    let mut found = Vec::new();
    for call in h.calls.iter().filter(|c| c.hit) {
        let Some(&bound) = h.near_instances.get(&call.instance) else {
            continue;
        };
        let Outcome::Value(v) = &call.outcome else {
            continue;
        };
        if let Some(newer) = changes.missed(v, call.start_us, bound) {
            let bound = format!("max_staleness {} ms", bound / 1000);
            found.push(violation('f', missed_change(call, v, newer, &bound)));
        }
    }
    found
}

/// Rule (g): a value served from a copy held while the backend was unreachable
/// (`Source::Held`) is never older than a change of its key that the server ran more than the
/// worker's `serve_while_down` bound plus its `max_staleness` before the call began (the
/// relaxed bound of docs/outages.md; the copy was proven current at most that long before it
/// was served, which is no earlier than the call's start). Only an instance that serves while
/// down may return a held value at all.
fn held_reads_within_the_relaxed_bound(h: &History) -> Vec<Violation> {
    let changes = Changes::of(h);
    let mut found = Vec::new();
    for call in h.calls.iter().filter(|c| c.held) {
        let Outcome::Value(v) = &call.outcome else {
            continue;
        };
        let (Some(&staleness), Some(&held)) = (
            h.near_instances.get(&call.instance),
            h.held_bounds.get(&call.instance),
        ) else {
            found.push(violation(
                'g',
                format!(
                    "{} call #{} for {} returned {v} as held, but {} does not serve while down",
                    call.instance, call.id, call.key, call.instance
                ),
            ));
            continue;
        };
        if let Some(newer) = changes.missed(v, call.start_us, held.saturating_add(staleness)) {
            let bound = format!(
                "serve_while_down {} ms + max_staleness {} ms",
                held / 1000,
                staleness / 1000
            );
            found.push(violation('g', missed_change(call, v, newer, &bound)));
        }
    }
    found
}

/// The tag invalidations and clears that returned `Ok`, with the epochs each raised.
fn completed_invalidations(h: &History) -> Vec<(&Call, u64, Vec<Epoch>)> {
    h.calls
        .iter()
        .filter(|c| c.outcome == Outcome::Done)
        .filter_map(|c| Some((c, c.end_us?, raised_by(c)?)))
        .collect()
}

/// Rule (i): a queued write (`Outcome::Queued`) wins in its instance: no later call of it
/// reads a value that write replaces (see the module docs). Values read by the call itself
/// are judged (hits, from Redis or the near tier, and stale reads); a follower of an older flight, a computation, a fallback are
/// not reads of the server after the write.
fn queued_writes_win(h: &History) -> Vec<Violation> {
    let births = Births::of(h);
    // When the server first held each value.
    let mut first_held: HashMap<&str, u64> = HashMap::new();
    for c in &h.changes {
        if let Some(v) = &c.value {
            let at = first_held.entry(v).or_insert(c.at_us);
            *at = (*at).min(c.at_us);
        }
    }
    let mut found = Vec::new();
    for call in h.calls.iter().filter(|c| c.hit || c.source == "stale") {
        let Outcome::Value(v) = &call.outcome else {
            continue;
        };
        let beaten = h.calls.iter().find(|q| {
            q.outcome == Outcome::Queued
                && q.instance == call.instance
                && q.end_us.is_some_and(|end| end < call.start_us)
                && replaces(h, &births, &first_held, q, call, v)
        });
        if let Some(q) = beaten {
            // A key's write the server ran, undone by a failover of its master before the
            // read ended: the documented price of asynchronous replication ("an `Ok`
            // invalidation or `set` can be undone"), counted apart.
            let undone = raised_by(q).is_none()
                && h.failovers
                    .iter()
                    .any(|f| f.covers(&q.key, q.start_us, call.end_us.unwrap_or(u64::MAX)));
            let detail = format!(
                "{} call #{} for {} began at {} and read {v} ({}), which {} call #{} {} {} \
                     ({}..{}) replaced: that write was queued, and its replay must come first",
                call.instance,
                call.id,
                call.key,
                call.start_us,
                call.source,
                q.instance,
                q.id,
                q.op,
                q.key,
                q.start_us,
                q.end_us.unwrap_or(q.start_us),
            );
            found.push(if undone {
                documented_finding('i', "a queued write undone by a failover", detail)
            } else {
                violation('i', detail)
            });
        }
    }
    found
}

/// Whether the queued write `q` replaces the value `v` that `call` read (see
/// [`queued_writes_win`]).
fn replaces(
    h: &History,
    births: &Births<'_>,
    first_held: &HashMap<&str, u64>,
    q: &Call,
    call: &Call,
    v: &str,
) -> bool {
    let Some(epochs) = raised_by(q) else {
        // A key's write (`set`, `invalidate`): the value the server held before it began.
        return q.key == call.key && first_held.get(v).is_some_and(|&at| at < q.start_us);
    };
    let Some(parts) = parse_value(v) else {
        return false;
    };
    let judging: Vec<&Epoch> = epochs
        .iter()
        .filter(|epoch| match epoch {
            Epoch::Clear => true,
            Epoch::Tag(tag) => parts.tags.contains(tag),
        })
        .collect();
    // As for rule (h): the epochs the read judged the value by may have been read after
    // they were lost (a restart before the call ended), which excuses it.
    let end = call.end_us.unwrap_or(u64::MAX);
    let lost = judging
        .iter()
        .all(|epoch| epoch_lost(h, epoch, q.start_us, end));
    !judging.is_empty() && !lost && births.latest(v, &parts).is_some_and(|b| b < q.start_us)
}

/// The latest each value can have been born, from what the history knows of how it was made:
/// its computation's start (the birth is read after the lock was granted, before `f` runs),
/// the end of the `set` that wrote it, and the first time the server wrote it (a birth is read
/// before the write is sent). A value none of these knows is rule (d)'s.
struct Births<'h> {
    computed: HashMap<&'h str, u64>,
    set_ends: HashMap<(&'h str, u64), u64>,
    written: HashMap<&'h str, u64>,
}

impl<'h> Births<'h> {
    fn of(h: &'h History) -> Self {
        let mut computed: HashMap<&str, u64> = HashMap::new();
        for c in &h.computes {
            let at = computed.entry(&c.value).or_insert(c.start_us);
            *at = (*at).min(c.start_us);
        }
        let set_ends = h
            .calls
            .iter()
            .filter(|c| c.op == "set")
            .filter_map(|c| Some(((c.instance.as_str(), c.id), c.end_us?)))
            .collect();
        let mut written: HashMap<&str, u64> = HashMap::new();
        for e in &h.server {
            if let ServerEvent::Write(w) = e {
                let at = written.entry(&w.value).or_insert(w.at_us);
                *at = (*at).min(w.at_us);
            }
        }
        Births {
            computed,
            set_ends,
            written,
        }
    }

    /// No later than this, `v` (made as `parts` say) was born.
    fn latest(&self, v: &str, parts: &crate::history::ValueParts) -> Option<u64> {
        let set_end = (!parts.computed)
            .then(|| self.set_ends.get(&(parts.instance.as_str(), parts.seq)))
            .flatten();
        [self.computed.get(v), set_end, self.written.get(v)]
            .into_iter()
            .flatten()
            .copied()
            .min()
    }
}

/// Rule (h), the values served: no call that began after a tag invalidation (or a clear)
/// returned, plus the bound of the tier that may have served it (a near tier's
/// `max_staleness`; a held copy's `serve_while_down` on top), gets a value born before that
/// invalidation began, if the value carries one of its tags (a clear: any value). Every
/// value a call gets is judged, whatever path served it (Redis, a near copy, a held copy, an
/// in-process follower): a value the call computed itself, or that a computation begun after
/// the invalidation made, is born after it and passes. "Born before" is what the history
/// proves: the value's latest possible birth (its computation's start, its `set`'s end or its
/// first write on the server) is before the invalidation's start, the earliest its epoch
/// can have been read from the server's clock. Excused: the epochs that judge it were all
/// lost in between (a restart or `FLUSHDB` empties the server; an `allkeys-*` policy may
/// evict an epoch key, which has no expiry), the documented price of an epoch kept in Redis.
fn no_value_served_after_its_invalidation(h: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    for (call, verdict) in tag_verdicts(h) {
        let Verdict::Missed {
            invalidation: inv,
            born_by,
            bound,
            tier,
        } = verdict
        else {
            continue;
        };
        let inv_end = inv.end_us.unwrap_or(inv.start_us);
        let Outcome::Value(v) = &call.outcome else {
            continue;
        };
        // Named, for whoever reads the finding: the in-process single flight handed this call
        // a value its own process's computation made, begun before the invalidation.
        let follower = match parse_value(v) {
            Some(parts) if call.source == "waited" && parts.instance == call.instance => {
                "; an in-process follower of a computation begun before the invalidation"
            }
            _ => "",
        };
        found.push(violation(
            'h',
            format!(
                "{} call #{} for {} began at {} and got {v} ({}), born by {born_by}, before {} \
                 call #{} {} {} ({}..{inv_end}) invalidated it ({} ms before the call; {tier} \
                 {} ms){follower}",
                call.instance,
                call.id,
                call.key,
                call.start_us,
                call.source,
                inv.instance,
                inv.id,
                inv.op,
                inv.key,
                inv.start_us,
                (call.start_us - inv_end) / 1000,
                bound / 1000,
            ),
        ));
    }
    found
}

/// How rule (h) judged one value a call got.
enum Verdict<'h> {
    /// No invalidation that returned before the call (and the tier's bound) judges its tags.
    Unjudged,
    /// Judged, and born after every such invalidation began.
    Passed,
    /// Born before such an invalidation, whose epochs were all lost on the server since.
    Excused,
    /// Born before such an invalidation, and served all the same.
    Missed {
        invalidation: &'h Call,
        born_by: u64,
        bound: u64,
        tier: &'static str,
    },
}

/// Whether `epoch` was lost on the server between `from` and `to`: a restart, a failover of
/// its key's master, or an eviction of its key (seen within the notification slack): the
/// documented price of an epoch kept in Redis, which rules (h) and (i) excuse.
fn epoch_lost(h: &History, epoch: &Epoch, from: u64, to: u64) -> bool {
    let notification_slack_us = 2 * h.lease_ms * 1000;
    h.restarts_us.iter().any(|at| (from..=to).contains(at))
        || h.failovers
            .iter()
            .any(|f| f.covers(&epoch_tag(epoch), from, to))
        || h.epoch_evictions.iter().any(|(seen, evicted)| {
            evicted == epoch && (from..=to + notification_slack_us).contains(seen)
        })
}

/// Rule (h)'s verdict on every value a call got (see
/// [`no_value_served_after_its_invalidation`]).
fn tag_verdicts(h: &History) -> Vec<(&Call, Verdict<'_>)> {
    let mut invalidations = completed_invalidations(h);
    invalidations.sort_by_key(|(inv, _, _)| inv.start_us);
    let births = Births::of(h);
    let lost = |epoch: &Epoch, from: u64, to: u64| epoch_lost(h, epoch, from, to);
    let mut verdicts = Vec::new();
    for call in &h.calls {
        let (Outcome::Value(v), Some(end)) = (&call.outcome, call.end_us) else {
            continue;
        };
        let Some(parts) = parse_value(v) else {
            continue;
        };
        let Some(born_by) = births.latest(v, &parts) else {
            continue;
        };
        let near = h.near_instances.get(&call.instance).copied().unwrap_or(0);
        let (bound, tier) = match h.held_bounds.get(&call.instance) {
            Some(held) if call.held => (near + held, "serve_while_down + max_staleness"),
            _ if near > 0 => (near, "max_staleness"),
            _ => (0, "no near tier"),
        };
        let judges = |epoch: &Epoch| match epoch {
            Epoch::Clear => true,
            Epoch::Tag(tag) => parts.tags.contains(tag),
        };
        // Whether an invalidation returned (and the tier's bound passed) before the call, and
        // judges the value.
        let judged = |(_, inv_end, epochs): &&(&Call, u64, Vec<Epoch>)| {
            inv_end.saturating_add(bound) < call.start_us && epochs.iter().any(judges)
        };
        // Sorted by start: those begun after the value was born and before the call are the
        // ones it may have missed; any earlier one it passed.
        let born_before = invalidations.partition_point(|(inv, _, _)| inv.start_us <= born_by);
        let call_before = invalidations.partition_point(|(inv, _, _)| inv.start_us < call.start_us);
        let mut verdict = if invalidations[..born_before]
            .iter()
            .rev()
            .any(|i| judged(&i))
        {
            Verdict::Passed
        } else {
            Verdict::Unjudged
        };
        let after_birth = invalidations
            .get(born_before..call_before)
            .unwrap_or_default();
        for (inv, _, epochs) in after_birth.iter().filter(judged) {
            if epochs
                .iter()
                .filter(|e| judges(e))
                .all(|e| lost(e, inv.start_us, end))
            {
                verdict = Verdict::Excused;
                continue;
            }
            verdict = Verdict::Missed {
                invalidation: inv,
                born_by,
                bound,
                tier,
            };
            break;
        }
        verdicts.push((call, verdict));
    }
    verdicts
}

/// Rule (h)'s counts for the run's summary: the values judged (a call got them after an
/// invalidation of one of their tags, or a clear, had returned), and of those, the ones
/// excused by a lost epoch.
pub fn tag_judgements(h: &History) -> (usize, usize) {
    let verdicts = tag_verdicts(h);
    let judged = verdicts
        .iter()
        .filter(|(_, v)| !matches!(v, Verdict::Unjudged))
        .count();
    let excused = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Excused))
        .count();
    (judged, excused)
}

/// Rule (h), the server's side: every tag invalidation or clear that returned `Ok` raised each
/// of its epochs on the server while it ran, to at least the clock at its start, and announced
/// it on the near channel; and an epoch only goes up (a raise is `max(clock, epoch + 1)`),
/// within a server life.
fn invalidations_reach_the_server(h: &History) -> Vec<Violation> {
    let raises: Vec<&Raise> = h
        .server
        .iter()
        .filter_map(|e| match e {
            ServerEvent::Raise(r) => Some(r),
            _ => None,
        })
        .collect();
    let mut found = Vec::new();
    for (inv, end, epochs) in completed_invalidations(h) {
        for epoch in epochs {
            let ran = raises.iter().any(|r| {
                r.epoch == epoch
                    && (inv.start_us..=end).contains(&r.at_us)
                    && r.value >= inv.start_us
                    && r.announced
            });
            if !ran {
                found.push(violation(
                    'h',
                    format!(
                        "{} call #{} {} {} ({}..{end}) returned Ok, but the server raised no \
                         {epoch:?} to at least {} and announced it while it ran",
                        inv.instance, inv.id, inv.op, inv.key, inv.start_us, inv.start_us
                    ),
                ));
            }
        }
    }
    // An epoch only rises within a server life, unless its key was evicted in between (then
    // the next raise starts from its floor: the clock at the raising call's start).
    let slack_us = 2 * h.lease_ms * 1000;
    let evicted = |epoch: &Epoch, from: u64, to: u64| {
        h.epoch_evictions
            .iter()
            .any(|(seen, gone)| gone == epoch && (from..=to + slack_us).contains(seen))
    };
    let mut last: HashMap<&Epoch, (u64, u64)> = HashMap::new();
    for e in &h.server {
        match e {
            ServerEvent::Life(_) => last.clear(),
            ServerEvent::Raise(r) => {
                if let Some((prev, prev_at)) = last.insert(&r.epoch, (r.value, r.at_us)) {
                    if r.value <= prev && !evicted(&r.epoch, prev_at, r.at_us) {
                        let detail = format!(
                            "{:?} raised to {} at {}, not above its {prev}",
                            r.epoch, r.value, r.at_us
                        );
                        // On a cluster: an old master that has not heard it was replaced runs
                        // the raise it had queued from its own, older epoch (guarantees.md,
                        // When the cluster fails over: writes by a replaced master).
                        let failed_over = h
                            .failovers
                            .iter()
                            .any(|f| f.covers(&epoch_tag(&r.epoch), prev_at, r.at_us));
                        found.push(if failed_over {
                            documented_finding('h', "epoch raised by a replaced master", detail)
                        } else {
                            violation('h', detail)
                        });
                    }
                }
            }
            _ => {}
        }
    }
    found
}

/// Rule (h), the values stored: each value the server took records, in its envelope, the tags
/// the worker gave it (its handle's and its computation's) and a birth no later than its
/// computation's start (and than the write itself).
fn stored_values_carry_their_tags(h: &History) -> Vec<Violation> {
    let births = Births::of(h);
    let mut found = Vec::new();
    for e in &h.server {
        let ServerEvent::Write(w) = e else {
            continue;
        };
        let Some(parts) = parse_value(&w.value) else {
            continue;
        };
        let mut stored = w.tags.clone();
        stored.sort();
        if stored != parts.tags {
            found.push(violation(
                'h',
                format!(
                    "key {}: {} stored with the tags {:?}",
                    w.key, w.value, w.tags
                ),
            ));
        }
        let born_by = births.latest(&w.value, &parts).unwrap_or(w.at_us);
        if w.born > born_by {
            found.push(violation(
                'h',
                format!(
                    "key {}: {} stored as born at {}, after its computation or write began ({born_by})",
                    w.key, w.value, w.born
                ),
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
// The tests, on hand-made histories: a good one, and each rule's ways of breaking it.

fn value(key: &str, token: u64, instance: &str) -> String {
    format!("V|{key}|{token}|{instance}|1|-")
}

/// A computed write the server ran at `at_us` (born at 0: unknown, older than any epoch).
fn write(key: &str, token: u64, instance: &str, at_us: u64) -> ServerEvent {
    ServerEvent::Write(Write {
        key: key.into(),
        computed: true,
        token,
        fence: token,
        counter: Some(token),
        value: value(key, token, instance),
        born: 0,
        tags: vec![],
        at_us,
    })
}

fn good_history() -> History {
    let call = |instance: &str, id, start_us, end_us, outcome| Call {
        instance: instance.into(),
        id,
        op: "get_or_compute".into(),
        key: "k0".into(),
        start_us,
        end_us: Some(end_us),
        outcome,
        held: false,
        hit: true,
        source: "hit".into(),
    };
    let section = |instance: &str, token, asked_us, start_us, end_us| Section {
        instance: instance.into(),
        id: token,
        lock: "L0".into(),
        token,
        asked_us,
        start_us,
        end_us,
        writes: 2,
        accepted: 2,
    };
    let ending = |instance: &str| Ending {
        instance: instance.into(),
        killed: false,
        clean_exit: true,
        in_flight: Some(0),
    };
    History {
        calls: vec![
            call("a", 1, 1_000, 30_000, Outcome::Value(value("k0", 10, "a"))),
            // b waited for a's value, which the server accepted.
            call("b", 1, 2_000, 31_000, Outcome::Value(value("k0", 10, "a"))),
            call("b", 2, 40_000, 60_000, Outcome::Error("WaitTimeout".into())),
        ],
        computes: vec![
            Compute {
                instance: "a".into(),
                key: "k0".into(),
                token: 10,
                start_us: 5_000,
                end_us: 25_000,
                value: value("k0", 10, "a"),
            },
            Compute {
                instance: "b".into(),
                key: "k0".into(),
                token: 12,
                start_us: 45_000,
                end_us: 55_000,
                value: value("k0", 12, "b"),
            },
        ],
        sections: vec![
            section("a", 5, 100, 200, 900),
            section("b", 6, 150, 1_000, 2_000),
        ],
        server: vec![
            ServerEvent::Life(0),
            ServerEvent::Acquire {
                key: "L0".into(),
                token: 5,
            },
            ServerEvent::Acquire {
                key: "k0".into(),
                token: 10,
            },
            ServerEvent::Acquire {
                key: "L0".into(),
                token: 6,
            },
            write("k0", 10, "a", 25_000),
            ServerEvent::Bump {
                key: "k0".into(),
                cause: BumpCause::Invalidate,
            },
            ServerEvent::Acquire {
                key: "k0".into(),
                token: 12,
            },
            write("k0", 12, "b", 55_000),
        ],
        restarts_us: vec![],
        lock_evictions: vec![],
        pauses: vec![],
        endings: vec![ending("a"), ending("b")],
        locks_after_run: vec![("chaos:{L0}_lock".into(), 350)],
        locks_after_lease: vec![],
        lease_ms: 400,
        call_bound_us: 40_000,
        // b runs a near tier with a bound of 10 ms; the changes are the writes and the
        // invalidation above, with the times the server ran them.
        near_instances: HashMap::from([("b".to_string(), 10_000)]),
        // b serves what it holds for 20 ms past its last proof while Redis is unreachable.
        held_bounds: HashMap::from([("b".to_string(), 20_000)]),
        changes: vec![
            change(25_000, Some(value("k0", 10, "a"))),
            change(35_000, None),
            change(55_000, Some(value("k0", 12, "b"))),
        ],
        value_evictions: vec![],
        epoch_evictions: vec![],
        failovers: vec![],
    }
}

fn change(at_us: u64, value: Option<String>) -> Change {
    Change {
        key: "k0".into(),
        at_us,
        value,
    }
}

fn rules(violations: &[Violation]) -> HashSet<char> {
    violations.iter().map(|v| v.rule).collect()
}

/// Breaks a good history in one way.
type Breaker = fn(&mut History);

/// Each case, applied to a good history, makes the checker find its rule and no other.
fn assert_each_breaks_only_its_rule(cases: &[(&str, char, Breaker)]) {
    for (what, rule, breaker) in cases {
        let mut h = good_history();
        breaker(&mut h);
        let found = check(&h);
        assert_eq!(
            rules(&found),
            HashSet::from([*rule]),
            "{what}: expected exactly rule ({rule}), got {found:?}"
        );
    }
}

fn checker_passes_a_good_history() {
    let violations = check(&good_history());
    assert!(violations.is_empty(), "{violations:?}");
}

/// Rule (a): overlapping accepted computations or lock sections, and what excuses the latter.
fn checker_rule_a_finds_overlaps_unless_the_lock_was_lost() {
    let cases: &[(&str, char, Breaker)] = &[
        ("two accepted computations overlap", 'a', |h| {
            h.computes[1].start_us = 20_000;
        }),
        ("two accepted lock sections overlap", 'a', |h| {
            h.sections[1].start_us = 800;
        }),
    ];
    assert_each_breaks_only_its_rule(cases);
    // A restart while the earlier acquisition was in flight (granted by the server that then
    // died, so the lock was gone before its holder started) excuses the overlap as well; a
    // restart before it was even requested does not. (Found by a 10,000-round run.)
    let mut h = good_history();
    h.sections[1].start_us = 800;
    h.restarts_us.push(150);
    assert_eq!(check(&h), vec![]);
    let mut h = good_history();
    h.sections[1].start_us = 800;
    h.restarts_us.push(50);
    assert_eq!(rules(&check(&h)), HashSet::from(['a']));
    // Memory pressure: an eviction of the lock's own key between the earlier request and the
    // later grant excuses the overlap, also when its notification is seen a little after that
    // grant (another connection). An eviction of another lock's key, one before the earlier
    // request, or one seen more than two leases after the later grant does not.
    for (evicted, seen_us, excused) in [
        ("L0", 500, true),
        ("L0", 800 + 800_000, true),
        ("L1", 500, false),
        ("L0", 50, false),
        ("L0", 800 + 800_001, false),
    ] {
        let mut h = good_history();
        h.sections[1].start_us = 800;
        h.lock_evictions.push((seen_us, evicted.into()));
        let found = check(&h);
        if excused {
            assert_eq!(found, vec![], "{evicted} evicted at {seen_us}");
        } else {
            assert_eq!(
                rules(&found),
                HashSet::from(['a']),
                "{evicted} evicted at {seen_us}: {found:?}"
            );
        }
    }
    // The later section may belong to the earlier grant (a leader whose first run came late):
    // asked at 60, its key evicted at 80, before the other holder even asked. Excused; an
    // eviction before both requests is not. (Found by a 2,500-round run.)
    for (seen_us, excused) in [(80, true), (40, false)] {
        let mut h = good_history();
        h.sections[1].start_us = 800;
        h.sections[1].asked_us = 60;
        h.lock_evictions.push((seen_us, "L0".into()));
        assert_eq!(check(&h).is_empty(), excused, "evicted at {seen_us}");
    }
}

/// Rule (b): a lower token accepted after a higher one, a lower token granted to a later request.
fn checker_rule_b_finds_tokens_out_of_order() {
    let cases: &[(&str, char, Breaker)] = &[
        ("a lower token accepted after a higher one", 'b', |h| {
            h.server.push(ServerEvent::Acquire {
                key: "k0".into(),
                token: 13,
            });
            let ServerEvent::Write(w) = write("k0", 11, "a", 60_000) else {
                unreachable!()
            };
            h.server.push(ServerEvent::Write(Write {
                counter: Some(13),
                ..w
            }));
        }),
        ("a lock asked after a grant gets a lower token", 'b', |h| {
            h.sections[1].asked_us = 950;
            h.sections[1].token = 4;
        }),
    ];
    assert_each_breaks_only_its_rule(cases);
    // A write the replay could not read cannot be judged: a finding of (b), not fence 0.
    let mut h = good_history();
    h.server.push(ServerEvent::Unreadable {
        key: "k0".into(),
        reason: "no stampede-guard envelope".into(),
    });
    assert_eq!(rules(&check(&h)), HashSet::from(['b']));
}

/// Rule (c): a write or a fenced delete accepted after an invalidation.
fn checker_rule_c_finds_writes_after_an_invalidation() {
    let cases: &[(&str, char, Breaker)] = &[
        ("a fenced delete accepted after an invalidation", 'c', |h| {
            h.server.push(ServerEvent::Bump {
                key: "k0".into(),
                cause: BumpCause::Invalidate,
            });
            h.server.push(ServerEvent::Delete { key: "k0".into() });
        }),
        ("a write accepted after an invalidation", 'c', |h| {
            h.server.insert(
                7,
                ServerEvent::Bump {
                    key: "k0".into(),
                    cause: BumpCause::Invalidate,
                },
            );
        }),
    ];
    assert_each_breaks_only_its_rule(cases);
}

/// Rule (d): calls that hung, took too long or returned a wrong value or error; what excuses them.
fn checker_rule_d_finds_bad_calls_but_excuses_pauses_and_kills() {
    let cases: &[(&str, char, Breaker)] = &[
        ("a call never ended", 'd', |h| {
            h.calls[2].end_us = None;
        }),
        ("a call took longer than its bound", 'd', |h| {
            h.calls[2].end_us = Some(90_000);
        }),
        ("a call returned a value never accepted", 'd', |h| {
            h.calls[1].outcome = Outcome::Value(value("k0", 11, "a"));
        }),
        (
            "a call returned its own process's value that was never computed",
            'd',
            |h| {
                h.calls[0].outcome = Outcome::Value(value("k0", 11, "a"));
            },
        ),
        ("a call returned another key's value", 'd', |h| {
            h.calls[0].outcome = Outcome::Value(value("k1", 10, "a"));
        }),
        ("a call failed with an unexpected error", 'd', |h| {
            h.calls[2].outcome = Outcome::Error("InvalidKey".into());
        }),
    ];
    assert_each_breaks_only_its_rule(cases);
    // What the rules excuse: a pause is not counted against a call's bound, an unfinished call
    // of a killed process is not a hang, and lock sections on both sides of a server restart may
    // overlap (the restart lost the lock; the fencing token still orders their writes).
    let mut h = good_history();
    h.calls[2].end_us = Some(90_000);
    h.pauses.push(Pause {
        instance: "b".into(),
        from_us: 45_000,
        to_us: 85_000,
    });
    h.calls[0].end_us = None;
    h.endings[0].killed = true;
    h.sections[1].start_us = 800;
    h.restarts_us.push(500);
    assert_eq!(check(&h), vec![]);
}

/// Rule (e): in-process entries or lock keys left after the run.
fn checker_rule_e_finds_what_was_stranded() {
    let cases: &[(&str, char, Breaker)] = &[
        ("an in-process entry was left", 'e', |h| {
            h.endings[0].in_flight = Some(1);
        }),
        ("a lock key without expiry", 'e', |h| {
            h.locks_after_run[0].1 = -1;
        }),
        ("a lock key outlived its lease", 'e', |h| {
            h.locks_after_lease.push("chaos:{L0}_lock".into());
        }),
    ];
    assert_each_breaks_only_its_rule(cases);
}

/// Rule (f) on hand-made histories: b (near tier, bound 10 ms) gets k0's value of token 10
/// after the invalidation the server ran at 35 ms.
fn checker_holds_near_reads_to_max_staleness() {
    let read_at = |start_us: u64| {
        let mut h = good_history();
        h.calls.push(Call {
            instance: "b".into(),
            id: 3,
            op: "get_or_compute".into(),
            key: "k0".into(),
            start_us,
            end_us: Some(start_us + 100),
            outcome: Outcome::Value(value("k0", 10, "a")),
            held: false,
            hit: true,
            source: "hit".into(),
        });
        h
    };
    // Within the bound (the invalidation ran 5 ms before the call, or at its very bound).
    assert_eq!(check(&read_at(40_000)), vec![]);
    assert_eq!(check(&read_at(45_000)), vec![]);
    // Beyond it: one violation, of rule (f) only.
    let found = check(&read_at(45_001));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(rules(&found), HashSet::from(['f']));
    // Also older than the next write: still one violation for the call.
    assert_eq!(check(&read_at(70_000)).len(), 1);
    // The same value got by following this process's flight (`Waited`): its leader read it,
    // maybe before this call began (a computation, a paused process); no near copy is served
    // that way, so rule (f) does not judge it.
    let mut h = read_at(70_000);
    h.calls[3].hit = false;
    assert_eq!(check(&h), vec![]);
    // The same value returned to a, which runs no near tier, came from Redis: not judged.
    let mut h = read_at(50_000);
    h.calls[3].instance = "a".into();
    assert_eq!(check(&h), vec![]);
    // Every instance announces, so the change counts whoever asked for it: a value older than
    // a write the server ran long enough before the call is stale too.
    let mut h = read_at(70_000);
    h.changes.remove(1);
    assert_eq!(rules(&check(&h)), HashSet::from(['f']));
    // Redis evicted the value after it was written, and a computed write filled the key again:
    // no excuse (tracking reports both), whenever the eviction was seen.
    for seen_us in [30_000, 70_000 + 800_000, 20_000] {
        let mut h = read_at(70_000);
        h.changes.remove(1);
        h.value_evictions.push((seen_us, "k0".into()));
        assert_eq!(
            rules(&check(&h)),
            HashSet::from(['f']),
            "evicted at {seen_us}"
        );
    }
    // A value the server never took (the caller's own computation, refused) is not a copy.
    let mut h = read_at(50_000);
    h.changes.remove(0);
    assert_eq!(check(&h), vec![]);
}

/// Rule (i) on hand-made histories: b's invalidation of k0 (and then its clear) was queued
/// at 30..32 ms; b reads k0 at 40 ms.
fn checker_rule_i_finds_reads_that_beat_a_queued_write() {
    let with = |op: &str, key: &str, source: &str| {
        let mut h = good_history();
        // The invalidation the server ran at 35 ms was a's: no value after it is read here.
        h.changes.truncate(1);
        let queued = Call {
            instance: "b".into(),
            id: 7,
            op: op.into(),
            key: key.into(),
            start_us: 30_000,
            end_us: Some(32_000),
            outcome: Outcome::Queued,
            held: false,
            hit: false,
            source: String::new(),
        };
        let read = Call {
            id: 8,
            op: "get_or_compute".into(),
            key: "k0".into(),
            start_us: 40_000,
            end_us: Some(41_000),
            outcome: Outcome::Value(value("k0", 10, "a")),
            hit: source == "hit",
            source: source.into(),
            ..queued.clone()
        };
        h.calls.push(queued);
        h.calls.push(read);
        h.calls.remove(2);
        h
    };
    // The value the server held since 25 ms, read after the queued write returned: found.
    for (op, key) in [("invalidate", "k0"), ("set", "k0"), ("clear", "*")] {
        let found = check(&with(op, key, "hit"));
        assert_eq!(rules(&found), HashSet::from(['i']), "{op}: {found:?}");
    }
    // Another key's write, a tag the value does not carry, a follower's value: not judged.
    assert_eq!(check(&with("invalidate", "k1", "hit")), vec![]);
    assert_eq!(check(&with("invalidate_tag", "t0", "hit")), vec![]);
    assert_eq!(check(&with("invalidate", "k0", "waited")), vec![]);
    // Another instance may read it until the replay: its own promise is its instance's.
    let mut h = with("invalidate", "k0", "hit");
    if let Some(read) = h.calls.last_mut() {
        read.instance = "a".into();
    }
    assert_eq!(check(&h), vec![]);
    // A clear's epoch lost with a restart in between excuses the read, up to the read's end
    // (its epochs may have been read after the restart), not after it.
    for (restart_us, excused) in [(36_000, true), (40_500, true), (41_001, false)] {
        let mut h = with("clear", "*", "hit");
        h.restarts_us.push(restart_us);
        let found = rules(&check(&h)).contains(&'i');
        assert_eq!(found, !excused, "restart at {restart_us}");
    }
    // A key's write undone by a failover of its master before the read ended: counted apart;
    // a failover of another master, or after the read, excuses nothing.
    for (tag, at_us, counted) in [
        ("k0", 36_000, true),
        ("k1", 36_000, false),
        ("k0", 41_001, false),
    ] {
        let mut h = with("invalidate", "k0", "hit");
        h.failovers.push(FailoverWindow {
            from_us: at_us,
            to_us: at_us,
            kind: "replica_lag".into(),
            tags: vec![tag.into()],
        });
        assert_eq!(check(&h).is_empty(), counted, "{tag} at {at_us}");
        assert_eq!(
            documented(&h).len(),
            usize::from(counted),
            "{tag} at {at_us}"
        );
    }
}

/// Rule (g) on hand-made histories: b (near tier, `max_staleness` 10 ms, `serve_while_down`
/// 20 ms) is served k0's value of token 10 from a held copy after the invalidation the server
/// ran at 35 ms: allowed up to 30 ms after it, where rule (f) allows 10 ms.
fn checker_holds_held_reads_to_the_relaxed_bound() {
    let held_read_at = |start_us: u64| {
        let mut h = good_history();
        h.calls.push(Call {
            instance: "b".into(),
            id: 3,
            op: "get_or_compute".into(),
            key: "k0".into(),
            start_us,
            end_us: Some(start_us + 100),
            outcome: Outcome::Value(value("k0", 10, "a")),
            held: true,
            hit: false,
            source: "held".into(),
        });
        h
    };
    // Inside the relaxed bound, though beyond max_staleness (rule (f) would find it stale): no
    // violation, up to the bound itself.
    assert_eq!(check(&held_read_at(50_000)), vec![]);
    assert_eq!(check(&held_read_at(65_000)), vec![]);
    // Beyond it: exactly one violation, of rule (g) only.
    let found = check(&held_read_at(65_001));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(rules(&found), HashSet::from(['g']));
    // Only held reads get the relaxed bound: the same read not held is rule (f)'s, and stale.
    let mut h = held_read_at(50_000);
    h.calls[3].held = false;
    h.calls[3].hit = true;
    assert_eq!(rules(&check(&h)), HashSet::from(['f']));
    // The bound is the instance's own: with a 5 ms bound (15 ms in all), 16 ms is too late.
    let mut h = held_read_at(51_000);
    h.held_bounds.insert("b".into(), 5_000);
    assert_eq!(rules(&check(&h)), HashSet::from(['g']));
    // A held value returned to an instance that does not serve while down is a finding, even
    // a fresh one.
    let mut h = held_read_at(36_000);
    h.held_bounds.clear();
    assert_eq!(rules(&check(&h)), HashSet::from(['g']));
    // No excuse for an eviction: the fill after it counts (tracking reports it).
    let mut h = held_read_at(90_000);
    h.changes.remove(1);
    h.value_evictions.push((30_000, "k0".into()));
    assert_eq!(rules(&check(&h)), HashSet::from(['g']));
}

/// Adds a tag invalidation or clear by `a` (`op`, its tags in the key's place, `*` for a
/// clear) that ran from `start_us` to `end_us`, and the raises the server ran for it.
fn invalidated(h: &mut History, op: &str, key: &str, start_us: u64, end_us: u64) {
    let call = Call {
        instance: "a".into(),
        id: 100 + h.calls.len() as u64,
        op: op.into(),
        key: key.into(),
        start_us,
        end_us: Some(end_us),
        outcome: Outcome::Done,
        held: false,
        hit: false,
        source: String::new(),
    };
    for epoch in raised_by(&call).expect("an invalidation") {
        h.server.push(ServerEvent::Raise(Raise {
            epoch,
            value: start_us + 1,
            at_us: (start_us + end_us) / 2,
            announced: true,
        }));
    }
    h.calls.push(call);
}

/// Raises t1 to 40 ms (at 32–33 ms), then to 34 ms (at 34–35 ms), in a new server life or not.
fn raised_twice(h: &mut History, new_life: bool) {
    invalidated(h, "invalidate_tag", "t1", 32_000, 33_000);
    if let Some(ServerEvent::Raise(r)) = h.server.last_mut() {
        r.value = 40_000;
    }
    if new_life {
        h.server.push(ServerEvent::Life(1));
    }
    invalidated(h, "invalidate_tag", "t1", 34_000, 35_000);
}

/// Adds a call of `instance` that began at `start_us` and got `v` from `source`.
fn served(h: &mut History, instance: &str, start_us: u64, v: &str, source: &str) {
    h.calls.push(Call {
        instance: instance.into(),
        id: 200 + h.calls.len() as u64,
        op: "get_or_compute".into(),
        key: "k0".into(),
        start_us,
        end_us: Some(start_us + 100),
        outcome: Outcome::Value(v.into()),
        held: source == "held",
        hit: source == "hit",
        source: source.into(),
    });
}

/// Gives a's value of token 10 the tags `label` (as the worker writes them) everywhere.
fn retag(h: &mut History, label: &str) -> String {
    let (old, new) = (value("k0", 10, "a"), format!("V|k0|10|a|1|{label}"));
    for c in &mut h.calls {
        if c.outcome == Outcome::Value(old.clone()) {
            c.outcome = Outcome::Value(new.clone());
        }
    }
    for c in h.computes.iter_mut().filter(|c| c.value == old) {
        c.value = new.clone();
    }
    for c in h
        .changes
        .iter_mut()
        .filter(|c| c.value == Some(old.clone()))
    {
        c.value = Some(new.clone());
    }
    for e in &mut h.server {
        if let ServerEvent::Write(w) = e {
            if w.value == old {
                w.value = new.clone();
                w.tags = parse_value(&new).expect("a worker's value").tags;
            }
        }
    }
    new
}

/// Rule (h) on hand-made histories: a's value of token 10 was computed from 5 ms (born by
/// then) and b's of token 12 from 45 ms; a clear or a tag invalidation runs at 32–33 ms.
fn checker_rule_h_finds_values_served_after_their_invalidation() {
    let v10 = value("k0", 10, "a");
    let cleared = || {
        let mut h = good_history();
        invalidated(&mut h, "clear", "*", 32_000, 33_000);
        h
    };
    let only_h = |h: &History, what: &str| {
        let found = check(h);
        assert_eq!(found.len(), 1, "{what}: {found:?}");
        assert_eq!(rules(&found), HashSet::from(['h']), "{what}");
    };
    assert_eq!(check(&cleared()), vec![]);
    // Without a near tier, from the moment the clear returned; a call begun before is not
    // judged (it may have read before the raise).
    let mut h = cleared();
    served(&mut h, "a", 33_000, &v10, "hit");
    assert_eq!(check(&h), vec![]);
    let mut h = cleared();
    served(&mut h, "a", 33_001, &v10, "hit");
    only_h(&h, "a hit after the clear");
    // Whatever the path: an in-process follower too (its flight began before).
    let mut h = cleared();
    served(&mut h, "a", 34_000, &v10, "waited");
    only_h(&h, "a follower after the clear");
    // A near tier (b: 10 ms) is allowed its max_staleness, a held copy its serve_while_down
    // (20 ms) on top.
    for (source, start_us, ok) in [
        ("hit", 43_000, true),
        ("hit", 43_001, false),
        ("held", 63_000, true),
        ("held", 63_001, false),
    ] {
        let mut h = cleared();
        served(&mut h, "b", start_us, &v10, source);
        if ok {
            assert_eq!(check(&h), vec![], "{source} at {start_us}");
        } else {
            only_h(&h, &format!("{source} at {start_us}"));
        }
    }
    // A value whose computation began after the invalidation began is not proven older: b's
    // value of token 12 (from 45 ms) after a clear at 40–41 ms passes, after one at 46–47 ms
    // does not. So does the value a call computed itself.
    let v12 = value("k0", 12, "b");
    let mut h = good_history();
    invalidated(&mut h, "clear", "*", 40_000, 41_000);
    served(&mut h, "a", 60_000, &v12, "hit");
    assert_eq!(check(&h), vec![]);
    let mut h = good_history();
    invalidated(&mut h, "clear", "*", 46_000, 47_000);
    served(&mut h, "a", 60_000, &v12, "hit");
    only_h(&h, "a value computed before the clear began");
    // Tags: only an invalidation of one of the value's tags judges it.
    for (tags, invalidation, ok) in [
        ("-", "t1", true),
        ("t1+t2", "t2", false),
        ("t1+t2", "t0+t3", true),
        ("t1+t2", "t0+t1", false),
    ] {
        let mut h = good_history();
        let v = retag(&mut h, tags);
        let op = if invalidation.contains('+') {
            "invalidate_tags"
        } else {
            "invalidate_tag"
        };
        invalidated(&mut h, op, invalidation, 32_000, 33_000);
        served(&mut h, "a", 34_000, &v, "hit");
        if ok {
            assert_eq!(check(&h), vec![], "{tags} after {invalidation}");
        } else {
            only_h(&h, &format!("{tags} after {invalidation}"));
        }
    }
    // A value `set` before (its set ended at 20 ms, the server wrote it at 21 ms).
    let mut h = cleared();
    let set = "S|k0|a|7|-";
    h.calls.push(Call {
        instance: "a".into(),
        id: 7,
        op: "set".into(),
        key: "k0".into(),
        start_us: 19_000,
        end_us: Some(20_000),
        outcome: Outcome::Done,
        held: false,
        hit: false,
        source: String::new(),
    });
    h.server.insert(
        5,
        ServerEvent::Write(Write {
            key: "k0".into(),
            computed: false,
            token: 0,
            fence: 0,
            counter: None,
            value: set.into(),
            born: 19_500,
            tags: vec![],
            at_us: 21_000,
        }),
    );
    assert_eq!(check(&h), vec![]);
    served(&mut h, "a", 34_000, set, "hit");
    only_h(&h, "a set value after the clear");
    // A lost epoch brings the values back: a restart or a flush after the invalidation began
    // excuses; one before it does not. So does an eviction of each epoch that judges the
    // value, not of another.
    for restart_us in [32_500, 34_050] {
        let mut h = cleared();
        served(&mut h, "a", 34_000, &v10, "hit");
        h.restarts_us.push(restart_us);
        assert_eq!(check(&h), vec![], "restart at {restart_us}");
    }
    let mut h = cleared();
    served(&mut h, "a", 34_000, &v10, "hit");
    h.restarts_us.push(31_000);
    only_h(&h, "a restart before the clear");
    for (evicted, excused) in [
        (vec![Epoch::Clear], true),
        (vec![Epoch::Tag("t1".into())], false),
    ] {
        let mut h = cleared();
        served(&mut h, "a", 34_000, &v10, "hit");
        h.epoch_evictions = evicted.iter().map(|e| (33_500, e.clone())).collect();
        assert_eq!(check(&h).is_empty(), excused, "{evicted:?} evicted");
    }
    for (evicted, excused) in [(vec!["t1"], false), (vec!["t1", "t2"], true)] {
        let mut h = good_history();
        let v = retag(&mut h, "t1+t2");
        invalidated(&mut h, "invalidate_tags", "t1+t2", 32_000, 33_000);
        served(&mut h, "a", 34_000, &v, "hit");
        h.epoch_evictions = evicted
            .iter()
            .map(|t| (33_500, Epoch::Tag(t.to_string())))
            .collect();
        assert_eq!(check(&h).is_empty(), excused, "{evicted:?} evicted");
    }
}

/// Rule (h), the server's side: an invalidation that returned `Ok` without the server raising
/// (and announcing) each of its epochs while it ran, an epoch that went down, and values
/// stored with other tags or a later birth than their computation's start.
fn checker_rule_h_holds_the_server_to_the_invalidations() {
    let cases: &[(&str, char, Breaker)] = &[
        ("a clear the server never ran", 'h', |h| {
            invalidated(h, "clear", "*", 32_000, 33_000);
            h.server.pop();
        }),
        ("a raise after the call returned", 'h', |h| {
            invalidated(h, "invalidate_tag", "t1", 32_000, 33_000);
            let Some(ServerEvent::Raise(r)) = h.server.last_mut() else {
                unreachable!()
            };
            r.at_us = 33_001;
        }),
        ("a raise below the clock at the call's start", 'h', |h| {
            invalidated(h, "invalidate_tag", "t1", 32_000, 33_000);
            let Some(ServerEvent::Raise(r)) = h.server.last_mut() else {
                unreachable!()
            };
            r.value = 31_999;
        }),
        ("a raise not announced", 'h', |h| {
            invalidated(h, "invalidate_tag", "t1", 32_000, 33_000);
            let Some(ServerEvent::Raise(r)) = h.server.last_mut() else {
                unreachable!()
            };
            r.announced = false;
        }),
        ("one tag of two raised", 'h', |h| {
            invalidated(h, "invalidate_tags", "t1+t2", 32_000, 33_000);
            h.server.pop();
        }),
        ("an epoch that went down", 'h', |h| {
            raised_twice(h, false);
        }),
        ("a value stored without its tags", 'h', |h| {
            retag(h, "t1");
            let ServerEvent::Write(w) = &mut h.server[4] else {
                unreachable!()
            };
            w.tags.clear();
        }),
        (
            "a value stored as born after its computation began",
            'h',
            |h| {
                let ServerEvent::Write(w) = &mut h.server[4] else {
                    unreachable!()
                };
                w.born = 5_001;
            },
        ),
    ];
    assert_each_breaks_only_its_rule(cases);
    // An epoch starts over in a new life (a restart, a flush).
    let mut h = good_history();
    raised_twice(&mut h, true);
    assert_eq!(check(&h), vec![]);
    // On a cluster: an epoch that went down while its master failed over is a documented kind
    // (a replaced master ran the raise it had queued); another epoch's failover excuses nothing.
    for (tags, excused) in [(&["%t:t1"][..], true), (&["%t:t2"][..], false)] {
        let mut h = good_history();
        raised_twice(&mut h, false);
        h.failovers.push(FailoverWindow {
            from_us: 33_500,
            to_us: 34_500,
            kind: "master_pause".into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        });
        assert_eq!(check(&h).is_empty(), excused, "{tags:?}");
        assert_eq!(documented(&h).len(), usize::from(excused), "{tags:?}");
    }
    // Born at the computation's very start is fine.
    let mut h = good_history();
    let ServerEvent::Write(w) = &mut h.server[4] else {
        unreachable!()
    };
    w.born = 5_000;
    assert_eq!(check(&h), vec![]);
}

/// On a cluster: a token handed out twice because the failover lost its first acquisition
/// (the replay's [`Rollback`] lists it) makes two accepted holders and two writes under one
/// token: counted as documented kinds, not violations; the same history without that proof is
/// two violations. So is a lock token below one an old master granted and lost. Lock sections that overlap across a failover of their key's master are
/// counted; across a failover of another master they are a violation. A write under an
/// acquisition the new master may not have (its counter at the switch unproven) is counted.
fn checker_counts_what_a_failover_may_break_and_nothing_else() {
    let compute = |instance: &str, start_us, end_us| Compute {
        instance: instance.into(),
        key: "k0".into(),
        token: 10,
        start_us,
        end_us,
        value: value("k0", 10, instance),
    };
    let rollback = |to: Option<u64>, lost: Vec<(u64, &'static str)>| {
        ServerEvent::Rollback(Rollback {
            key: "k0".into(),
            at_us: 20_000,
            to,
            reseeded: false,
            raised: false,
            from: Some(10),
            lost,
            survivor: to.map(|t| (Some(t), "acquisition")),
        })
    };
    let acquire = |token| ServerEvent::Acquire {
        key: "k0".into(),
        token,
    };
    let reissued = |lost: Vec<(u64, &'static str)>| History {
        computes: vec![compute("a", 5_000, 25_000), compute("b", 20_000, 27_000)],
        server: vec![
            ServerEvent::Life(0),
            acquire(9),
            // a's acquisition on the old master, which the new master never had.
            acquire(10),
            rollback(Some(9), lost),
            // b's, on the new master: the same token.
            acquire(10),
            write("k0", 10, "b", 28_000),
            write("k0", 10, "a", 29_000),
        ],
        lease_ms: 400,
        call_bound_us: 40_000,
        ..History::default()
    };
    let h = reissued(vec![(10, "acquisition")]);
    assert_eq!(check(&h), vec![]);
    let kinds = documented_kinds(&documented(&h));
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        vec![
            (
                "(a) two holders of a token reissued after a failover".to_string(),
                1
            ),
            (
                "(b) a second write under a token reissued after a failover".to_string(),
                1
            ),
        ]
    );
    let h = reissued(vec![]);
    assert_eq!(rules(&check(&h)), HashSet::from(['a', 'b']));
    assert_eq!(documented(&h), vec![]);

    // Lock sections overlapping while their key's master failed over; another master's
    // failover excuses nothing.
    for (tags, excused) in [(vec!["L0"], true), (vec!["L1"], false)] {
        let mut h = good_history();
        h.sections[1].start_us = 800;
        h.failovers.push(FailoverWindow {
            from_us: 120,
            to_us: 900,
            kind: "master_kill".into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        });
        assert_eq!(check(&h).is_empty(), excused, "{tags:?}");
        assert_eq!(documented(&h).len(), usize::from(excused), "{tags:?}");
    }

    // An old master that granted the lock after its replica took over (token 50, lost with
    // it) is above the new master's next token (6): counted when the replay proves it lost.
    for (lost, excused) in [(vec![(50, "acquisition")], true), (vec![], false)] {
        let mut h = good_history();
        h.sections[0].token = 50;
        h.sections[1].asked_us = 950;
        h.server.push(ServerEvent::Rollback(Rollback {
            key: "L0".into(),
            at_us: 60_000,
            to: Some(5),
            reseeded: false,
            raised: false,
            from: Some(50),
            lost: lost.clone(),
            survivor: Some((Some(5), "acquisition")),
        }));
        assert_eq!(check(&h).is_empty(), excused, "{lost:?}");
        assert_eq!(documented(&h).len(), usize::from(excused), "{lost:?}");
    }

    // A holder whose acquisition (11) and write were lost with the old master, overlapping
    // one whose grant (10) the new master still had, and whose write it then took: counted
    // (rule (a)), and the survivor's write is no repeat (rule (b)). Unproven: violations.
    let resurrected = |lost: Vec<(u64, &'static str)>| {
        let b = Compute {
            token: 11,
            start_us: 12_000,
            end_us: 18_000,
            value: value("k0", 11, "b"),
            ..compute("b", 0, 0)
        };
        History {
            computes: vec![compute("a", 5_000, 30_000), b],
            server: vec![
                ServerEvent::Life(0),
                acquire(10),
                acquire(11),
                write("k0", 11, "b", 19_000),
                rollback(Some(10), lost),
                write("k0", 10, "a", 31_000),
            ],
            lease_ms: 400,
            call_bound_us: 40_000,
            ..History::default()
        }
    };
    let h = resurrected(vec![(11, "acquisition")]);
    assert_eq!(check(&h), vec![]);
    assert_eq!(
        documented_kinds(&documented(&h))
            .into_iter()
            .collect::<Vec<_>>(),
        vec![(
            "(a) a holder whose acquisition a failover lost".to_string(),
            1
        )]
    );
    assert_eq!(rules(&check(&resurrected(vec![]))), HashSet::from(['a']));

    // A write after a switch whose counter the replay could not prove: counted.
    let h = History {
        server: vec![
            ServerEvent::Life(0),
            acquire(7),
            rollback(None, vec![]),
            write("k0", 7, "a", 29_000),
        ],
        lease_ms: 400,
        call_bound_us: 40_000,
        ..History::default()
    };
    assert_eq!(check(&h), vec![]);
    assert_eq!(documented(&h).len(), 1);
}
