//! Sizes as the tools print them.

/// `b` bytes in the largest binary unit (B, KiB, MiB, GiB, TiB) that keeps the number at least
/// 1: whole bytes below 1 KiB, else two decimals ("512 B", "3.38 MiB", "1.50 GiB").
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    // Where the printed figure would round up to 1024 (1023.6 B, 1023.996 KiB), the next unit.
    while v >= if u == 0 { 1023.5 } else { 1023.995 } && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_size_in_the_unit_that_keeps_it_at_least_one() {
        assert_eq!(super::bytes(0.0), "0 B");
        assert_eq!(super::bytes(1023.0), "1023 B");
        assert_eq!(super::bytes(1024.0), "1.00 KiB");
        assert_eq!(super::bytes(1023.6), "1.00 KiB");
        assert_eq!(super::bytes(1023.996 * 1024.0), "1.00 MiB");
        assert_eq!(super::bytes(3_538_944.0), "3.38 MiB");
        assert_eq!(super::bytes(45_219_840.0), "43.12 MiB");
        assert_eq!(super::bytes((3u64 << 30) as f64), "3.00 GiB");
        assert_eq!(super::bytes((5u64 << 50) as f64), "5120.00 TiB");
    }
}
