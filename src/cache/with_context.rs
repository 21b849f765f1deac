//! The `get_or_compute` calls that hand the computation its key and a clone of a context (the
//! database pool, the application state), so that a handler does not clone them itself before
//! `move || async move`: the computation must be `'static` (a background refresh runs it
//! after the handler returned), and these calls make the owned copies it needs.

use std::future::Future;
use std::time::Duration;

use crate::cache::bounds::{CacheValue, ComputeFailure};
use crate::cache::Cache;
use crate::wire::codec::Codec;
use crate::Error;

impl<C: Codec> Cache<C> {
    /// [`get_or_compute`](Self::get_or_compute), with `f` given the key (owned) and a clone of
    /// `ctx`. What the computation uses comes in as arguments, so nothing is cloned by hand:
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// struct Db;
    /// impl Db {
    ///     async fn monthly_report(&self, month: &str) -> Result<String, std::io::Error> {
    ///         Ok(format!("report for {month}"))
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let (cache, db) = (Cache::in_memory(), Arc::new(Db));
    /// let month = "2019-05";
    /// // Instead of `let db = db.clone(); let key = month.to_owned();` and `move || async move`:
    /// let report = cache
    ///     .get_or_compute_with(month, Duration::from_secs(300), &db, |month, db| async move {
    ///         db.monthly_report(&month).await
    ///     })
    ///     .await?;
    /// assert_eq!(report, "report for 2019-05");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Those of [`get_or_compute`](Self::get_or_compute).
    pub async fn get_or_compute_with<D, T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        ctx: &D,
        f: F,
    ) -> Result<T, Error>
    where
        D: Clone + Send + 'static,
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(String, D) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let (owned, ctx) = (key.to_owned(), ctx.clone());
        self.get_or_compute(key, ttl, move || f(owned, ctx)).await
    }

    /// [`get_or_compute_many`](Self::get_or_compute_many), with `f` given the missing keys and
    /// a clone of `ctx` on each call (a batch may call it more than once: see there).
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let (cache, prices) = (Cache::in_memory(), Arc::new(vec![10u64, 20, 30]));
    /// let months = ["2019-01", "2019-02"];
    /// let totals: Vec<u64> = cache
    ///     .get_or_compute_many_with(months, Duration::from_secs(300), &prices, |missing, prices| async move {
    ///         Ok::<_, std::io::Error>(missing.into_iter().map(|m| (m, prices[0])).collect::<Vec<_>>())
    ///     })
    ///     .await
    ///     .into_iter()
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(totals, [10, 10]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_or_compute_many_with<K, D, T, E, F, Fut, I>(
        &self,
        keys: K,
        ttl: Duration,
        ctx: &D,
        f: F,
    ) -> Vec<Result<T, Error>>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
        D: Clone + Send + Sync + 'static,
        T: CacheValue,
        E: ComputeFailure,
        F: Fn(Vec<String>, D) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, E>> + Send + 'static,
        I: IntoIterator<Item = (String, T)>,
    {
        let ctx = ctx.clone();
        self.get_or_compute_many(keys, ttl, move |missing| f(missing, ctx.clone()))
            .await
    }
}
