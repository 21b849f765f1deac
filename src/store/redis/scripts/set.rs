//! Set: the user's explicit write, which takes a new fence so that any computation running under
//! an older one cannot overwrite it.

use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{parse, retention_ms, ScriptCall, Scripts};
use crate::store::{expiry_ms, StoreResult};
use crate::wire::key::EntryKeys;

/// KEYS: value, fence. ARGV: value, ttl ms, fence retention ms, channel, near channel.
/// Always announced: a `set` is the user's explicit change.
pub(super) const SET: &str = r"
local fence = bump_fence(KEYS[2], ARGV[3])
set_expiring(KEYS[1], ARGV[1], ARGV[2])
keep_at_least(KEYS[2], ARGV[2])
announce(ARGV[5], string.format('%d', fence), KEYS[1])
redis.call('PUBLISH', ARGV[4], '')
return 1
";

/// An explicit write ([`SET`]).
pub(crate) struct SetCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The bytes to store.
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

impl ScriptCall for SetCall<'_> {
    type Reply = ();

    fn key(&self) -> Option<&str> {
        Some(&self.keys.value)
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.set
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

    fn decode(&self, reply: Value) -> StoreResult<()> {
        parse::<i64>(reply).map(drop)
    }
}
