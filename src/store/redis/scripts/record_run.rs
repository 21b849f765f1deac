//! Record-run: a leader's run start, by the server's clock, so the schedule survives a change of
//! leader.

use std::time::Duration;

use super::{lua, Args, Key, Lua, ScriptCall};
use crate::store::expiry_ms;
use crate::wire::key::EntryKeys;

/// KEYS: last-run. ARGV: fence, keep ms. Records the server's clock as the start of a leader's
/// run under `fence` ("fence ms"), unless a run of a newer term (a higher fence) is recorded:
/// a paused old leader cannot move the schedule back. Returns 1 if recorded.
static RECORD_RUN: Lua = lua(r"
local current = redis.call('GET', KEYS[1])
if current then
  local fence = tonumber(string.match(current, '^(%d+) '))
  if fence and fence > tonumber(ARGV[1]) then
    return 0
  end
end
local t = redis.call('TIME')
local ms = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
set_expiring(KEYS[1], ARGV[1] .. ' ' .. ms, ARGV[2])
return 1
");

/// The record of a leader's run ([`RECORD_RUN`]).
pub(crate) struct RecordRunCall<'a> {
    /// The job's entry.
    pub(crate) keys: &'a EntryKeys,
    /// The leader's fence: an older term cannot overwrite a newer one's record.
    pub(crate) fence: u64,
    /// How long the record is kept.
    pub(crate) keep: Duration,
}

impl ScriptCall for RecordRunCall<'_> {
    /// Whether it was recorded.
    type Reply = bool;
    const LUA: &'static Lua = &RECORD_RUN;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::LastRun])
            .arg((self.fence, expiry_ms(self.keep)));
    }
}
