//! Since-last-run: how long ago, by the server's clock, a leader's last recorded run started.

use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{parse, ScriptCall, Scripts};
use crate::store::StoreResult;
use crate::wire::key::EntryKeys;

/// KEYS: last-run. Returns how many milliseconds ago, by the server's clock, the last recorded
/// run started, or -1 if none is recorded.
pub(super) const SINCE_LAST_RUN: &str = r"
local current = redis.call('GET', KEYS[1])
local ran = current and tonumber(string.match(current, ' (%d+)$'))
if not ran then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return math.max(0, now - ran)
";

/// The age of a job's last recorded run ([`SINCE_LAST_RUN`]).
pub(crate) struct SinceLastRunCall<'a> {
    /// The job's entry.
    pub(crate) keys: &'a EntryKeys,
}

impl ScriptCall for SinceLastRunCall<'_> {
    /// How long ago, or `None` if no run is recorded.
    type Reply = Option<Duration>;

    fn key(&self) -> Option<&str> {
        Some(&self.keys.value)
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.since_last_run
    }

    fn encode(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.key(self.keys.last_run());
    }

    fn decode(&self, reply: Value) -> StoreResult<Option<Duration>> {
        let since: i64 = parse(reply)?;
        Ok(u64::try_from(since).ok().map(Duration::from_millis))
    }
}
