//! One `MONITOR` line read back: whether a script ran the command, and its arguments unescaped
//! (for the chaos harness's replay and `tests/script_keys.rs`).

/// Splits one MONITOR line (`1700000000.123456 [0 lua] "SET" "k" "v\x01"`) into its source and
/// its arguments (unescaped bytes).
pub fn parse_monitor_line(line: &str) -> Option<(bool, Vec<Vec<u8>>)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let lua = line[open..close].ends_with(" lua");
    let mut args = Vec::new();
    let bytes = &line.as_bytes()[close + 1..];
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        i += 1;
        let mut arg = Vec::new();
        while i < bytes.len() && bytes[i] != b'"' {
            if bytes[i] == b'\\' && i + 1 < bytes.len() {
                let e = bytes[i + 1];
                i += 2;
                match e {
                    b'n' => arg.push(b'\n'),
                    b'r' => arg.push(b'\r'),
                    b't' => arg.push(b'\t'),
                    b'a' => arg.push(7),
                    b'b' => arg.push(8),
                    b'x' if i + 1 < bytes.len() => {
                        let hex = std::str::from_utf8(&bytes[i..i + 2]).ok()?;
                        arg.push(u8::from_str_radix(hex, 16).ok()?);
                        i += 2;
                    }
                    other => arg.push(other),
                }
            } else {
                arg.push(bytes[i]);
                i += 1;
            }
        }
        i += 1;
        args.push(arg);
    }
    Some((lua, args))
}
