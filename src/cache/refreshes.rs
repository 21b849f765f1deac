//! The background refreshes running in this process: at most one per key, and after a refresh
//! that found the key's lock held elsewhere, none until that holder's lease would have run out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::sync::lock;

/// Key → refresh state in this process.
#[derive(Debug, Default)]
pub(crate) struct Refreshes {
    /// `None`: a refresh runs here. `Some(t)`: another process holds the lock; try again after
    /// `t`. The `std` mutex is never held across an `.await`.
    map: Mutex<HashMap<String, Option<Instant>>>,
}

impl Refreshes {
    /// Claims the key's refresh for this process, unless one runs or is held off.
    pub(crate) fn claim(self: &Arc<Self>, key: &str) -> Option<Claim> {
        let mut map = lock(&self.map);
        let now = crate::time::now();
        if let Some(state) = map.get(key) {
            match state {
                None => return None,
                Some(until) if *until > now => return None,
                Some(_) => {}
            }
        }
        map.insert(key.to_owned(), None);
        Some(Claim {
            refreshes: Arc::clone(self),
            key: key.to_owned(),
            hold_off: None,
        })
    }
}

/// A claimed refresh; releases the claim when dropped (finished, failed, panicked or cancelled).
pub(crate) struct Claim {
    refreshes: Arc<Refreshes>,
    key: String,
    pub(crate) hold_off: Option<Instant>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut map = lock(&self.refreshes.map);
        match self.hold_off {
            Some(until) => {
                map.insert(std::mem::take(&mut self.key), Some(until));
            }
            None => {
                map.remove(&self.key);
            }
        }
        // Forget hold-offs that have passed, so the map stays as small as the keys in play.
        let now = crate::time::now();
        map.retain(|_, state| state.is_none_or(|until| until > now));
    }
}
