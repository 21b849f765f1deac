//! Which sqlx errors say the database is down or busy (feature `sqlx`): the ones a retry a
//! moment later can get past, which `web` answers with 503 and `Retry-After` rather than 500.
//!
//! Read by [`Error::is_source_unavailable`](crate::Error::is_source_unavailable) on every link
//! of a computation's error chain. A query's own mistake (its syntax, a constraint, a missing
//! table or column, a row not found, a decoding error) is no outage: it stays a 500, or every
//! bug would hide behind "try again shortly".

/// SQLSTATE codes of a database that is going away, refusing connections for now, or asking
/// for the transaction to be retried. PostgreSQL names them; MySQL uses 40001 for its
/// deadlocks and serialization failures too.
const RETRYABLE_SQLSTATES: [&str; 6] = [
    "57P01", // admin_shutdown: the server is shutting down, or `pg_terminate_backend`
    "57P02", // crash_shutdown: another backend crashed, the server restarts
    "57P03", // cannot_connect_now: the server is starting up or in recovery
    "53300", // too_many_connections
    "40001", // serialization_failure
    "40P01", // deadlock_detected
];

/// SQLSTATE class 08, connection exception: the connection failed or was lost.
const CONNECTION_EXCEPTION_CLASS: &str = "08";

/// Whether `error` says the database is unavailable for now rather than the query wrong: the
/// pool timed out or is closed, the connection failed (I/O, a crashed worker), or the database
/// answered with one of the retryable SQLSTATEs or a connection exception (class 08).
pub(crate) fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| is_retryable_sqlstate(&code)),
        _ => false,
    }
}

/// Whether `code` is a SQLSTATE of an outage or a retryable transaction (see
/// [`RETRYABLE_SQLSTATES`]). SQLite's codes are numbers of other lengths, so they never match.
fn is_retryable_sqlstate(code: &str) -> bool {
    code.len() == 5
        && (RETRYABLE_SQLSTATES.contains(&code) || code.starts_with(CONNECTION_EXCEPTION_CLASS))
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::fmt;

    use super::*;

    /// A database's error with a SQLSTATE, as a driver reports it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl fmt::Display for Coded {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "the database said {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "the database said no"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn database(code: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Coded(code)))
    }

    #[test]
    fn a_down_or_busy_database_is_unavailable() {
        let io = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        for error in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            sqlx::Error::Io(io),
            database("57P01"),
            database("57P02"),
            database("57P03"),
            database("53300"),
            database("40001"),
            database("40P01"),
            database("08006"),
            database("08001"),
        ] {
            assert!(is_unavailable(&error), "{error:?}");
        }
    }

    #[test]
    fn a_wrong_query_is_not() {
        for error in [
            database("42601"), // syntax_error
            database("42P01"), // undefined_table
            database("42703"), // undefined_column
            database("23505"), // unique_violation
            database("23503"), // foreign_key_violation
            database("5"),     // SQLite's SQLITE_BUSY: a number, never a SQLSTATE
            sqlx::Error::RowNotFound,
            sqlx::Error::Protocol("unexpected message".into()),
            sqlx::Error::ColumnNotFound("month".into()),
        ] {
            assert!(!is_unavailable(&error), "{error:?}");
        }
    }
}
