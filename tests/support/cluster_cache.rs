//! A `Cache` on a test cluster in one call: the cluster twin of `cache.rs`. Needs `cluster`
//! declared beside it.

use stampede_guard::{Cache, CallOptions};

use super::cluster::RedisCluster;

/// A `Cache` in `namespace` on `cluster`, with `options`.
pub async fn cluster_cache(cluster: &RedisCluster, namespace: &str, options: CallOptions) -> Cache {
    Cache::builder()
        .redis_cluster(cluster.urls())
        .namespace(namespace)
        .options(options)
        .build()
        .await
        .expect("a cache on the test cluster")
}
