//! What the cache holds for one key, told without computing, refreshing or waiting
//! ([`Cache::inspect`](crate::Cache::inspect)): for on-call. One read of the value with its
//! epochs and one look at the lock, sent at once; the entry is judged by the very functions a
//! call judges it with (`fetch.rs`: alive by its epochs, worth by its freshness), so what it
//! says is what the next call would find, unless a write of the key (or a tag or a clear) waits
//! in this instance's auto-recovery queue: a call replays it first, and inspect does not.
//!
//! Read-only on the server and in the tiers: it takes no lock, replays no queued write, fills
//! no tier and counts nothing in [`Stats`](crate::Stats). Like every read, it notes the epochs
//! it read, so a computation of this process that began before a raise it saw is not shared
//! with later calls.
//!
//! Explained in the guide: `docs/observability.md` (Inspecting a key).

use std::time::Duration;

use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::freshness::Worth;
use crate::store::{LockPeek, LockStoreExt, StoreExt};
use crate::wire::codec::Codec;
use crate::wire::envelope::Envelope;
use crate::wire::key::EntryKeys;
use crate::Error;

/// What [`Cache::inspect`](crate::Cache::inspect) found for a key: the stored value and where
/// it stands for this handle, the lock and its holder, the fencing counter, and this
/// instance's near copy. Each is as it was when read; nothing was computed or changed.
///
/// # Redaction
///
/// Serialized (for an admin route: [`web::inspector`](crate::web::inspector) with feature
/// `axum`), it shows the key and the value's tags only as hashes (`key_hash`, `tags`: the
/// first 16 hex digits of a UUID v5 of the text), as keys are kept out of logs and metrics:
/// a key often holds a user's or a tenant's id. [`show_keys`](Self::show_keys) asks for them in
/// clear. The Rust fields always hold them in clear (the caller gave the key).
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = stampede_guard::Cache::in_memory();
/// let _ = cache.set("2019-05", &1234u64, Duration::from_secs(60)).await?;
/// let seen = cache.inspect("2019-05").await?;
/// let value = seen.value.as_ref().expect("stored");
/// assert_eq!(value.state, stampede_guard::Standing::Fresh);
/// assert!(value.fresh_left <= Duration::from_secs(60));
/// assert!(seen.lock.is_none(), "nobody computes it");
/// let json = serde_json::to_string(&seen).unwrap();
/// assert!(!json.contains("2019-05"), "the key is redacted: {json}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The key, as given.
    pub key: String,
    /// The stored value, if one is stored and this cache can read it.
    pub value: Option<StoredValue>,
    /// Why the bytes under the key are not a value of this cache (another codec, another
    /// format version, not an envelope); `None` when there are none or they are.
    pub unreadable: Option<String>,
    /// The lock, if someone holds it (a computation of the key is running, here or elsewhere).
    pub lock: Option<LockHolder>,
    /// The fencing counter: the last token handed out for the key (by an acquisition of its
    /// lock, a `set` or an invalidation); a computation whose token is below it will have its
    /// write refused. `None` when none is kept (nothing was locked, set or invalidated within
    /// the counter's retention).
    pub fence: Option<u64>,
    /// This instance's near copy of the key, if it has a near tier and the tier holds one.
    pub near: Option<NearCopy>,
    /// Whether serializing shows the key and the tags in clear ([`show_keys`](Self::show_keys)).
    show_keys: bool,
}

/// A stored value as [`Cache::inspect`](crate::Cache::inspect) found it. The windows are
/// counted by the inspecting handle's options ([`stale_for`](crate::CallOptions::stale_for),
/// [`fail_safe_for`](crate::CallOptions::fail_safe_for)), as its calls judge the value; each is
/// what is left of it from now, zero once it is past.
///
/// ```
/// use stampede_guard::{CallOptions, Standing};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// tokio::time::pause();
/// let cache = stampede_guard::Cache::in_memory()
///     .with_options(CallOptions::default().stale_for(Duration::from_secs(30)));
/// let _ = cache.set("2019-05", &1234u64, Duration::from_secs(60)).await?;
/// tokio::time::advance(Duration::from_secs(70)).await;
/// let value = cache.inspect("2019-05").await?.value.expect("stored");
/// assert_eq!(value.state, Standing::Stale);
/// assert_eq!(value.fresh_left, Duration::ZERO);
/// assert_eq!(value.stale_left, Duration::from_secs(20));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredValue {
    /// Where it stands for this handle: what a call would do with it.
    pub state: Standing,
    /// A remembered failure (negative caching) rather than a value.
    pub remembered_failure: bool,
    /// Invalidated by a tag or a [`clear`](crate::Cache::clear) since it was born: a call
    /// computes over it ([`state`](Self::state) is then [`Standing::Invalidated`]).
    pub invalidated: bool,
    /// How long ago its computation started (or the `set` was made), by the namespace's clock;
    /// `None` on the embedded store, which counts births rather than timing them, and for a
    /// value written before births were recorded.
    pub age: Option<Duration>,
    /// What is left of its freshness (its TTL); for a fail-safe copy, of its throttle.
    pub fresh_left: Duration,
    /// What is left until its stale window ends (its freshness included).
    pub stale_left: Duration,
    /// What is left until its fail-safe window ends (both others included): past it, a value
    /// written with the same options is gone from the store.
    pub fail_safe_left: Duration,
    /// How long the computation that produced it took (XFetch's delta).
    pub compute_time: Duration,
    /// The fencing token it was written under (0 for a plain `set`).
    pub fence: u64,
    /// Its tags.
    pub tags: Vec<String>,
    /// Its stored size in bytes (envelope and payload).
    pub bytes: usize,
}

/// Where a stored value stands for the inspecting handle: what its next call does with it.
///
/// ```
/// use stampede_guard::Standing;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = stampede_guard::Cache::in_memory();
/// let _ = cache.set("2019-05", &1234u64, Duration::from_secs(60)).await?;
/// let _ = cache.clear().await?;
/// let value = cache.inspect("2019-05").await?.value.expect("still stored");
/// assert_eq!(value.state, Standing::Invalidated);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Standing {
    /// Within its TTL: served.
    Fresh,
    /// Past its TTL, within the stale window: served, and refreshed in the background.
    Stale,
    /// Past its stale window, within its fail-safe window: computed over, kept as the
    /// fallback if the computation fails.
    FailSafe,
    /// A fail-safe copy written after a failed computation, within its throttle: served as the
    /// fallback without calling the source.
    Throttled,
    /// Past every window this handle has: computed over, as a miss.
    Expired,
    /// Invalidated by a tag or a clear: computed over, as a miss.
    Invalidated,
}

impl Standing {
    /// The name it is serialized as: `fresh`, `stale`, `fail_safe`, `throttled`, `expired`,
    /// `invalidated`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::Standing::FailSafe.as_str(), "fail_safe");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Fresh => "fresh",
            Standing::Stale => "stale",
            Standing::FailSafe => "fail_safe",
            Standing::Throttled => "throttled",
            Standing::Expired => "expired",
            Standing::Invalidated => "invalidated",
        }
    }
}

/// The holder of a key's lock, as [`Cache::inspect`](crate::Cache::inspect) found it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = stampede_guard::Cache::in_memory();
/// let guard = cache.lock("nightly-sync")?.acquire().await?;
/// let holder = cache.inspect("nightly-sync").await?.lock.expect("held");
/// assert_eq!(holder.fencing_token, Some(guard.fencing_token()));
/// assert!(holder.lease_left.is_some());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// What is left of its lease (it is renewed while its holder runs); `None`: no expiry.
    pub lease_left: Option<Duration>,
    /// The fencing counter read with the lock: the holder's token, unless a `set` or an
    /// invalidation of the key came since it took the lock (then its write will be refused).
    pub fencing_token: Option<u64>,
}

/// This instance's near copy of a key ([`CacheBuilder::near_cache`](crate::CacheBuilder::near_cache)).
///
/// ```no_run
/// use stampede_guard::{Cache, NearCacheOptions};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::builder()
///     .redis_url("redis://127.0.0.1:6379/0")
///     .near_cache(NearCacheOptions::new(10_000))
///     .build()
///     .await?;
/// let ttl = Duration::from_secs(300);
/// let _: u64 = cache.get_or_compute("2019-05", ttl, || async { Ok::<_, std::io::Error>(1234) }).await?;
/// if let Some(copy) = cache.inspect("2019-05").await?.near {
///     println!("held for {:?}, served from memory: {}", copy.held_for, copy.servable);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NearCopy {
    /// How long ago it went into the tier.
    pub held_for: Duration,
    /// The fencing token of the write it is a copy of (as [`StoredValue::fence`]).
    pub fence: u64,
    /// Whether a read now is answered by it without a request: fresh, its tier's feed
    /// proven, its epochs held and outlived. Otherwise it is only held (see
    /// [`serve_while_down`](crate::NearCacheOptions::serve_while_down)) until it is dropped.
    pub servable: bool,
}

impl Inspection {
    /// The same inspection, serialized with the key and the tags in clear (`true`) or as
    /// hashes (`false`, the default).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let seen = cache.inspect("2019-05").await?.show_keys(true);
    /// let json = serde_json::to_string(&seen).unwrap();
    /// assert!(json.contains(r#""key":"2019-05""#), "{json}");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn show_keys(mut self, show: bool) -> Self {
        self.show_keys = show;
        self
    }

    /// The key's hash as serialized (`key_hash`): the first 16 hex digits of the UUID v5 (OID
    /// namespace) of the key, the same on every instance and release, so that an on-call can
    /// match it with [`Inspection::hash_of`] of a key they suspect.
    ///
    /// ```
    /// use stampede_guard::Inspection;
    /// assert_eq!(Inspection::hash_of("2019-05").len(), 16);
    /// assert_ne!(Inspection::hash_of("2019-05"), Inspection::hash_of("2019-06"));
    /// ```
    pub fn hash_of(text: &str) -> String {
        let uuid = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, text.as_bytes());
        let mut hex = uuid.simple().to_string();
        hex.truncate(16);
        hex
    }

    /// `text` as serialized: in clear if asked, else its hash.
    fn shown(&self, text: &str) -> String {
        if self.show_keys {
            text.to_owned()
        } else {
            Inspection::hash_of(text)
        }
    }
}

/// Milliseconds, for the JSON.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `{"key": null or the key, "key_hash", "value", "unreadable", "lock", "fence", "near"}`;
/// durations as `..._ms` integers.
impl serde::Serialize for Inspection {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Inspection", 7)?;
        s.serialize_field("key", &self.show_keys.then_some(&self.key))?;
        s.serialize_field("key_hash", &Inspection::hash_of(&self.key))?;
        s.serialize_field("value", &self.value.as_ref().map(|v| ShownValue(v, self)))?;
        s.serialize_field("unreadable", &self.unreadable)?;
        s.serialize_field("lock", &self.lock.map(ShownLock))?;
        s.serialize_field("fence", &self.fence)?;
        s.serialize_field("near", &self.near.map(ShownNear))?;
        s.end()
    }
}

/// A stored value in an inspection's JSON, its tags shown as the inspection says.
struct ShownValue<'a>(&'a StoredValue, &'a Inspection);

impl serde::Serialize for ShownValue<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let ShownValue(v, inspection) = self;
        let tags: Vec<String> = v.tags.iter().map(|t| inspection.shown(t)).collect();
        let mut s = serializer.serialize_struct("StoredValue", 12)?;
        s.serialize_field("state", v.state.as_str())?;
        s.serialize_field("remembered_failure", &v.remembered_failure)?;
        s.serialize_field("invalidated", &v.invalidated)?;
        s.serialize_field("age_ms", &v.age.map(ms))?;
        s.serialize_field("fresh_left_ms", &ms(v.fresh_left))?;
        s.serialize_field("stale_left_ms", &ms(v.stale_left))?;
        s.serialize_field("fail_safe_left_ms", &ms(v.fail_safe_left))?;
        s.serialize_field("compute_ms", &ms(v.compute_time))?;
        s.serialize_field("fence", &v.fence)?;
        s.serialize_field("tags", &tags)?;
        s.serialize_field("bytes", &v.bytes)?;
        s.end()
    }
}

struct ShownLock(LockHolder);

impl serde::Serialize for ShownLock {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("LockHolder", 2)?;
        s.serialize_field("lease_left_ms", &self.0.lease_left.map(ms))?;
        s.serialize_field("fencing_token", &self.0.fencing_token)?;
        s.end()
    }
}

struct ShownNear(NearCopy);

impl serde::Serialize for ShownNear {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("NearCopy", 3)?;
        s.serialize_field("held_for_ms", &ms(self.0.held_for))?;
        s.serialize_field("fence", &self.0.fence)?;
        s.serialize_field("servable", &self.0.servable)?;
        s.end()
    }
}

impl<C: Codec> Engine<C> {
    /// [`Cache::inspect`](crate::Cache::inspect): the value with its epochs and the lock, read
    /// at once; then the epochs of tags the handle did not name, if the value has some.
    pub(crate) async fn inspect(&self, key: &str) -> Result<Inspection, Error> {
        let keys = EntryKeys::new(&self.core.namespace, key)?;
        self.clock_ready().await;
        let failed = |e| Error::backend("inspect", e);
        let (read, peek) = tokio::join!(self.read_with_epochs(&keys), self.core.store.peek(&keys));
        let ((bytes, mut epochs), peek) = (read.map_err(failed)?, peek.map_err(failed)?);
        let (value, unreadable) = match bytes {
            None => (None, None),
            Some(bytes) => match Envelope::decode(&bytes, self.core.codec.id()) {
                Err(foreign) => (None, Some(foreign.to_string())),
                Ok(envelope) => {
                    let entry = bare_entry(&envelope);
                    self.complete_epochs([&entry], &mut epochs)
                        .await
                        .map_err(failed)?;
                    let alive = self.alive_by(&entry, &epochs);
                    (Some(self.stored_value(&entry, alive, bytes.len())), None)
                }
            },
        };
        let LockPeek { holder, fence } = peek;
        Ok(Inspection {
            key: keys.user().to_owned(),
            value,
            unreadable,
            lock: holder.map(|(_, lease_left)| LockHolder {
                lease_left,
                fencing_token: fence,
            }),
            fence,
            near: (self.core.near().and_then(|near| near.peek(keys.user()))).map(|peek| NearCopy {
                held_for: peek.held_for,
                fence: peek.fence,
                servable: peek.servable,
            }),
            show_keys: false,
        })
    }

    /// Where `entry` stands for this handle, by the store's clock now.
    fn stored_value(&self, entry: &StoredEntry<()>, alive: bool, bytes: usize) -> StoredValue {
        let store = &self.core.store;
        let now = store.now_ms();
        let options = &self.options;
        let fresh_until = entry.fresh_until_ms;
        let stale_until = fresh_until.saturating_add(ms(options.stale_for));
        let kept_until = stale_until.saturating_add(ms(options.fail_safe_for));
        let left = |until: u64| Duration::from_millis(until.saturating_sub(now));
        let state = match self.worth_of(entry) {
            _ if !alive => Standing::Invalidated,
            Worth::Fresh | Worth::RefreshEarly => Standing::Fresh,
            Worth::Stale => Standing::Stale,
            Worth::Kept => Standing::Throttled,
            Worth::Dead if now < kept_until => Standing::FailSafe,
            Worth::Dead => Standing::Expired,
        };
        // Births are the server's clock in microseconds on Redis; the embedded store counts.
        let age = (store.clock().births_are_micros() && entry.born > 0)
            .then(|| Duration::from_millis(now.saturating_sub(entry.born / 1000)));
        StoredValue {
            state,
            remembered_failure: entry.value.is_err(),
            invalidated: !alive,
            age,
            fresh_left: left(fresh_until),
            stale_left: left(stale_until),
            fail_safe_left: left(kept_until),
            compute_time: Duration::from_millis(u64::from(entry.compute_ms)),
            fence: entry.fence,
            tags: entry.tags.clone(),
            bytes,
        }
    }
}

/// The entry `envelope` holds, without its payload: what judging it needs, whatever its type.
fn bare_entry(envelope: &Envelope<'_>) -> StoredEntry<()> {
    let value = if envelope.negative {
        Err(String::new())
    } else {
        Ok(())
    };
    StoredEntry::of(envelope, value)
}
