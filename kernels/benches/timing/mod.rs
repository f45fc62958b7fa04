//! Timing shared by the kernel benches.

use std::time::{Duration, Instant};

/// Times `f` for about `budget`, returning the best-of-batches seconds per call (batches of
/// >= 2 ms: the best batch is the least disturbed by other processes on a shared machine).
pub fn best_seconds(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    while start.elapsed() < budget {
        let t = Instant::now();
        let mut k = 0;
        while t.elapsed() < Duration::from_millis(2) {
            f();
            k += 1;
        }
        best = best.min(t.elapsed().as_secs_f64() / k as f64);
    }
    best
}
