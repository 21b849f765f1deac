//! Whatever bytes sit under a cache key (another program's, a truncated write, an attacker's),
//! reading them must be a miss or a value: never a panic, never a huge allocation.
//! `stampede_guard::__fuzz_read_stored` exists only under `--cfg fuzzing`, which `cargo fuzz`
//! passes to every crate it builds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    stampede_guard::__fuzz_read_stored(bytes);
});
