//! The Redis store: generic over `redis::aio::ConnectionLike`, so the same code serves one server
//! through a `ConnectionManager` and Redis Cluster through the cluster connection (both reconnect
//! by themselves; the cluster one also follows slot moves and failovers).
//!
//! One file per concept:
//! - `connection.rs`: how to reach Redis ([`ConnectionOptions`]) and the settings of every kind
//!   of connection made from it;
//! - `store.rs`: [`RedisStore`], the store operations over the data connection;
//! - `coalesce.rs`: the single-key read of a value with its epochs, alone or coalesced with the
//!   reads that arrive while one is out into one `MGET`;
//! - `mget.rs`: `MGET` on one server (sized, read in place) and across a cluster's slots;
//! - `held_epoch.rs`: the namespace's epoch held under tracking, so a hit reads its value alone;
//! - `cluster.rs`: the lazy Redis Cluster connection;
//! - `pubsub.rs`: wake-up subscriptions, counted per channel;
//! - `replicas.rs`: lock and fencing writes that wait for replicas (`WAIT`);
//! - `scripts.rs` and `scripts/`: the Lua scripts, each beside the typed call that builds its
//!   KEYS and ARGV and reads its reply;
//! - `lock_writes.rs`: the lock's renewal and release without Lua, where the server allows;
//! - `feed.rs`: the near tier's invalidation feed;
//! - `capabilities.rs`: what the server allows, probed once per connection, and the fallbacks;
//! - `classify.rs`: the kind of each error the client reports, decided once;
//! - `clock.rs`: the server's clock, as this process estimates it;
//! - `eviction.rs`: the warning about a server that may evict lock keys;
//! - `traced.rs`: a client span per request, with the OpenTelemetry Redis attributes.
//!
//! Explained in the guide: `docs/how-it-works.md` and `docs/cluster-and-redlock.md` (Redis Cluster).

mod capabilities;
mod classify;
mod clock;
mod cluster;
mod coalesce;
mod connection;
mod eviction;
mod feed;
mod held_epoch;
mod lock_writes;
mod mget;
mod pubsub;
mod replicas;
mod scripts;
mod store;
mod traced;

pub(crate) use capabilities::{refusal, ProbeError, Probed};
pub use capabilities::{Capabilities, LockWrite, ServerKind};
pub(crate) use classify::classify;
pub use connection::ConnectionOptions;
pub(crate) use feed::{Feed, FeedSink, Source};
pub(crate) use scripts::named_shas as script_names;
pub(crate) use store::{near_channels, RedisStore, CHUNK_KEYS};
