//! Next-fence: bumps an entry's fencing counter without taking its lock (a Redlock's fence,
//! taken on the value store).

use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{parse, retention_ms, ScriptCall, Scripts};
use crate::store::StoreResult;
use crate::wire::key::EntryKeys;

/// KEYS: fence. ARGV: fence retention ms. Returns the bumped counter.
pub(super) const NEXT_FENCE: &str = r"
return bump_fence(KEYS[1], ARGV[1])
";

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

    fn key(&self) -> Option<&str> {
        Some(&self.keys.value)
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.next_fence
    }

    fn encode(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .key(self.keys.fence())
            .arg(retention_ms(self.lease));
    }

    fn decode(&self, reply: Value) -> StoreResult<u64> {
        parse(reply)
    }
}
