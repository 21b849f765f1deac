//! Unlock: a holder frees its lock and wakes the waiters.

use super::{lua, Args, Key, Lua, ScriptCall};
use crate::wire::key::EntryKeys;

/// KEYS: lock. ARGV: token, channel. Returns 1 if the lock was ours and is now free.
static UNLOCK: Lua = lua(r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
");

/// A release without a write ([`UNLOCK`]).
pub(crate) struct UnlockCall<'a> {
    /// The entry whose lock is released.
    pub(crate) keys: &'a EntryKeys,
    /// The holder's token: nothing happens if the lock holds another.
    pub(crate) token: &'a str,
    /// The entry's wake-up channel.
    pub(crate) channel: &'a str,
}

impl ScriptCall for UnlockCall<'_> {
    /// Whether the lock was ours and is now free.
    type Reply = bool;
    const LUA: &'static Lua = &UNLOCK;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Lock])
            .arg((self.token, self.channel));
    }
}
