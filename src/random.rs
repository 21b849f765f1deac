//! Every random draw of the crate: owner tokens, backoff jitter, XFetch's early refresh. One
//! place, so that the deterministic simulation (`tests/sim/`, feature `simulation`) can seed
//! them all and replay a schedule exactly from its seed.
//!
//! Without the feature each draw goes straight to the OS-seeded thread RNG (`rand::rng()`), as
//! before: no check, no branch. With it, a draw first looks for a seeded RNG installed on this
//! thread ([`seed_thread`]); the simulation runs on one thread (tokio's current-thread runtime),
//! so every task it runs draws from that one sequence, in the simulation's own order.

#[cfg(feature = "simulation")]
thread_local! {
    /// The simulation's RNG for this thread; `None` outside a simulation (the OS's then).
    static SEEDED: std::cell::RefCell<Option<rand::rngs::StdRng>> =
        const { std::cell::RefCell::new(None) };
}

/// From now on, every draw on this thread comes from an RNG seeded with `seed` (`None`: the
/// OS's again). Only the simulation calls it (`__private::sim::seed_thread`).
#[cfg(feature = "simulation")]
pub(crate) fn seed_thread(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.with_borrow_mut(|rng| *rng = seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// Runs `draw` on the seeded RNG of this thread if the simulation installed one, else on the
/// OS-seeded thread RNG.
#[cfg(feature = "simulation")]
fn with_rng<T>(draw: impl FnOnce(&mut dyn rand::Rng) -> T) -> T {
    SEEDED.with_borrow_mut(|seeded| match seeded {
        Some(rng) => draw(rng),
        None => draw(&mut rand::rng()),
    })
}

#[cfg(not(feature = "simulation"))]
#[inline(always)]
fn with_rng<T>(draw: impl FnOnce(&mut dyn rand::Rng) -> T) -> T {
    draw(&mut rand::rng())
}

/// How the crate hashes keys where the hash decides something (the near tier's stripes, an
/// order of iteration): std's `RandomState`, seeded by the OS, so that no one can choose keys
/// that collide. Under the simulation a fixed hasher instead: two keys that shared a stripe in
/// one run and not in the next would make one seed give two histories.
#[cfg(not(feature = "simulation"))]
pub(crate) type Hasher = std::collections::hash_map::RandomState;
#[cfg(feature = "simulation")]
pub(crate) type Hasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// A uniform `u64` in `0..=max`.
pub(crate) fn up_to(max: u64) -> u64 {
    use rand::RngExt;
    with_rng(|rng| rng.random_range(0..=max))
}

/// A uniform draw from `[0, 1)`.
pub(crate) fn unit() -> f64 {
    use rand::RngExt;
    with_rng(|rng| rng.random::<f64>())
}

/// 128 random bits, for a version-4 UUID (an owner token).
pub(crate) fn uuid_v4() -> uuid::Uuid {
    let bits = with_rng(|rng| {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        bytes
    });
    uuid::Builder::from_random_bytes(bits).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_their_ranges_and_tokens_are_v4() {
        for _ in 0..1000 {
            assert!(up_to(7) <= 7);
            let u = unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(uuid_v4().get_version_num(), 4);
        assert_ne!(uuid_v4(), uuid_v4());
    }

    #[cfg(feature = "simulation")]
    #[test]
    fn a_seeded_thread_draws_the_same_sequence_again() {
        let draws = || {
            (0..50)
                .map(|_| (up_to(1 << 40), uuid_v4()))
                .collect::<Vec<_>>()
        };
        seed_thread(Some(7));
        let first = draws();
        seed_thread(Some(7));
        let second = draws();
        seed_thread(None);
        assert_eq!(first, second);
        assert_ne!(first, draws());
    }
}
