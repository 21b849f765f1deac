//! Replay set: a `set` that could not reach Redis, replayed by the auto-recovery queue when the
//! server answers again. The queue cannot know whether a value written meanwhile (by another
//! instance, or a computation) is older or newer than the replayed one, so the script never
//! overwrites one: into an empty slot it writes as [`SET`](super::set) does; over a value it
//! invalidates as [`INVALIDATE`](super::invalidate) does. Either way the fence is bumped (a
//! computation that started before cannot write back what it read) and the change is announced.

use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{parse, retention_ms, ScriptCall, Scripts};
use crate::store::{expiry_ms, StoreResult};
use crate::wire::key::EntryKeys;

/// KEYS: value, fence. ARGV: value, ttl ms, fence retention ms, channel, near channel.
/// Returns 1 if the value was written, 0 if a value was there and was deleted instead.
pub(super) const REPLAY_SET: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  invalidate(KEYS[1], KEYS[2], ARGV[3], ARGV[4], ARGV[5])
  return 0
end
local fence = bump_fence(KEYS[2], ARGV[3])
set_expiring(KEYS[1], ARGV[1], ARGV[2])
keep_at_least(KEYS[2], ARGV[2])
announce(ARGV[5], string.format('%d', fence), KEYS[1])
redis.call('PUBLISH', ARGV[4], '')
return 1
";

/// A replayed write ([`REPLAY_SET`]).
pub(crate) struct ReplaySetCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The bytes to store if the slot is empty.
    pub(crate) value: Vec<u8>,
    /// How long the value lives.
    pub(crate) ttl: Duration,
    /// The lease whose retention the new fence is kept for.
    pub(crate) lease: Duration,
    /// The entry's wake-up channel.
    pub(crate) channel: &'a str,
    /// The namespace's near channel, or `""`.
    pub(crate) near_channel: &'a str,
}

impl ScriptCall for ReplaySetCall<'_> {
    /// True if written, false if the value there was deleted instead.
    type Reply = bool;

    fn key(&self) -> Option<&str> {
        Some(&self.keys.value)
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.replay_set
    }

    fn encode(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .key(&self.keys.value)
            .key(self.keys.fence())
            .arg(&self.value)
            .arg(expiry_ms(self.ttl))
            .arg(retention_ms(self.lease))
            .arg(self.channel)
            .arg(self.near_channel);
    }

    fn decode(&self, reply: Value) -> StoreResult<bool> {
        parse::<i64>(reply).map(|written| written == 1)
    }
}
