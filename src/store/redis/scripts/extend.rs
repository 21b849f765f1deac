//! Extend: a lock holder renews its lease, and keeps the fence alive as long.

use std::time::Duration;

use super::{lua, retention_ms, Args, Key, Lua, ScriptCall};
use crate::store::expiry_ms;
use crate::wire::key::EntryKeys;

/// KEYS: lock, fence. ARGV: token, lease ms, fence retention ms. Returns 1 if extended.
static EXTEND: Lua = lua(r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) == 0 then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
keep_at_least(KEYS[2], ARGV[3])
return 1
");

/// A lease renewal ([`EXTEND`]).
pub(crate) struct ExtendCall<'a> {
    /// The entry whose lock is renewed.
    pub(crate) keys: &'a EntryKeys,
    /// The holder's token: nothing happens if the lock holds another.
    pub(crate) token: &'a str,
    /// The new lease, from now.
    pub(crate) lease: Duration,
}

impl ScriptCall for ExtendCall<'_> {
    /// Whether the lock was still ours and is extended.
    type Reply = bool;
    const LUA: &'static Lua = &EXTEND;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Lock, Key::Fence]).arg((
            self.token,
            expiry_ms(self.lease),
            retention_ms(self.lease),
        ));
    }
}
