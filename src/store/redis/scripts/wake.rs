//! Wake: publishes an entry's wake-up without touching any key.

use super::{lua, Args, Key, Lua, ScriptCall};
use crate::wire::key::EntryKeys;

/// KEYS: value (only so that Redis Cluster routes it to the entry's node). ARGV: channel.
/// Wakes the waiters without touching any key: the value store of a split store publishes this
/// when a lock held elsewhere (a Redlock) was freed without a value.
static WAKE: Lua = lua(r"
redis.call('PUBLISH', ARGV[1], '')
return 1
");

/// A wake-up of an entry's waiters ([`WAKE`]).
pub(crate) struct WakeCall<'a> {
    /// The entry (its value key routes the call on a cluster).
    pub(crate) keys: &'a EntryKeys,
    /// The entry's wake-up channel.
    pub(crate) channel: &'a str,
}

impl ScriptCall for WakeCall<'_> {
    type Reply = ();
    const LUA: &'static Lua = &WAKE;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Value]).arg(self.channel);
    }
}
