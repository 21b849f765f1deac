//! Which backend a builder was given, and opening it.

use std::sync::Arc;

use crate::store::redis::RedisStore;
use crate::store::{MemoryStore, Store};
use crate::Error;

// Built once per cache or lock, so the size of a `redis::Client` (larger with the `tls` feature's
// TLS settings) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Memory,
    RedisUrl(String),
    RedisClient(redis::Client),
    /// Seed node URLs of a Redis Cluster.
    RedisCluster(Vec<String>),
}

impl Backend {
    /// A name for `Debug` output; never the URL, which may carry a password.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::RedisUrl(_) | Backend::RedisClient(_) => "redis",
            Backend::RedisCluster(_) => "redis cluster",
        }
    }

    /// Opens the store. A single Redis server connects lazily: this does not wait for it. A
    /// cluster is asked for its topology now.
    pub(crate) async fn open(self) -> Result<Arc<dyn Store>, Error> {
        let client = match self {
            Backend::Memory => return Ok(Arc::new(MemoryStore::default())),
            Backend::RedisCluster(seeds) => {
                let store = RedisStore::connect_cluster(&seeds)
                    .await
                    .map_err(|e| Error::backend("connect", e))?;
                return Ok(Arc::new(store));
            }
            Backend::RedisUrl(url) => redis::Client::open(url.as_str()).map_err(|e| {
                // The parse error is not quoted: it may repeat the URL, password included.
                Error::Config(format!("the Redis URL does not parse ({:?})", e.kind()))
            })?,
            Backend::RedisClient(client) => client,
        };
        let store = RedisStore::connect(client).map_err(|e| Error::backend("connect", e))?;
        Ok(Arc::new(store))
    }
}
