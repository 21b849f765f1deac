//! Wake: publishes an entry's wake-up without touching any key.

use redis::{Script, ScriptInvocation, Value};

use super::{parse, ScriptCall, Scripts};
use crate::store::StoreResult;
use crate::wire::key::EntryKeys;

/// KEYS: value (only so that Redis Cluster routes it to the entry's node). ARGV: channel.
/// Wakes the waiters without touching any key: the value store of a split store publishes this
/// when a lock held elsewhere (a Redlock) was freed without a value.
pub(super) const WAKE: &str = r"
redis.call('PUBLISH', ARGV[1], '')
return 1
";

/// A wake-up of an entry's waiters ([`WAKE`]).
pub(crate) struct WakeCall<'a> {
    /// The entry (its value key routes the call on a cluster).
    pub(crate) keys: &'a EntryKeys,
    /// The entry's wake-up channel.
    pub(crate) channel: &'a str,
}

impl ScriptCall for WakeCall<'_> {
    type Reply = ();

    fn key(&self) -> Option<&str> {
        Some(&self.keys.value)
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.wake
    }

    fn encode(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.key(&self.keys.value).arg(self.channel);
    }

    fn decode(&self, reply: Value) -> StoreResult<()> {
        parse::<i64>(reply).map(drop)
    }
}
