//! What a call does when something fails: one table, [`decide`], for every failure class
//! ([`Failure`]) and every fallback a call may have at hand ([`AtHand`]). Every step that meets
//! a failure (the single-key path, the batch, the wait-or-lock loop, the computation under the
//! lock, `get` and `set`) asks it, and does what its [`Answer`] says.
//!
//! The table "What a call does when something fails" in `docs/guarantees.md` is its
//! documentation; a test below reads that table and fails when the two disagree.

use crate::error::{BackendErrorKind, Error};
use crate::store::StoreError;

/// A failure a call can meet, by what it allows the call to do instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The backend cannot be reached or cannot answer now (unreachable, busy; the circuit
    /// breaker open; Redlock without a quorum): an outage, which passes.
    BackendDown,
    /// Redis's memory is full (`OOM` under `noeviction`): reads work, the lock cannot be taken.
    BackendFull,
    /// Too few replicas acknowledged a lock or fencing write: a replica is down or lagging.
    TooFewReplicas,
    /// Any other backend failure (an unexpected reply, an unknown error code).
    BackendOther,
    /// Redis refused (by permission, by role, or a key of another type): a configuration
    /// error, which no fallback may hide.
    BackendRefused,
    /// The computation (`f`) returned an error.
    SourceFailed,
    /// The computation ran into its hard timeout (`max_hold`) and was cancelled.
    HardTimeout,
    /// The wait for another caller's computation outlasted the wait bound (`wait_timeout`).
    WaitTimeout,
    /// The call reached its soft timeout, computing or waiting.
    SoftTimeout,
}

impl Failure {
    /// The class of a backend failure of `kind`.
    pub(crate) fn of_kind(kind: BackendErrorKind) -> Self {
        match kind {
            BackendErrorKind::Unreachable | BackendErrorKind::Busy => Failure::BackendDown,
            BackendErrorKind::OutOfMemory => Failure::BackendFull,
            BackendErrorKind::TooFewReplicas => Failure::TooFewReplicas,
            BackendErrorKind::Other => Failure::BackendOther,
            BackendErrorKind::RefusedPermission
            | BackendErrorKind::RefusedRole
            | BackendErrorKind::WrongType => Failure::BackendRefused,
        }
    }

    /// The class of a store's failure.
    pub(crate) fn of_store(error: &StoreError) -> Self {
        Failure::of_kind(error.kind())
    }

    /// The class of a call's error, or `None` for an error that is no failure the table knows
    /// (a bug of the caller's: a key, an encoding, a tag), which no fallback answers.
    pub(crate) fn of(error: &Error) -> Option<Self> {
        match error {
            Error::Compute(_) => Some(Failure::SourceFailed),
            Error::ComputeTimeout { .. } => Some(Failure::HardTimeout),
            Error::WaitTimeout { .. } => Some(Failure::WaitTimeout),
            other => other.backend_kind().map(Failure::of_kind),
        }
    }

    /// Whether a copy held while the backend is down answers this failure: only then is the
    /// near tier asked for one (a copy it hands out is counted as served).
    pub(crate) fn serves_held(self) -> bool {
        let held = AtHand {
            held: true,
            ..AtHand::default()
        };
        decide(self, held) == Answer::ServeHeld
    }
}

/// The fallbacks a call has at hand when it meets a failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AtHand {
    /// A near copy held while the backend is down (`NearCacheOptions::serve_while_down`).
    pub(crate) held: bool,
    /// A value the fail-safe kept past its stale window (`fail_safe_for`), or its throttled copy.
    pub(crate) kept: bool,
    /// [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached).
    pub(crate) uncached: bool,
    /// Negative caching (`negative_ttl` set).
    pub(crate) negative: bool,
}

impl AtHand {
    /// Only a fail-safe value, if `kept`: what a computation or a wait has when it ends.
    pub(crate) fn kept(kept: bool) -> Self {
        AtHand {
            kept,
            ..AtHand::default()
        }
    }
}

/// What a call does about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Serves the held near copy ([`Source::Held`](crate::Source::Held)).
    ServeHeld,
    /// Serves the fail-safe's kept value ([`Source::FailSafe`](crate::Source::FailSafe)); after
    /// a failed or cut computation, its throttled copy is written.
    ServeKept,
    /// Computes without the cache ([`Source::Uncached`](crate::Source::Uncached)); `get` reads
    /// a miss, `set` skips its write.
    ComputeUncached,
    /// Fails with the error, and the failure is written for `negative_ttl`.
    Remember,
    /// Fails with the error.
    Fail,
    /// Goes on computing or waiting, as if nothing happened.
    GoOn,
}

/// What a call does about `failure` with `has` at hand. Read it as the table in
/// `docs/guarantees.md`: the fallbacks are tried left to right (held copy, fail-safe value,
/// computing uncached, negative caching), the first one at hand that answers the failure wins,
/// and with none the call fails (or, at a soft timeout, goes on).
pub(crate) fn decide(failure: Failure, has: AtHand) -> Answer {
    use Failure::*;
    match failure {
        // An outage: a copy held from before it, else the source without the cache.
        BackendDown if has.held => Answer::ServeHeld,
        BackendDown | BackendFull | TooFewReplicas | BackendOther if has.uncached => {
            Answer::ComputeUncached
        }
        // A refusal is a configuration error: surfaced whatever the fallback.
        BackendDown | BackendFull | TooFewReplicas | BackendOther | BackendRefused => Answer::Fail,
        // The fail-safe's value lives in the backend: it answers the source, not the backend.
        SourceFailed | HardTimeout | WaitTimeout | SoftTimeout if has.kept => Answer::ServeKept,
        // A hard timeout is never remembered: the source may answer the next call in time.
        SourceFailed if has.negative => Answer::Remember,
        SourceFailed | HardTimeout | WaitTimeout => Answer::Fail,
        // A soft timeout is only a budget: without a fallback it cuts nothing.
        SoftTimeout => Answer::GoOn,
    }
}

/// The table against its documentation, cell by cell.
#[cfg(test)]
mod tests {
    use super::*;

    /// The documentation of [`decide`].
    const GUARANTEES: &str = include_str!("../../docs/guarantees.md");

    /// The heading of the table.
    const HEADING: &str = "## What a call does when something fails";

    /// The table's columns: the failure, the fallbacks in the order they are tried (as in
    /// [`with`]), and the answer with none at hand.
    const COLUMNS: [&str; 6] = [
        "failure",
        "a held near copy",
        "a fail-safe value",
        "`ComputeUncached`",
        "negative caching",
        "none of these",
    ];

    /// The failure a row is about, by its first cell.
    fn failure(row: &str) -> Failure {
        match row {
            "Redis unreachable or busy" => Failure::BackendDown,
            "Redis out of memory" => Failure::BackendFull,
            "too few replicas" => Failure::TooFewReplicas,
            "another Redis error" => Failure::BackendOther,
            "Redis refuses (permission, role, wrong type)" => Failure::BackendRefused,
            "`f` returns an error" => Failure::SourceFailed,
            "the hard timeout (`max_hold`)" => Failure::HardTimeout,
            "the wait bound (`wait_timeout`)" => Failure::WaitTimeout,
            "the soft timeout" => Failure::SoftTimeout,
            other => panic!("a row of an unknown failure: {other:?}"),
        }
    }

    /// Every failure once: a new one fails to compile here until the table has its row.
    fn every_failure() -> Vec<Failure> {
        let all = [
            Failure::BackendDown,
            Failure::BackendFull,
            Failure::TooFewReplicas,
            Failure::BackendOther,
            Failure::BackendRefused,
            Failure::SourceFailed,
            Failure::HardTimeout,
            Failure::WaitTimeout,
            Failure::SoftTimeout,
        ];
        for failure in all {
            match failure {
                Failure::BackendDown
                | Failure::BackendFull
                | Failure::TooFewReplicas
                | Failure::BackendOther
                | Failure::BackendRefused
                | Failure::SourceFailed
                | Failure::HardTimeout
                | Failure::WaitTimeout
                | Failure::SoftTimeout => {}
            }
        }
        all.to_vec()
    }

    /// What a cell says: an answer, or `None` ("—": this fallback does not answer the row).
    fn answer(cell: &str) -> Option<Answer> {
        match cell {
            "—" => None,
            "the held copy" => Some(Answer::ServeHeld),
            "the fail-safe value" => Some(Answer::ServeKept),
            "computed uncached" => Some(Answer::ComputeUncached),
            "the error, remembered" => Some(Answer::Remember),
            "the error" => Some(Answer::Fail),
            "waits on" => Some(Answer::GoOn),
            other => panic!("a cell the table does not define: {other:?}"),
        }
    }

    /// The fallbacks at hand: bit `i` of `mask` is the `i`-th fallback column.
    fn with(mask: u8) -> AtHand {
        AtHand {
            held: mask & 1 != 0,
            kept: mask & 2 != 0,
            uncached: mask & 4 != 0,
            negative: mask & 8 != 0,
        }
    }

    /// The table's rows, each cell trimmed, the header first.
    fn table() -> Vec<Vec<String>> {
        let start = GUARANTEES
            .find(HEADING)
            .expect("docs/guarantees.md has the table of decide");
        GUARANTEES[start..]
            .lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .filter(|line| !line.starts_with("|---"))
            .map(|line| {
                let line = line.trim().trim_start_matches('|').trim_end_matches('|');
                line.split('|').map(|cell| cell.trim().to_owned()).collect()
            })
            .collect()
    }

    #[test]
    fn the_table_in_the_docs_is_what_decide_does() {
        let table = table();
        let (header, rows) = table.split_first().expect("a header");
        assert_eq!(header, &COLUMNS, "the columns, in the order they are tried");
        let mut seen = Vec::new();
        for row in rows {
            assert_eq!(row.len(), COLUMNS.len(), "row {row:?}");
            let failure = failure(&row[0]);
            let fallbacks: Vec<Option<Answer>> = row[1..5].iter().map(|c| answer(c)).collect();
            let otherwise = answer(&row[5]).expect("an answer with nothing at hand");
            for mask in 0..16u8 {
                let has = with(mask);
                // The first fallback at hand that answers the failure, left to right.
                let expected = (0..4)
                    .filter(|&i| mask & (1 << i) != 0)
                    .find_map(|i| fallbacks[i])
                    .unwrap_or(otherwise);
                assert_eq!(
                    decide(failure, has),
                    expected,
                    "row {:?} with {has:?} at hand",
                    row[0]
                );
            }
            seen.push(failure);
        }
        assert_eq!(seen, every_failure(), "one row per failure, in this order");
    }

    #[test]
    fn computes_uncached_says_what_the_table_does() {
        let kinds = [
            BackendErrorKind::Unreachable,
            BackendErrorKind::RefusedPermission,
            BackendErrorKind::RefusedRole,
            BackendErrorKind::OutOfMemory,
            BackendErrorKind::Busy,
            BackendErrorKind::WrongType,
            BackendErrorKind::TooFewReplicas,
            BackendErrorKind::Other,
        ];
        let uncached = AtHand {
            uncached: true,
            ..AtHand::default()
        };
        for kind in kinds {
            let table = decide(Failure::of_kind(kind), uncached) == Answer::ComputeUncached;
            assert_eq!(kind.computes_uncached(), table, "{kind}");
        }
    }

    #[test]
    fn an_error_of_the_callers_own_is_no_failure_the_table_answers() {
        assert_eq!(Failure::of(&Error::Config("bad".into())), None);
        let failed = Error::compute(std::io::Error::other("down"));
        assert_eq!(Failure::of(&failed), Some(Failure::SourceFailed));
    }
}
