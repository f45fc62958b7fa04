//! Byte sizes as every command-line tool of coli accepts them (`--ram-budget`, `--total-ram`).

/// Parses a byte size: a number (decimals allowed) with an optional suffix. `K`, `M`, `G`, `T`
/// and `KiB`, `MiB`, `GiB`, `TiB` are powers of 1024; `KB`, `MB`, `GB`, `TB` powers of 1000;
/// `B` or nothing means bytes. Case-insensitive; spaces between number and suffix allowed.
///
/// # Errors
/// A message naming the input and the accepted forms, for an empty string, a bad number, an
/// unknown suffix, or a value that does not fit in u64.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let bad = || format!("invalid size {s:?}: expected e.g. 1073741824, 512M, 1.5GiB, 2GB");
    if num.is_empty() {
        return Err(bad());
    }
    let mult: f64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad()),
    };
    if let (Ok(n), 1.0) = (num.parse::<u64>(), mult) {
        return Ok(n);
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = (v * mult).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("4kb").unwrap(), 4000);
        assert_eq!(parse_size("1.5 GiB").unwrap(), 1_610_612_736);
        assert_eq!(parse_size("2M").unwrap(), 2 * 1024 * 1024);
        assert_eq!(parse_size("3GB").unwrap(), 3_000_000_000);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        for bad in ["", "abc", "12Q", "1.2.3M", "-5", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
