//! `stampede_guard::web`'s log lines (feature `axum`): the whole error in the log, none of it
//! in the body, and one line per kind of error and minute with a count. Its own test binary:
//! the throttle is per process, so no other test's errors may log first.

use axum::response::IntoResponse;
use stampede_guard::{web, ComputeError, Error, SourceUnavailable};
use support::logged::logged;

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod logged;
    pub mod logs;
}

/// Must never reach the client: it stands for a database error with internals in it.
const SECRET: &str = "password=hunter2 host=db.internal";

/// One test, in order: the throttle's state is the process's.
#[test]
fn the_whole_error_is_logged_once_per_kind_and_minute_with_a_count() {
    let failed = Error::Compute(ComputeError::new(SECRET.to_owned()));
    let (response, first) = logged(|| web::response(&failed));
    assert_eq!(response.status(), 500);
    assert!(first.contains("ERROR"), "{first}");
    assert!(
        first.contains("kind=\"compute_failed\"") || first.contains("kind=compute_failed"),
        "{first}"
    );
    assert!(first.contains("count=1"), "{first}");
    // The log line has the computation's error (the source), though Display leaves it out.
    assert!(
        first.contains(&format!("the computation failed: {SECRET}")),
        "{first}"
    );
    // No empty field.
    assert!(!first.contains("=\"\""), "{first}");

    // The same kind within the minute: no line; another kind: its own line.
    let (again, second) = logged(|| failed.clone().into_response());
    assert_eq!(again.status(), 500, "IntoResponse is the same response");
    assert_eq!(second, "", "one line per kind and minute");
    let down = Error::Compute(ComputeError::new(SourceUnavailable::new(SECRET)));
    let (response, third) = logged(|| web::response(&down));
    assert_eq!(response.status(), 503);
    assert!(third.contains("WARN"), "{third}");
    assert!(third.contains("source_unavailable"), "{third}");
}
