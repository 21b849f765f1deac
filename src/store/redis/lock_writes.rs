//! The lock's renewal and release without Lua, on servers that compare for themselves:
//! `SET ... IFEQ` (Valkey 8.1+, Redis 8.4+), `DELEX ... IFEQ` (Redis 8.4+), `DELIFEQ` (Valkey 9+).
//! Chosen by the capability probe ([`Probed`](super::Probed)); servers without them, and
//! writes that wait for replicas (`WAIT` after a script), keep the scripts.
//!
//! What the scripts do, and how each is kept here (one `MULTI`, so one round trip, run with
//! nothing between its commands):
//! - renewal (`extend.rs`): compare the token, set the lease (or `PERSIST` for `FOREVER`), then
//!   keep the fencing counter alive at least the fence retention (`keep_at_least`). Here: `SET
//!   lock token IFEQ token PX lease` (without `PX` it persists, as the script's `PERSIST`), then
//!   `PEXPIRE fence retention GT` (`GT` leaves a counter without expiry or without a key alone,
//!   and never shortens one: exactly `keep_at_least`; `PERSIST fence` for `FOREVER`). The one
//!   difference: the counter's life is kept even when the token did not match. A counter that
//!   lives longer only keeps fencing longer; no guarantee rests on it dying.
//! - release without a write (`unlock.rs`): compare the token, delete, publish the wake-up.
//!   Here: `DELEX lock IFEQ token` or `DELIFEQ lock token`, then the wake-up. The difference:
//!   the wake-up is published even when the token did not match (a holder whose lease ran out);
//!   waiters woken for nothing read the lock again and wait on, as for any wake-up.
//! - a release with a value (`store_and_unlock.rs`) writes under the fencing rule, announces to
//!   near tiers and wakes: it stays a script on every server.

use redis::Value;

use super::capabilities::LockWrite;
use super::scripts::unexpected;
use super::scripts::Scripts;
use crate::store::{expiry_ms, retention, StoreResult};
use crate::wire::key::EntryKeys;
use std::time::Duration;

/// `MULTI`: `SET lock token IFEQ token [PX lease]`, then the fence's retention.
pub(crate) fn renewal(keys: &EntryKeys, token: &str, lease: Duration) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let set = pipe
        .cmd("SET")
        .arg(keys.lock())
        .arg(token)
        .arg("IFEQ")
        .arg(token);
    match expiry_ms(lease) {
        0 => {}
        ms => {
            set.arg("PX").arg(ms);
        }
    }
    match expiry_ms(retention(lease)) {
        0 => pipe.cmd("PERSIST").arg(keys.fence()),
        ms => pipe.cmd("PEXPIRE").arg(keys.fence()).arg(ms).arg("GT"),
    };
    pipe
}

/// Whether the renewal's `SET` matched (`OK`; nil when the lock holds another token or none).
pub(crate) fn renewed(replies: &[Value]) -> StoreResult<bool> {
    match replies.first() {
        Some(Value::Okay) => Ok(true),
        Some(Value::SimpleString(s)) if s == "OK" => Ok(true),
        Some(Value::Nil) => Ok(false),
        other => Err(unexpected(
            "extend (SET IFEQ)",
            other.unwrap_or(&Value::Nil),
        )),
    }
}

/// `MULTI`: the compare-and-delete `path` names, then the wake-up on `channel`. `None` for a
/// path that is not a Lua-free release.
pub(crate) fn release(
    path: LockWrite,
    scripts: Scripts,
    keys: &EntryKeys,
    token: &str,
    channel: &str,
) -> Option<redis::Pipeline> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    match path {
        LockWrite::DelEx => pipe.cmd("DELEX").arg(keys.lock()).arg("IFEQ").arg(token),
        LockWrite::DelIfEq => pipe.cmd("DELIFEQ").arg(keys.lock()).arg(token),
        LockWrite::Script | LockWrite::SetIfEq => return None,
    };
    let publish = match scripts {
        Scripts::Plain => "PUBLISH",
        Scripts::Sharded => "SPUBLISH",
    };
    pipe.cmd(publish).arg(channel).arg("");
    Some(pipe)
}

/// Whether the release deleted the lock (1; 0 when it held another token or none).
pub(crate) fn released(replies: &[Value]) -> StoreResult<bool> {
    match replies.first() {
        Some(Value::Int(n)) => Ok(*n == 1),
        other => Err(unexpected(
            "unlock (DELEX/DELIFEQ)",
            other.unwrap_or(&Value::Nil),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `pipe` sends `MULTI`, then each command of `commands` (words), in order.
    fn assert_sends(pipe: &redis::Pipeline, commands: &[&[&str]]) {
        let text = String::from_utf8_lossy(&pipe.get_packed_pipeline()).replace("\r\n", " ");
        let mut rest = text.split_once("MULTI").map_or("", |(_, r)| r);
        for words in commands {
            let bulk: Vec<String> = words.iter().map(|w| format!("${} {w}", w.len())).collect();
            let command = bulk.join(" ");
            let at = rest
                .find(&command)
                .unwrap_or_else(|| panic!("{command:?} in {text}"));
            rest = &rest[at + command.len()..];
        }
    }

    #[test]
    fn renewal_compares_sets_the_lease_and_keeps_the_fence() {
        let keys = EntryKeys::new("ns", "k").unwrap();
        let (lock, fence) = (keys.lock(), keys.fence());
        assert_sends(
            &renewal(&keys, "tok", Duration::from_secs(10)),
            &[
                &["SET", lock, "tok", "IFEQ", "tok", "PX", "10000"],
                &["PEXPIRE", fence, "20000", "GT"],
            ],
        );
        // FOREVER: a SET without PX persists the lock, as the script's PERSIST.
        let forever = renewal(&keys, "tok", crate::FOREVER);
        assert_sends(
            &forever,
            &[&["SET", lock, "tok", "IFEQ", "tok"], &["PERSIST", fence]],
        );
        assert!(!String::from_utf8_lossy(&forever.get_packed_pipeline()).contains("PX"));
    }

    #[test]
    fn release_is_delex_on_redis_and_delifeq_on_valkey_with_the_wake_up() {
        let keys = EntryKeys::new("ns", "k").unwrap();
        let lock = keys.lock();
        let release = |path, scripts| release(path, scripts, &keys, "tok", "ch");
        let delex = release(LockWrite::DelEx, Scripts::Plain).unwrap();
        assert_sends(
            &delex,
            &[&["DELEX", lock, "IFEQ", "tok"], &["PUBLISH", "ch", ""]],
        );
        let delifeq = release(LockWrite::DelIfEq, Scripts::Sharded).unwrap();
        assert_sends(
            &delifeq,
            &[&["DELIFEQ", lock, "tok"], &["SPUBLISH", "ch", ""]],
        );
        assert!(release(LockWrite::Script, Scripts::Plain).is_none());
    }

    #[test]
    fn replies_are_read_as_the_scripts_answer() {
        assert!(renewed(&[Value::Okay, Value::Int(1)]).unwrap());
        assert!(!renewed(&[Value::Nil, Value::Int(0)]).unwrap());
        assert!(renewed(&[Value::Int(3)]).is_err());
        assert!(released(&[Value::Int(1), Value::Int(0)]).unwrap());
        assert!(!released(&[Value::Int(0), Value::Int(0)]).unwrap());
    }
}
