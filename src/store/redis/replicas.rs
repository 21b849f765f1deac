//! Lock and fencing writes that wait for replicas ([`ConnectionOptions::wait_for_replicas`]):
//! the script and `WAIT <replicas> <timeout>` go out together, as one pipeline on one
//! connection, and the write counts only if enough replicas acknowledged it.
//!
//! Why one pipeline: `WAIT` covers the writes made earlier *on its own connection*. Sent as a
//! second request, it could go out on a connection the client made anew in between (a reconnect
//! after a drop), which made no write, and it would then count every replica at once: an
//! acknowledgement of nothing. In one pipeline both commands travel in one write on one
//! connection, or fail together. On Redis Cluster the client routes a pipeline by its first
//! keyed command, so the script's slot decides the node and `WAIT` (which names no key) goes
//! with it to that slot's master.
//!
//! Why a connection of its own ([`ReplicaWait::conn`]): the server reads nothing more from a
//! connection while a `WAIT` sent on it blocks. On the store's data connection, which every
//! hit of the cache shares, each lock write would hold up every read behind it for as long as
//! the replicas take, up to the whole timeout while one is down. On its own connection only the
//! waiting writes queue behind each other (measured in `benches/lock_latency.rs`).
//!
//! Why releases go over it too ([`ReplicaWait::release`]): order. A release must not overtake
//! the acquisition it undoes, and only one connection keeps them in order.
//!
//! What `WAIT` does not do: roll anything back. A write that too few replicas acknowledged
//! stays on the master; the store undoes what it can (it releases a granted lock) and reports
//! [`BackendErrorKind::TooFewReplicas`].
//!
//! Explained in the guide: `docs/cluster-and-redlock.md` (Failover-safe locks).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, Value};

use super::connection::ReplicaAcks;
use super::scripts::{unexpected, Args, ScriptCall, Scripts};
use crate::error::BackendErrorKind;
use crate::store::{StoreError, StoreResult};

/// Whether enough replicas acknowledged a write: `Ok`, or the error that says how many did.
pub(crate) type Acks = Result<(), StoreError>;

/// The connection and the settings of the writes that wait for replicas.
pub(crate) struct ReplicaWait<C> {
    /// Carries only the waiting writes (see the module docs); its response timeout is the
    /// store's plus `WAIT`'s, so a `WAIT` that runs its course is answered, not cut off.
    conn: C,
    acks: ReplicaAcks,
}

impl<C: ConnectionLike + Clone + Send + Sync> ReplicaWait<C> {
    /// Waits for `acks` over `conn`, a connection the store uses for nothing else.
    pub(crate) fn new(conn: C, acks: ReplicaAcks) -> Self {
        ReplicaWait { conn, acks }
    }

    /// Runs `call`, then `WAIT` on the same connection: the script's reply, and whether enough
    /// replicas acknowledged it. A script the server does not know (`NOSCRIPT`: restarted,
    /// failed over, flushed) is loaded as every script call loads it (`Lua::reload`: once for the
    /// calls that meet that together) and the pair sent again; its `EVALSHA` wrote nothing.
    pub(crate) async fn run<S: ScriptCall>(
        &self,
        scripts: Scripts,
        call: S,
    ) -> StoreResult<(S::Reply, Acks)> {
        let args = Args::of(&call, scripts);
        let mut pipe = redis::pipe();
        pipe.invoke_script(args.invocation())
            .cmd("WAIT")
            .arg(self.acks.replicas)
            .arg(wait_ms(self.acks.timeout));
        let mut conn = self.conn.clone();
        let about = |e: StoreError| args.name(e);
        let mut loading = S::LUA.loading(scripts);
        let mut replies = conn
            .req_packed_commands(&pipe, 0, 2)
            .await
            .map_err(|e| about(e.into()))?;
        while is_noscript(replies.first())
            && (S::LUA.reload(&mut loading, args.invocation(), &mut conn))
                .await
                .map_err(|e| about(e.into()))?
        {
            replies = conn
                .req_packed_commands(&pipe, 0, 2)
                .await
                .map_err(|e| about(e.into()))?;
        }
        let mut replies = replies.into_iter();
        let (Some(reply), Some(waited)) = (replies.next(), replies.next()) else {
            return Err(unexpected("script and WAIT: two replies", &Value::Nil));
        };
        if let Value::ServerError(e) = reply {
            return Err(about(RedisError::from(e).into()));
        }
        let answer = call.decode(reply)?;
        let acks = match waited {
            Value::Int(acked) => self.enough(usize::try_from(acked).unwrap_or(0), args.about()),
            // Refused (`NOPERM`, a proxy that does not know it): classed as the script's own
            // refusals are, not as a reply of the wrong shape.
            Value::ServerError(e) => Err(about(RedisError::from(e).into())),
            other => Err(about(unexpected("WAIT: a count of replicas", &other))),
        };
        Ok((answer, acks))
    }

    /// Runs `call` on this connection, with no `WAIT` after it: for releases. A release must
    /// go where the acquisitions go: the server reads nothing more from this connection while
    /// a `WAIT` on it blocks, so a lock script sent behind that `WAIT` runs only after it. A
    /// release sent on another connection (a caller that gave up on its acquisition) could
    /// run first, find nothing, and the script then granted the lock to nobody for a lease.
    /// Sent here, it runs after every script sent before it.
    pub(crate) async fn release<S: ScriptCall>(
        &self,
        scripts: Scripts,
        call: S,
    ) -> StoreResult<S::Reply> {
        super::scripts::run(scripts, call, &mut self.conn.clone()).await
    }

    /// `Ok` if `acked` replicas are enough, else the error that says so, about `key`.
    fn enough(&self, acked: usize, key: Option<&str>) -> Acks {
        if acked >= self.acks.replicas {
            return Ok(());
        }
        Err(StoreError::Redis {
            source: RedisError::from((
                ErrorKind::Client,
                "too few replicas acknowledged the write",
                format!(
                    "{acked} of {} replicas within {} ms",
                    self.acks.replicas,
                    wait_ms(self.acks.timeout)
                ),
            )),
            kind: BackendErrorKind::TooFewReplicas,
            key: key.map(str::to_owned),
        })
    }
}

/// `WAIT`'s timeout argument: whole milliseconds, at least 1 (0 would mean for ever; the
/// option already keeps it above, this is where it matters).
fn wait_ms(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether the script's reply says the server does not know it.
fn is_noscript(reply: Option<&Value>) -> bool {
    matches!(reply, Some(Value::ServerError(e)) if e.code() == "NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_never_reaches_wait_as_zero() {
        assert_eq!(wait_ms(Duration::ZERO), 1);
        assert_eq!(wait_ms(Duration::from_micros(999)), 1);
        assert_eq!(wait_ms(Duration::from_millis(250)), 250);
        assert_eq!(wait_ms(Duration::MAX), u64::MAX);
    }
}
