//! Since-last-run: how long ago, by the server's clock, a leader's last recorded run started.

use std::time::Duration;

use redis::Value;

use super::{lua, parse, Args, FromReply, Key, Lua, ScriptCall};
use crate::store::StoreResult;
use crate::wire::key::EntryKeys;

/// KEYS: last-run. Returns how many milliseconds ago, by the server's clock, the last recorded
/// run started, or -1 if none is recorded.
static SINCE_LAST_RUN: Lua = lua(r"
local current = redis.call('GET', KEYS[1])
local ran = current and tonumber(string.match(current, ' (%d+)$'))
if not ran then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return math.max(0, now - ran)
");

/// The age of a job's last recorded run ([`SINCE_LAST_RUN`]).
pub(crate) struct SinceLastRunCall<'a> {
    /// The job's entry.
    pub(crate) keys: &'a EntryKeys,
}

impl ScriptCall for SinceLastRunCall<'_> {
    /// How long ago, or `None` if no run is recorded.
    type Reply = Option<Duration>;
    const LUA: &'static Lua = &SINCE_LAST_RUN;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::LastRun]);
    }
}

/// An age in milliseconds, or -1: none.
impl FromReply for Option<Duration> {
    fn from_reply(reply: Value) -> StoreResult<Self> {
        let since: i64 = parse(reply)?;
        Ok(u64::try_from(since).ok().map(Duration::from_millis))
    }
}
