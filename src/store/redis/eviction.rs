//! The warning about a Redis server that may evict lock keys, given once per store.
//!
//! Why it matters: every key of ours has a TTL, so any `maxmemory-policy` but `noeviction` can
//! evict them under memory pressure. An evicted lock key lets a second holder in at once (for a
//! `Lock` or a `Leader` that breaks mutual exclusion with no pause at all); an evicted fence key
//! makes the running computation's write be refused (safe, but the value is not cached). Under
//! `volatile-ttl` lock and fence keys, having the shortest TTLs, go first.
//!
//! How: the store's data connection is wrapped in [`Answered`], which hands a clone of the
//! connection to a background task the first time the server answers anything. That task asks
//! `CONFIG GET maxmemory` and `maxmemory-policy` and warns if eviction is possible. So the check
//! never opens a connection by itself (a store that is never used never asks), never blocks
//! `build()`, and adds no command to any call: the hit path pays one relaxed atomic load. A server
//! that refuses `CONFIG` (an ACL user without it, a renamed command) is not judged: silence.
//!
//! The same watch starts the capability probe (`capabilities.rs`) at the first answer, unless
//! `build()` probed, and again at the first answer after the store found the connection lost
//! ([`Answered::rearm`]) or a minute passed (the client may reconnect without any call
//! failing): a reconnection may reach another server. The probe never connects by itself, so
//! an outage costs no extra connection attempts.
//!
//! Explained in the guide: `docs/guarantees.md` (Redis under memory pressure).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::oneshot;

use super::capabilities::Probed;

/// Attempts of the check after the first answer, for errors that are not a refusal (a dropped
/// connection, a timeout): bounded, so a flapping server does not keep a task alive.
const ATTEMPTS: u32 = 5;
/// How long a capability probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a probe's findings stand without a new probe: the client reconnects by itself
/// when it notices a dropped connection before any call does, and then no call fails to say
/// so. One pipelined probe a minute per store.
const REPROBE_PERIOD: Duration = Duration::from_secs(60);
/// The delay before the second attempt, doubled after each.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// A connection that, at its first successful answer, hands a clone of itself to the policy
/// check. Clones share the hand-over, so it happens once per store.
#[derive(Clone)]
pub(crate) struct Answered<C> {
    conn: C,
    first: Arc<FirstAnswer<C>>,
}

struct FirstAnswer<C> {
    /// Set once the hand-over happened (or was given up): the only thing the hit path reads.
    done: AtomicBool,
    /// Taken at the first answer. The `std` mutex is never held across `.await`.
    to_check: Mutex<Option<oneshot::Sender<C>>>,
    /// The server's capabilities, probed at an answer when they are unknown or stale.
    probed: Option<Arc<Probed>>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Answered<C> {
    /// Wraps `conn` and starts the policy check, which waits for the first answer; with
    /// `probed`, answers also start the capability probe when it is due. Without a Tokio
    /// runtime (nothing to spawn on) the connection is used as it is, unchecked.
    pub(crate) fn new(conn: C, probed: Option<Arc<Probed>>) -> Self {
        let (tx, rx) = oneshot::channel();
        let runtime = tokio::runtime::Handle::try_current().ok();
        if let Some(runtime) = &runtime {
            runtime.spawn(check_when_answered(rx));
        }
        let spawned = runtime.is_some();
        let answered = Answered {
            conn,
            first: Arc::new(FirstAnswer {
                done: AtomicBool::new(!spawned),
                to_check: Mutex::new(spawned.then_some(tx)),
                probed,
            }),
        };
        if let (Some(runtime), Some(_)) = (runtime, &answered.first.probed) {
            runtime.spawn(rearm_every(Arc::downgrade(&answered.first), REPROBE_PERIOD));
        }
        answered
    }

    fn answered(&self) {
        if self.first.done.load(Ordering::Relaxed) {
            return;
        }
        self.first.done.store(true, Ordering::Relaxed);
        let sender = self
            .first
            .to_check
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(sender) = sender {
            // The task may be gone (runtime shut down): then nobody is warned, which is fine.
            let _ = sender.send(self.conn.clone());
        }
        if let Some(probed) = self.first.probed.as_ref().filter(|p| p.take_due()) {
            let rearm = self.clone();
            probed.reprobe(self.clone(), PROBE_TIMEOUT, move || rearm.rearm());
        }
    }

    /// The connection was lost: the next answer may come from another server (a failover),
    /// so it is watched again and the capabilities are probed anew then. Costs the next
    /// request one boxed future; the hit path is as before from the answer on.
    pub(crate) fn rearm(&self) {
        self.first.rearm();
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> ConnectionLike for Answered<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // After the first answer there is nothing to watch for: the inner future as it is, not
        // boxed again (a hit pays one allocation and one poll layer less).
        if self.first.done.load(Ordering::Relaxed) {
            return self.conn.req_packed_command(cmd);
        }
        Box::pin(async move {
            let answer = self.conn.req_packed_command(cmd).await;
            // An error reply is an answer too; a connection that failed is not.
            if answer.is_ok() || answer.as_ref().is_err_and(|e| e.code().is_some()) {
                self.answered();
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let answer = self.conn.req_packed_commands(pipeline, offset, count).await;
            if answer.is_ok() {
                self.answered();
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

impl<C> FirstAnswer<C> {
    fn rearm(&self) {
        if let Some(probed) = &self.probed {
            probed.make_due();
            self.done.store(false, Ordering::Relaxed);
        }
    }
}

/// Makes a probe due every `period` while the store lives.
async fn rearm_every<C>(first: std::sync::Weak<FirstAnswer<C>>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        match first.upgrade() {
            Some(first) => first.rearm(),
            None => return,
        }
    }
}

/// What the server said about eviction.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Eviction can take our keys: maxmemory set and a policy other than `noeviction`.
    CanEvict {
        policy: String,
        maxmemory: u64,
    },
    Safe,
}

/// `maxmemory 0` means no limit (on a 64-bit server nothing is evicted); every key of ours has
/// a TTL, so every policy but `noeviction` (the `allkeys-*` and the `volatile-*` ones) can pick it.
fn judge(maxmemory: u64, policy: &str) -> Verdict {
    if maxmemory == 0 || policy.eq_ignore_ascii_case("noeviction") {
        Verdict::Safe
    } else {
        Verdict::CanEvict {
            policy: policy.to_owned(),
            maxmemory,
        }
    }
}

async fn config_get<C: ConnectionLike>(conn: &mut C, name: &str) -> RedisResult<Option<String>> {
    // A map on RESP3, name/value pairs on RESP2: both read as pairs.
    let pairs: Vec<(String, String)> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await?;
    Ok(pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v))
}

async fn ask<C: ConnectionLike>(conn: &mut C) -> RedisResult<Option<Verdict>> {
    let maxmemory = config_get(conn, "maxmemory").await?;
    let policy = config_get(conn, "maxmemory-policy").await?;
    Ok(match (maxmemory.and_then(|m| m.parse().ok()), policy) {
        (Some(maxmemory), Some(policy)) => Some(judge(maxmemory, &policy)),
        _ => None,
    })
}

async fn check_when_answered<C: ConnectionLike + Send>(first: oneshot::Receiver<C>) {
    // The store was dropped before its server ever answered: nothing to check.
    let Ok(mut conn) = first.await else {
        return;
    };
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        match ask(&mut conn).await {
            Ok(Some(Verdict::CanEvict { policy, maxmemory })) => {
                tracing::warn!(
                    policy,
                    maxmemory,
                    "Redis may evict this store's lock keys: maxmemory-policy is {policy} with \
                     maxmemory {maxmemory} bytes. An evicted lock key lets a second holder of a \
                     Lock or Leader in at once, and an evicted fence key leaves a computed value \
                     uncached. Use maxmemory-policy noeviction, or a separate Redis server for \
                     locks (docs/guarantees.md: \"Redis under memory pressure\")"
                );
                return;
            }
            Ok(Some(Verdict::Safe)) => {
                tracing::debug!("Redis eviction policy checked: lock keys cannot be evicted");
                return;
            }
            Ok(None) => return,
            // An error reply (NOPERM for an ACL user, unknown command when renamed): the server
            // does not let us look, which is its right. Not judged, not warned.
            Err(e) if e.code().is_some() => {
                tracing::debug!(error = %e, "CONFIG GET refused; the eviction policy is not checked");
                return;
            }
            Err(e) if attempt < ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "eviction policy check failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(e) => {
                tracing::debug!(error = %e, "eviction policy check gave up");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_limit_with_an_evicting_policy_can_evict_our_keys() {
        assert_eq!(judge(0, "allkeys-lru"), Verdict::Safe);
        assert_eq!(judge(3 << 20, "noeviction"), Verdict::Safe);
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(
                matches!(judge(3 << 20, policy), Verdict::CanEvict { .. }),
                "{policy}"
            );
        }
    }
}
