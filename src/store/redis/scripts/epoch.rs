//! The namespace's clock and its epochs (tags and clear): reading the clock a value's birth is
//! stamped with, and raising an epoch.

use redis::Value;

use super::{lua, parse, unexpected, Args, Lua, ScriptCall};
use crate::store::StoreResult;

/// KEYS: the key whose node keeps the clock (the namespace's clear key; only read for routing,
/// so that on a cluster every birth and epoch of a namespace comes from one node's clock).
/// Returns the server's `TIME` in microseconds, as a string (Lua's numbers would round it).
static CLOCK: Lua = lua(r"
local t = redis.call('TIME')
return t[1] .. string.format('%06d', tonumber(t[2]))
");

/// KEYS: the epoch. ARGV: the floor (microseconds), the near channel. Sets the epoch to the
/// floor or one above what it was, whichever is higher, with no expiry, and announces it
/// (fence 0: no copy holds an epoch's write). Bytes that are not a number (another program's)
/// count as 0, so the epoch is repaired. Returns the new epoch.
static RAISE_EPOCH: Lua = lua(r"
local held = redis.pcall('GET', KEYS[1])
local current = 0
if type(held) == 'string' then
  current = tonumber(held) or 0
end
local epoch = math.max(tonumber(ARGV[1]), current + 1)
local text = string.format('%d', epoch)
redis.call('SET', KEYS[1], text)
announce(ARGV[2], '0', KEYS[1])
return text
");

/// A read of the namespace's clock ([`CLOCK`]).
pub(crate) struct ClockCall<'a> {
    /// The namespace's clear key, for routing.
    pub(crate) clock: &'a str,
}

impl ScriptCall for ClockCall<'_> {
    /// Microseconds.
    type Reply = u64;
    const LUA: &'static Lua = &CLOCK;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.named(self.clock);
    }

    fn decode(&self, reply: Value) -> StoreResult<u64> {
        number_text(reply, "clock: not a number of microseconds")
    }
}

/// A raise of one epoch ([`RAISE_EPOCH`]).
pub(crate) struct RaiseEpochCall<'a> {
    /// The epoch's key (a clear or tag key).
    pub(crate) name: &'a str,
    /// The least it is raised to.
    pub(crate) floor: u64,
    /// Where near tiers hear of it (`""`: nowhere).
    pub(crate) near_channel: &'a str,
}

impl ScriptCall for RaiseEpochCall<'_> {
    /// The new epoch.
    type Reply = u64;
    const LUA: &'static Lua = &RAISE_EPOCH;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.named(self.name).arg((self.floor, self.near_channel));
    }

    fn decode(&self, reply: Value) -> StoreResult<u64> {
        number_text(reply, "raise epoch: not a number")
    }
}

/// A number the script returns as text, since Lua's numbers would round it; `what` names a
/// reply that is not one.
fn number_text(reply: Value, what: &'static str) -> StoreResult<u64> {
    let text: String = parse(reply.clone())?;
    text.parse().map_err(|_| unexpected(what, &reply))
}
