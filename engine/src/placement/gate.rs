//! The prefetch gate: whether a forward pass's lookahead reads the experts it predicts, from
//! the share of prefetched experts that demand requests used (see [`crate::prefetch`] for why
//! prefetch pays only when its reads are used).

/// Default [`crate::EngineOptions::prefetch_min_use`]: prefetch pauses while fewer than a
/// quarter of the experts it reads are used.
pub const DEFAULT_PREFETCH_MIN_USE: f64 = 0.25;

/// While prefetch is gated off, every this many forward passes still prefetches, to keep the
/// use estimate current.
pub const PREFETCH_PROBE_EVERY: u64 = 32;

/// Weight of the latest forward pass in the moving estimate of the share of prefetched experts
/// used.
pub const USE_EMA_WEIGHT: f64 = 0.5;

/// Decides, before each forward pass, whether the lookahead prefetches (see the module doc).
///
/// The estimate starts at 1 (prefetch on) and moves, after every pass that prefetched, toward
/// that pass's `prefetched experts used / prefetched experts read` (exponential moving
/// average, weight [`USE_EMA_WEIGHT`]). A pass prefetches when the estimate is at least
/// `min_use`, or every [`PREFETCH_PROBE_EVERY`]-th pass. `min_use` 0 keeps prefetch always on.
/// Only reads and cache contents change, never results.
#[derive(Clone, Debug)]
pub struct PrefetchGate {
    min_use: f64,
    estimate: f64,
    passes: u64,
    last_reads: u64,
    last_used: u64,
    skipped: u64,
}

impl PrefetchGate {
    /// A gate with threshold `min_use` (share of prefetched experts used, 0..=1).
    pub fn new(min_use: f64) -> PrefetchGate {
        PrefetchGate {
            min_use,
            estimate: 1.0,
            passes: 0,
            last_reads: 0,
            last_used: 0,
            skipped: 0,
        }
    }

    /// Whether the next forward pass prefetches, given the cache's counters of prefetch reads
    /// and of those used so far (cumulative).
    pub fn allow(&mut self, prefetch_reads: u64, prefetch_used: u64) -> bool {
        let reads = prefetch_reads.saturating_sub(self.last_reads);
        let used = prefetch_used.saturating_sub(self.last_used);
        (self.last_reads, self.last_used) = (prefetch_reads, prefetch_used);
        if reads > 0 {
            let share = (used as f64 / reads as f64).min(1.0);
            self.estimate = (1.0 - USE_EMA_WEIGHT) * self.estimate + USE_EMA_WEIGHT * share;
        }
        self.passes += 1;
        let on = self.estimate >= self.min_use || self.passes.is_multiple_of(PREFETCH_PROBE_EVERY);
        if !on {
            self.skipped += 1;
        }
        on
    }

    /// The current estimate of the share of prefetched experts used.
    pub fn estimate(&self) -> f64 {
        self.estimate
    }

    /// Forward passes that ran without prefetch because of the gate.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_turns_off_when_prefetch_is_unused_and_probes() {
        let mut g = PrefetchGate::new(0.25);
        assert!(g.allow(0, 0), "on at start");
        // Every pass reads 10 experts and uses 1: the estimate falls below 0.25.
        let (mut r, mut u) = (0, 0);
        let mut on = Vec::new();
        for _ in 0..40 {
            if on.last().copied().unwrap_or(true) {
                r += 10;
                u += 1;
            }
            on.push(g.allow(r, u));
        }
        assert!(g.estimate() < 0.25, "estimate {}", g.estimate());
        let off = on.iter().filter(|&&x| !x).count();
        assert!(off > 20, "gated off most passes: {on:?}");
        assert!(on[20..].iter().any(|&x| x), "still probes: {on:?}");
        assert_eq!(g.skipped(), off as u64);
        // When the probes' reads are all used again, the estimate recovers and prefetch stays on.
        for _ in 0..40 {
            r += 10;
            u += 10;
            g.allow(r, u);
        }
        assert!(g.estimate() > 0.9 && g.allow(r + 10, u + 10));
    }

    #[test]
    fn min_use_zero_never_gates() {
        let mut g = PrefetchGate::new(0.0);
        for i in 0..100u64 {
            assert!(g.allow(10 * i, 0));
        }
        assert_eq!(g.skipped(), 0);
    }
}
