//! The lazy Redis Cluster connection: made at the first call rather than at `build()`, so a cache
//! built while the cluster is down works once it is up.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A cluster connection made on first use. A failed attempt is not kept: the next call makes
/// a new one, so a cache built while the cluster is down works once it is up.
#[derive(Clone)]
pub(crate) struct LazyCluster {
    /// Boxed in an `Arc`: the client is large (hundreds of bytes) and cloned with every call.
    client: Arc<ClusterClient>,
    /// Shared by every clone, so the whole store makes one connection, not one per call.
    conn: Arc<tokio::sync::OnceCell<ClusterConnection>>,
}

impl LazyCluster {
    /// Wraps `client`; nothing is asked of the cluster yet.
    pub(crate) fn new(client: ClusterClient) -> Self {
        LazyCluster {
            client: Arc::new(client),
            conn: Arc::default(),
        }
    }

    /// The connection, made now if there is none yet (concurrent callers share one attempt).
    pub(crate) async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

impl ConnectionLike for LazyCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut conn = self.get().await?;
            conn.req_packed_command(cmd).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.get().await?;
            conn.req_packed_commands(pipeline, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
