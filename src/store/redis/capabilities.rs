//! What the Redis server allows, found once per connection ([`Capabilities`]), and the choice
//! each missing capability leads to.
//!
//! Why: users run the crate on whatever their platform gives them (Redis 7 and 8, Valkey,
//! Dragonfly, KeyDB, Garnet, managed services that rename `CLIENT` and `CONFIG` away). The
//! crate's guarantees rest on Lua scripts; everything else has a fallback, chosen here and
//! reported by [`Cache::capabilities`](crate::Cache::capabilities) and
//! [`Health`](crate::Health).
//!
//! How: one pipelined round trip of side-effect-free commands (`HELLO` with no argument, which
//! reports and changes nothing; `INFO server`; `COMMAND INFO` and `COMMAND DOCS` for commands
//! and options; `EVAL` of `return 1`, declaring one key it does not touch, so a server that
//! requires declared keys accepts it; `CONFIG GET` of one setting). Each reply is read on its
//! own: an error reply means "not allowed", never a failed probe. The probe runs when `build()`
//! can reach the server within the connect time-out, and again after every reconnection of the
//! data connection (a failover may land on a node of another version or configuration).
//!
//! Explained in the guide: `docs/servers.md`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

/// The key the Lua probe declares (and does not touch): servers that refuse scripts declaring
/// no key (ElastiCache Serverless) accept it.
const PROBE_KEY: &str = "stampede-guard:capability-probe";

/// Which server answers, as it says itself in `HELLO` and `INFO server`.
///
/// ```
/// use stampede_guard::ServerKind;
/// assert_eq!(ServerKind::Valkey.as_str(), "valkey");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerKind {
    /// Redis (and servers that report nothing else).
    Redis,
    /// Valkey.
    Valkey,
    /// Dragonfly (`dragonfly_version` in `INFO`).
    Dragonfly,
    /// KeyDB.
    KeyDb,
    /// Microsoft Garnet (`garnet_version` in `INFO`).
    Garnet,
}

impl ServerKind {
    /// The server's name in lower case: `redis`, `valkey`, `dragonfly`, `keydb` or `garnet`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::ServerKind::Redis.as_str(), "redis");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
            ServerKind::Dragonfly => "dragonfly",
            ServerKind::KeyDb => "keydb",
            ServerKind::Garnet => "garnet",
        }
    }
}

crate::stats::text_is_as_str!(ServerKind);

/// How a lock holder renews or releases its lock on this server (see
/// [`Capabilities::renewal`] and [`Capabilities::release`]).
///
/// ```
/// use stampede_guard::LockWrite;
/// assert_eq!(LockWrite::SetIfEq.as_str(), "set_ifeq");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockWrite {
    /// A Lua script (every server with Lua).
    Script,
    /// Renewal by `SET lock token IFEQ token PX lease` with the fence's retention in the same
    /// `MULTI` (Valkey 8.1+, Redis 8.4+).
    SetIfEq,
    /// Release by `DELEX lock IFEQ token` and the wake-up in the same `MULTI` (Redis 8.4+).
    DelEx,
    /// Release by `DELIFEQ lock token` and the wake-up in the same `MULTI` (Valkey 9+).
    DelIfEq,
}

impl LockWrite {
    /// The path's name: `script`, `set_ifeq`, `delex` or `delifeq`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::LockWrite::Script.as_str(), "script");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            LockWrite::Script => "script",
            LockWrite::SetIfEq => "set_ifeq",
            LockWrite::DelEx => "delex",
            LockWrite::DelIfEq => "delifeq",
        }
    }
}

crate::stats::text_is_as_str!(LockWrite);

/// What the Redis server behind a cache allows, as probed at its last connection: see
/// [`Cache::capabilities`](crate::Cache::capabilities), which also says when it is known.
/// Each missing capability has a fallback, listed by [`fallbacks`](Self::fallbacks); only a
/// server without Lua is refused (at `build()`), since every guarantee rests on scripts.
///
/// | capability | without it |
/// |---|---|
/// | `lua` | `build()` fails: enable scripting (Garnet: `--lua`; an ACL user needs `@scripting`) |
/// | `tracking_bcast` | the near tier reads a copy again once it is `max_staleness` old |
/// | `sharded_pubsub` | a Redis Cluster cannot wake waiters (needs Redis 7+); one server uses `PUBLISH` |
/// | `wait` | [`wait_for_replicas`](crate::ConnectionOptions::wait_for_replicas) fails at `build()` |
/// | `config_get` | the eviction-policy warning is not given |
/// | `set_ifeq` | lock renewal by script |
/// | `delex`, `delifeq` | lock release by script |
///
/// ```no_run
/// use stampede_guard::{Cache, LockWrite};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::builder().redis_url("redis://127.0.0.1:6379/0").build().await?;
/// if let Some(caps) = cache.capabilities() {
///     println!("{} {}: renewal by {}", caps.server, caps.version, caps.renewal());
///     for fallback in caps.fallbacks() {
///         println!("fell back: {fallback}");
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Which server answers.
    pub server: ServerKind,
    /// Its version as it reports it (`"8.1.1"`; for Dragonfly and Garnet their own version).
    pub version: String,
    /// `EVAL`/`EVALSHA` run (a script declaring one key ran).
    pub lua: bool,
    /// The server speaks RESP3 (`HELLO`), which wake-ups and the near tier's feed use.
    pub resp3: bool,
    /// `CLIENT TRACKING ... BCAST PREFIX` is listed (not Dragonfly or Garnet, not renamed away).
    /// Whether the near tier's feed was granted it is [`Health::near_tracking`](crate::Health).
    pub tracking_bcast: bool,
    /// `SPUBLISH` (sharded pub/sub) exists.
    pub sharded_pubsub: bool,
    /// `WAIT` exists.
    pub wait: bool,
    /// `CONFIG GET` answered.
    pub config_get: bool,
    /// `SET ... IFEQ` is there (Valkey 8.1+, Redis 8.4+).
    pub set_ifeq: bool,
    /// `DELEX key IFEQ value` is there (Redis 8.4+).
    pub delex: bool,
    /// `DELIFEQ key value` is there (Valkey 9+).
    pub delifeq: bool,
}

impl Capabilities {
    /// How a lock's lease is renewed: [`LockWrite::SetIfEq`] where the server has
    /// `SET ... IFEQ`, else [`LockWrite::Script`].
    ///
    /// ```
    /// # let caps = stampede_guard::Capabilities::__example();
    /// assert_eq!(caps.renewal(), stampede_guard::LockWrite::SetIfEq);
    /// ```
    pub fn renewal(&self) -> LockWrite {
        if self.set_ifeq {
            LockWrite::SetIfEq
        } else {
            LockWrite::Script
        }
    }

    /// How a lock is released without a write: [`LockWrite::DelEx`] (Redis 8.4+) or
    /// [`LockWrite::DelIfEq`] (Valkey 9+) where the server has them, else
    /// [`LockWrite::Script`]. A release with a value (the computation's result) is always a
    /// script: it writes the value under the fencing rule.
    ///
    /// ```
    /// # let caps = stampede_guard::Capabilities::__example();
    /// assert_eq!(caps.release(), stampede_guard::LockWrite::Script);
    /// ```
    pub fn release(&self) -> LockWrite {
        if self.delex {
            LockWrite::DelEx
        } else if self.delifeq {
            LockWrite::DelIfEq
        } else {
            LockWrite::Script
        }
    }

    /// One line per missing capability: what the crate does instead, and what that costs.
    /// Empty on a server that has everything.
    ///
    /// ```
    /// # let caps = stampede_guard::Capabilities::__example();
    /// assert!(caps.fallbacks().iter().any(|line| line.contains("DELEX")));
    /// ```
    pub fn fallbacks(&self) -> Vec<&'static str> {
        let mut lines = Vec::new();
        let mut say = |missing: bool, line| {
            if missing {
                lines.push(line);
            }
        };
        say(!self.resp3, "no RESP3: wake-ups and the near tier's feed cannot subscribe (Redis 5 and older are not supported)");
        say(
            !self.tracking_bcast,
            "no CLIENT TRACKING BCAST: the near tier reads a copy again once it is max_staleness old",
        );
        say(
            !self.sharded_pubsub,
            "no SPUBLISH: a Redis Cluster cannot wake waiters (one server uses PUBLISH)",
        );
        say(
            !self.wait,
            "no WAIT: wait_for_replicas is refused at build()",
        );
        say(
            !self.config_get,
            "no CONFIG GET: the eviction-policy warning is not given",
        );
        say(!self.set_ifeq, "no SET IFEQ: lock renewal by script");
        say(
            !self.delex && !self.delifeq,
            "no DELEX/DELIFEQ: lock release by script",
        );
        lines
    }

    /// A server that has everything but `DELEX`/`DELIFEQ` (Valkey 8.1), for examples.
    #[doc(hidden)]
    pub fn __example() -> Self {
        Capabilities {
            server: ServerKind::Valkey,
            version: "8.1.1".to_owned(),
            lua: true,
            resp3: true,
            tracking_bcast: true,
            sharded_pubsub: true,
            wait: true,
            config_get: true,
            set_ifeq: true,
            delex: false,
            delifeq: false,
        }
    }
}

impl std::fmt::Display for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} (lua {}, resp3 {}, tracking bcast {}, spublish {}, wait {}, config get {}; \
             renewal by {}, release by {})",
            self.server,
            self.version,
            self.lua,
            self.resp3,
            self.tracking_bcast,
            self.sharded_pubsub,
            self.wait,
            self.config_get,
            self.renewal(),
            self.release()
        )
    }
}

impl serde::Serialize for Capabilities {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Capabilities", 14)?;
        s.serialize_field("server", &self.server)?;
        s.serialize_field("version", &self.version)?;
        s.serialize_field("lua", &self.lua)?;
        s.serialize_field("resp3", &self.resp3)?;
        s.serialize_field("tracking_bcast", &self.tracking_bcast)?;
        s.serialize_field("sharded_pubsub", &self.sharded_pubsub)?;
        s.serialize_field("wait", &self.wait)?;
        s.serialize_field("config_get", &self.config_get)?;
        s.serialize_field("set_ifeq", &self.set_ifeq)?;
        s.serialize_field("delex", &self.delex)?;
        s.serialize_field("delifeq", &self.delifeq)?;
        s.serialize_field("renewal", &self.renewal())?;
        s.serialize_field("release", &self.release())?;
        s.serialize_field("fallbacks", &self.fallbacks())?;
        s.end()
    }
}

/// Why a probe found no capabilities.
#[derive(Debug)]
pub(crate) enum ProbeError {
    /// The server could not be reached, or did not answer in time: judged later, at the next
    /// connection.
    Unreached(redis::RedisError),
    /// Something answered, but not as Redis does (an HTTP server, an echo): `what` says what.
    NotRedis(String),
    /// The server speaks Redis but cannot be judged now: it is `LOADING` its dataset, `BUSY`
    /// with a script, or refuses this login every command (`NOAUTH`: the calls say so, typed).
    /// Probed again later, never read as "not allowed".
    Unjudged(String),
}

impl ProbeError {
    /// A connection that could not be made: garbage in the handshake is "not Redis", anything
    /// else (refused, timed out, reset) is "not reached".
    pub(crate) fn from_connect(e: redis::RedisError) -> Self {
        if answered_garbage(&e) {
            ProbeError::NotRedis(format!("its answer does not parse ({e})"))
        } else {
            ProbeError::Unreached(e)
        }
    }

    /// The probe did not finish in time.
    pub(crate) fn timed_out() -> Self {
        ProbeError::Unreached(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "capability probe timed out",
        )))
    }
}

/// The commands whose presence `COMMAND INFO` is asked about, in this order.
const COMMANDS: [&str; 6] = ["client", "spublish", "wait", "delex", "delifeq", "set"];

/// The probe's pipeline: one round trip, each reply read on its own.
fn pipeline() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("HELLO");
    pipe.cmd("INFO").arg("server");
    pipe.cmd("COMMAND").arg("INFO").arg(&COMMANDS);
    pipe.cmd("COMMAND").arg("DOCS").arg("set");
    pipe.cmd("EVAL").arg("return 1").arg(1).arg(PROBE_KEY);
    pipe.cmd("CONFIG").arg("GET").arg("maxmemory-policy");
    pipe
}

/// Asks the server over `conn`, within `timeout`.
pub(crate) async fn probe<C: ConnectionLike>(
    conn: &mut C,
    timeout: Duration,
) -> Result<Capabilities, ProbeError> {
    let asked = tokio::time::timeout(timeout, pipeline().query_async::<Vec<Value>>(conn)).await;
    let replies = match asked {
        Ok(Ok(replies)) => replies,
        Ok(Err(e)) if answered_garbage(&e) => {
            return Err(ProbeError::NotRedis(format!(
                "its answer does not parse ({e})"
            )))
        }
        Ok(Err(e)) => return Err(ProbeError::Unreached(e)),
        Err(_) => {
            return Err(ProbeError::Unreached(redis::RedisError::from(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "capability probe timed out"),
            )))
        }
    };
    decide(&Answers::read(replies))
}

/// An error that means bytes came back that are not RESP (or not the replies asked for).
fn answered_garbage(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType
    )
}

/// The probe's replies, as read (errors as `None` or `false`).
#[derive(Debug, Default)]
pub(crate) struct Answers {
    /// `HELLO`'s fields, if it answered with them.
    pub(crate) hello: Option<Vec<(String, String)>>,
    /// `INFO server`'s text.
    pub(crate) info: Option<String>,
    /// For each of [`COMMANDS`], whether `COMMAND INFO` knows it (`None`: not asked or refused).
    pub(crate) commands: Option<Vec<bool>>,
    /// `COMMAND DOCS set` mentions the `IFEQ` token.
    pub(crate) set_ifeq_documented: bool,
    /// The Lua probe ran and returned 1.
    pub(crate) lua: bool,
    /// `CONFIG GET` answered.
    pub(crate) config_get: bool,
    /// A reply said the server cannot answer now (its error code), so nothing is judged.
    pub(crate) busy: Option<String>,
    /// The first error code of any reply: a server that answers errors in RESP is Redis-like,
    /// even when it tells nothing else (`NOAUTH` to every command).
    pub(crate) error_code: Option<String>,
}

impl Answers {
    fn read(replies: Vec<Value>) -> Self {
        let code = |reply: &Value| match reply {
            Value::ServerError(e) => Some(e.code().to_owned()),
            _ => None,
        };
        let error_code = replies.iter().find_map(code);
        let busy = replies
            .iter()
            .filter_map(code)
            .find(|c| TRANSIENT.contains(&c.as_str()));
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or(Value::Nil);
        let hello = fields(&next());
        let info = text(&next());
        let commands = match next() {
            Value::Array(items) if items.len() == COMMANDS.len() => Some(
                items
                    .iter()
                    .map(|item| !matches!(item, Value::Nil))
                    .collect(),
            ),
            _ => None,
        };
        let set_ifeq_documented = mentions(&next(), "IFEQ");
        let lua = lua_ran(&next());
        let config_get = !matches!(next(), Value::ServerError(_) | Value::Nil);
        Answers {
            hello,
            info,
            commands,
            set_ifeq_documented,
            lua,
            config_get,
            busy,
            error_code,
        }
    }
}

/// Error codes of a server that cannot answer now, not of one that refuses.
const TRANSIENT: [&str; 5] = ["LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"];

/// Whether the Lua probe's reply shows that scripts run: it returned 1, or the user may run
/// `EVAL` but not touch the key it declared (`NOPERM` about keys, as for a user confined to
/// its namespace: the scripts then run on the keys it may touch). Refused to run `EVAL`
/// (`NOPERM ... 'eval' command`), an unknown command, scripting off: no Lua.
fn lua_ran(reply: &Value) -> bool {
    match reply {
        Value::Int(1) => true,
        Value::ServerError(e) => {
            let details = e.details().unwrap_or_default().to_ascii_lowercase();
            e.code() == "NOPERM" && details.contains("key") && !details.contains("command")
        }
        _ => false,
    }
}

/// A reply's text: a bulk, simple or verbatim string.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A map reply (RESP3) or a flat array of name/value pairs (RESP2), values as text (numbers
/// written out); nested values are skipped.
fn fields(value: &Value) -> Option<Vec<(String, String)>> {
    let as_text = |v: &Value| match v {
        Value::Int(n) => Some(n.to_string()),
        other => text(other),
    };
    let pairs: Vec<(&Value, &Value)> = match value {
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(items) if items.len() % 2 == 0 => {
            items.chunks(2).map(|pair| (&pair[0], &pair[1])).collect()
        }
        _ => return None,
    };
    Some(
        pairs
            .into_iter()
            .filter_map(|(k, v)| Some((text(k)?, as_text(v)?)))
            .collect(),
    )
}

/// Whether `token` appears (any case) as a string anywhere in `value`.
fn mentions(value: &Value, token: &str) -> bool {
    match value {
        Value::Array(items) | Value::Set(items) => items.iter().any(|v| mentions(v, token)),
        Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| mentions(k, token) || mentions(v, token)),
        other => text(other).is_some_and(|s| s.eq_ignore_ascii_case(token)),
    }
}

/// The value of `name:` in an `INFO` text.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim())
    })
}

/// `"8.1.1"` as (8, 1, 1); missing or unreadable parts count 0.
fn version_triple(version: &str) -> (u32, u32, u32) {
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.trim_start_matches('v').parse().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// The server and its version, from `INFO server` first (it names Dragonfly, Garnet and KeyDB,
/// which say `redis` in `HELLO`), then `HELLO`.
fn identify(answers: &Answers) -> Option<(ServerKind, String)> {
    let hello = |name: &str| {
        let fields = answers.hello.as_ref()?;
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if let Some(info) = &answers.info {
        let field = |name| info_field(info, name).map(str::to_owned);
        for (name, kind) in [
            ("dragonfly_version", ServerKind::Dragonfly),
            ("garnet_version", ServerKind::Garnet),
            ("valkey_version", ServerKind::Valkey),
        ] {
            if let Some(version) = field(name) {
                return Some((kind, version));
            }
        }
        if info.to_ascii_lowercase().contains("keydb") {
            return Some((
                ServerKind::KeyDb,
                field("redis_version").unwrap_or_default(),
            ));
        }
        if let Some(version) = field("redis_version") {
            let valkey = field("server_name").is_some_and(|s| s == "valkey")
                || hello("server").is_some_and(|s| s == "valkey");
            let kind = if valkey {
                ServerKind::Valkey
            } else {
                ServerKind::Redis
            };
            return Some((kind, version));
        }
    }
    let version = hello("version")?;
    let kind = match hello("server").as_deref() {
        Some("valkey") => ServerKind::Valkey,
        Some("dragonfly") => ServerKind::Dragonfly,
        _ => ServerKind::Redis,
    };
    Some((kind, version))
}

/// The capabilities the answers show: the decision itself, apart from any connection so that
/// it can be tested for servers not at hand (Redis 8.4's `DELEX`, Valkey 9's `DELIFEQ`).
pub(crate) fn decide(answers: &Answers) -> Result<Capabilities, ProbeError> {
    if let Some(code) = &answers.busy {
        return Err(ProbeError::Unjudged(code.clone()));
    }
    let Some((server, version)) = identify(answers) else {
        if let Some(code) = &answers.error_code {
            return Err(ProbeError::Unjudged(code.clone()));
        }
        return Err(ProbeError::NotRedis(
            "neither HELLO nor INFO server answered as Redis does".to_owned(),
        ));
    };
    let (major, minor, _) = version_triple(&version);
    let own_version = matches!(server, ServerKind::Redis | ServerKind::Valkey);
    let at_least = |want: (u32, u32)| own_version && (major, minor) >= want;
    // Without COMMAND INFO (refused), presence is judged by the version alone.
    let listed = |name: &str, by_version: bool| match &answers.commands {
        Some(found) => COMMANDS
            .iter()
            .position(|c| *c == name)
            .is_some_and(|i| found[i]),
        None => by_version,
    };
    let ifeq_by_version = match server {
        ServerKind::Valkey => at_least((8, 1)),
        ServerKind::Redis => at_least((8, 4)),
        _ => false,
    };
    let no_bcast = matches!(server, ServerKind::Dragonfly | ServerKind::Garnet);
    Ok(Capabilities {
        lua: answers.lua,
        resp3: answers.hello.is_some(),
        tracking_bcast: !no_bcast && listed("client", true),
        sharded_pubsub: listed("spublish", at_least((7, 0))),
        wait: listed("wait", server != ServerKind::Garnet),
        config_get: answers.config_get,
        set_ifeq: listed("set", true) && (answers.set_ifeq_documented || ifeq_by_version),
        delex: listed("delex", false),
        delifeq: listed("delifeq", false),
        server,
        version,
    })
}

/// The capabilities of one store's server, as last probed, shared by the store, its connection
/// (which probes again at the first answer after a lost connection) and the cache's handle.
#[derive(Debug)]
pub(crate) struct Probed {
    /// `None` until a probe answered.
    known: RwLock<Option<Capabilities>>,
    /// A probe is due at the next answer: none answered yet, or the connection was lost.
    due: AtomicBool,
}

impl Default for Probed {
    fn default() -> Self {
        Probed {
            known: RwLock::new(None),
            due: AtomicBool::new(true),
        }
    }
}

impl Probed {
    /// The capabilities last found, if any.
    pub(crate) fn get(&self) -> Option<Capabilities> {
        self.known.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How the lock's renewal goes (read on every renewal): the script until a probe answered.
    pub(crate) fn renewal(&self) -> LockWrite {
        self.path(Capabilities::renewal)
    }

    /// How the lock's release without a write goes.
    pub(crate) fn release(&self) -> LockWrite {
        self.path(Capabilities::release)
    }

    fn path(&self, of: fn(&Capabilities) -> LockWrite) -> LockWrite {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known.as_ref().map_or(LockWrite::Script, of)
    }

    /// Records `found`, logging it at INFO when it differs from what was known (the first
    /// probe, or a failover to another server).
    pub(crate) fn set(&self, found: Capabilities) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        if known.as_ref() == Some(&found) {
            return;
        }
        let fallbacks = found.fallbacks();
        tracing::info!(
            server = %found.server,
            version = %found.version,
            renewal = %found.renewal(),
            release = %found.release(),
            fallbacks = ?fallbacks,
            "Redis server capabilities: {found}"
        );
        if !found.lua {
            tracing::error!(
                "the Redis server runs no Lua scripts: every cache and lock call will fail \
                 ({}); enable scripting",
                lua_setting(found.server)
            );
        }
        *known = Some(found);
        self.due.store(false, Ordering::Release);
    }

    /// Whether a probe is due (none answered yet, or the connection was lost since), and a
    /// claim on it: the one caller that gets `true` runs it.
    pub(crate) fn take_due(&self) -> bool {
        self.due.swap(false, Ordering::AcqRel)
    }

    /// A probe is due at the next answer.
    pub(crate) fn make_due(&self) {
        self.due.store(true, Ordering::Release);
    }

    /// Probes over `conn` (which just answered) in the background; if the server does not
    /// answer the probe, `rearm` makes the next answer try again.
    pub(crate) fn reprobe<C, R>(self: &Arc<Self>, mut conn: C, timeout: Duration, rearm: R)
    where
        C: ConnectionLike + Send + 'static,
        R: FnOnce() + Send + 'static,
    {
        let probed = Arc::clone(self);
        tokio::spawn(async move {
            match probe(&mut conn, timeout).await {
                Ok(found) => probed.set(found),
                Err(ProbeError::NotRedis(what)) => {
                    tracing::warn!("the server behind the Redis URL is not Redis: {what}");
                }
                Err(ProbeError::Unreached(e)) => {
                    tracing::debug!(error = %e, "capability probe unanswered; again at the next answer");
                    rearm();
                }
                Err(ProbeError::Unjudged(code)) => {
                    tracing::debug!(code, "the server cannot be probed now");
                    // Not at once: a loading server answers every call with an error.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    rearm();
                }
            }
        });
    }
}

/// What `build()` makes of a probe: an error message for a server the crate cannot keep its
/// guarantees on (not Redis, no Lua, no `WAIT` while lock writes wait for replicas), `None`
/// for a server it can work with, or one that did not answer in time (probed again at its
/// first answer: building never waits for a server that is down).
pub(crate) fn refusal(
    probed: &Result<(), ProbeError>,
    known: Option<&Capabilities>,
    waits: bool,
) -> Option<String> {
    match (probed, known) {
        (Err(ProbeError::NotRedis(what)), _) => Some(format!(
            "the server at the Redis URL answered, but not as Redis does ({what}): check the \
             URL's host and port"
        )),
        (Err(ProbeError::Unreached(_) | ProbeError::Unjudged(_)), _) | (Ok(()), None) => None,
        (Ok(()), Some(caps)) if !caps.lua => Some(format!(
            "the Redis server ({} {}) runs no Lua scripts, and every lock and cache write of this \
             crate is one: {}",
            caps.server,
            caps.version,
            lua_setting(caps.server)
        )),
        (Ok(()), Some(caps)) if waits && !caps.wait => Some(format!(
            "wait_for_replicas is set, but the Redis server ({} {}) has no WAIT command",
            caps.server, caps.version
        )),
        (Ok(()), Some(_)) => None,
    }
}

/// The server setting that turns Lua on, as the error and the log name it.
pub(crate) fn lua_setting(server: ServerKind) -> &'static str {
    match server {
        ServerKind::Garnet => "Garnet: start it with --lua",
        ServerKind::Dragonfly => "Dragonfly: scripts run by default; check --default_lua_flags and the user's ACL",
        _ => "the EVAL command is disabled, renamed or refused to this user: an ACL user needs +@scripting",
    }
}

#[cfg(test)]
#[path = "capabilities_tests.rs"]
mod tests;
