//! A `tracing` writer that keeps what it is given, for the tests that read what the crate logs.

use std::sync::{Arc, Mutex};

/// Every byte written to it, shared by its clones (one goes to the subscriber, one stays with
/// the test).
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
