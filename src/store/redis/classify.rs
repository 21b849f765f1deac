//! The one place a Redis client's error is sorted into a [`BackendErrorKind`], so the fallback,
//! the web mapping, the counters (and the circuit breaker of the outage issue) all read one
//! answer instead of each guessing from error codes.
//!
//! Explained in the guide: `docs/guarantees.md` (What a Redis error means).

use redis::{ErrorKind, RedisError};

use crate::error::BackendErrorKind;

/// The kind of `e`. Error codes first: a refusal inside a script keeps its code (Redis 7
/// prefixes the script's error with the command's), and a login refused at connect time is
/// reported either as `WRONGPASS`/`NOAUTH` or as the client's `AuthenticationFailed`. Then the
/// client's own failures: anything about the socket (refused, reset, a time-out, a connection
/// the manager could not make) is unreachability.
pub(crate) fn classify(e: &RedisError) -> BackendErrorKind {
    match e.code() {
        Some("NOPERM" | "NOAUTH" | "WRONGPASS") => return BackendErrorKind::RefusedPermission,
        Some("READONLY" | "MASTERDOWN") => return BackendErrorKind::RefusedRole,
        Some("OOM") => return BackendErrorKind::OutOfMemory,
        Some("BUSY" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN") => return BackendErrorKind::Busy,
        Some("WRONGTYPE") => return BackendErrorKind::WrongType,
        Some("ERR") if refused_inside_a_script(e) => return BackendErrorKind::RefusedPermission,
        _ => {}
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => BackendErrorKind::RefusedPermission,
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => BackendErrorKind::Unreachable,
        _ if e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() => {
            BackendErrorKind::Unreachable
        }
        _ => BackendErrorKind::Other,
    }
}

/// Whether `e` is an ACL refusal raised by a command inside a script. Redis 7 reports those as
/// `ERR`, not `NOPERM`: a user with the namespace's keys but not its channels (`&ns:*`; a new
/// user has none by default) passes the check on `EVALSHA` and is refused at the script's
/// `PUBLISH`, with "The user executing the script can't publish to the channel ..." (7.0) or
/// "ACL failure in script ..." (other 7.x builds). Read as anything else it would look like an
/// outage, and a 503 would invite retries that can never succeed.
fn refused_inside_a_script(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or("");
    detail.starts_with("The user executing the script can't")
        || detail.starts_with("ACL failure in script")
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    /// A server's error reply, as the client parses it off the wire.
    fn reply(line: &str) -> RedisError {
        let parsed = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        match parsed {
            Value::ServerError(e) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn error_codes_sort_into_their_kinds() {
        for (line, kind) in [
            ("NOPERM No permissions to access a key", BackendErrorKind::RefusedPermission),
            ("NOAUTH Authentication required.", BackendErrorKind::RefusedPermission),
            ("WRONGPASS invalid username-password pair", BackendErrorKind::RefusedPermission),
            ("READONLY You can't write against a read only replica.", BackendErrorKind::RefusedRole),
            ("MASTERDOWN Link with MASTER is down", BackendErrorKind::RefusedRole),
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: 1f, on @user_script:1.",
                BackendErrorKind::OutOfMemory,
            ),
            ("BUSY Redis is busy running a script.", BackendErrorKind::Busy),
            ("LOADING Redis is loading the dataset in memory", BackendErrorKind::Busy),
            ("TRYAGAIN Multiple keys request during rehashing of slot", BackendErrorKind::Busy),
            ("CLUSTERDOWN The cluster is down", BackendErrorKind::Busy),
            ("WRONGTYPE Operation against a key holding the wrong kind of value", BackendErrorKind::WrongType),
            (
                "ERR The user executing the script can't publish to the channel mentioned in the command script: b7c1, on @user_script:1.",
                BackendErrorKind::RefusedPermission,
            ),
            (
                "ERR The user executing the script can't access at least one of the keys mentioned in the command arguments script: 40b3, on @user_script:1.",
                BackendErrorKind::RefusedPermission,
            ),
            ("ERR ACL failure in script: No permissions to access a key", BackendErrorKind::RefusedPermission),
            ("ERR unknown command", BackendErrorKind::Other),
        ] {
            assert_eq!(classify(&reply(line)), kind, "{line}");
        }
    }

    #[test]
    fn socket_failures_and_logins_are_told_apart() {
        for io in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::BrokenPipe,
        ] {
            let e = RedisError::from(std::io::Error::from(io));
            assert_eq!(classify(&e), BackendErrorKind::Unreachable, "{io:?}");
        }
        let login = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(classify(&login), BackendErrorKind::RefusedPermission);
        let contract = RedisError::from((ErrorKind::UnexpectedReturnType, "bad reply"));
        assert_eq!(classify(&contract), BackendErrorKind::Other);
    }
}
