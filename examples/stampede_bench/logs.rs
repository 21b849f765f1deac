//! The workers' stderr: forwarded to the parent's, line by line, while counting the WARN and
//! ERROR lines of their logs (`"warn_lines"`: issue 21 wants at most 10 per process during an
//! outage, not one per failed call).

use std::io::{BufRead, BufReader, Read, Write};
use std::thread::JoinHandle;

/// Forwards `stderr` to the parent's stderr until it closes (the worker exited) and counts the
/// log lines at WARN or ERROR on the way.
pub(crate) fn forward_and_count(stderr: impl Read + Send + 'static) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut line = Vec::new();
        let mut counted = 0;
        loop {
            line.clear();
            // Bytes, not `lines()`: a line that is not UTF-8 is forwarded too, not the end.
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return counted,
                Ok(_) => {}
            }
            if is_warn_or_error(&String::from_utf8_lossy(&line)) {
                counted += 1;
            }
            // The parent's stderr gone is no reason to stop counting.
            let _ = std::io::stderr().lock().write_all(&line);
        }
    })
}

/// The count of a forwarder whose worker has exited; 0 if it panicked (it has nothing that can).
pub(crate) fn counted(forwarder: JoinHandle<u64>) -> u64 {
    forwarder.join().unwrap_or(0)
}

/// A line of tracing-subscriber's `fmt` at WARN or ERROR: `<time>  WARN <target>: ...` (the
/// level right-aligned in five columns, without colours: the example builds it without the
/// `ansi` feature).
fn is_warn_or_error(line: &str) -> bool {
    line.contains(" WARN ") || line.contains(" ERROR ")
}
