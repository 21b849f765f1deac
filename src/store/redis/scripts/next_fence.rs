//! Next-fence: bumps an entry's fencing counter without taking its lock (a Redlock's fence,
//! taken on the value store).

use std::time::Duration;

use super::{lua, retention_ms, Args, Key, Lua, ScriptCall};
use crate::wire::key::EntryKeys;

/// KEYS: fence. ARGV: fence retention ms. Returns the bumped counter.
static NEXT_FENCE: Lua = lua(r"
return bump_fence(KEYS[1], ARGV[1])
");

/// A bump of the fencing counter ([`NEXT_FENCE`]).
pub(crate) struct NextFenceCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The lease whose retention the counter is kept for.
    pub(crate) lease: Duration,
}

impl ScriptCall for NextFenceCall<'_> {
    /// The new fence.
    type Reply = u64;
    const LUA: &'static Lua = &NEXT_FENCE;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Fence])
            .arg(retention_ms(self.lease));
    }
}
