//! Raise-fence: lifts an entry's fencing counter to at least a given value, so fences handed out
//! elsewhere (a Redlock's nodes) stay ordered here too.

use std::time::Duration;

use super::{lua, retention_ms, Args, Key, Lua, ScriptCall};
use crate::wire::key::EntryKeys;

/// KEYS: fence. ARGV: floor, fence retention ms. Raises the counter to at least `floor`.
static RAISE_FENCE: Lua = lua(r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  set_keeping(KEYS[1], ARGV[1], ARGV[2])
else
  keep_at_least(KEYS[1], ARGV[2])
end
return 1
");

/// A raise of the fencing counter ([`RAISE_FENCE`]).
pub(crate) struct RaiseFenceCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The least the counter holds afterwards.
    pub(crate) floor: u64,
    /// The lease whose retention the counter is kept for.
    pub(crate) lease: Duration,
}

impl ScriptCall for RaiseFenceCall<'_> {
    type Reply = ();
    const LUA: &'static Lua = &RAISE_FENCE;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Fence])
            .arg((self.floor, retention_ms(self.lease)));
    }
}
