//! The draft gate: whether a sequence's next decode pass carries drafts, from what drafting
//! measurably gains (tokens emitted per draft pass, this sequence) against what it costs (the
//! time of a pass with the drafts' extra rows over the time of the pass without them, measured
//! by the engine for every row count it runs). Drafting pauses while it does not pay and
//! probes again every [`DRAFT_PROBE_EVERY`] passes. Only speed changes, never tokens:
//! verification emits what plain decode would (see [`crate::speculative`]).

/// Weight of the latest pass in the moving estimates (tokens per draft pass, seconds per pass).
pub const EMA_WEIGHT: f64 = 0.3;

/// While drafting is paused, every this many decode passes of the sequence still drafts, to
/// keep the gain estimate current.
pub const DRAFT_PROBE_EVERY: u64 = 16;

/// Row counts whose pass time is tracked (larger passes share the last slot).
const MAX_ROWS: usize = 256;

/// Moving average of the wall time of a forward pass, per number of rows (tokens) it ran,
/// measured by the engine on every pass.
#[derive(Clone, Debug)]
pub struct PassCosts {
    seconds: Vec<Option<f64>>,
}

impl Default for PassCosts {
    fn default() -> Self {
        PassCosts {
            seconds: vec![None; MAX_ROWS + 1],
        }
    }
}

impl PassCosts {
    /// Records a pass of `rows` rows that took `seconds`.
    pub fn record(&mut self, rows: usize, seconds: f64) {
        let slot = &mut self.seconds[rows.min(MAX_ROWS)];
        *slot = Some(match *slot {
            None => seconds,
            Some(s) => (1.0 - EMA_WEIGHT) * s + EMA_WEIGHT * seconds,
        });
    }

    /// The estimated seconds of a pass of `rows` rows (None before one was measured).
    pub fn seconds(&self, rows: usize) -> Option<f64> {
        self.seconds[rows.min(MAX_ROWS)]
    }

    /// How many times longer a pass of `with` rows takes than one of `without` rows (None while
    /// either is unmeasured).
    pub fn ratio(&self, with: usize, without: usize) -> Option<f64> {
        Some(self.seconds(with)? / self.seconds(without)?.max(1e-12))
    }
}

/// One sequence's draft gate (see the module doc).
///
/// The gain estimate starts optimistic (every draft accepted) and moves, after every draft
/// pass, toward the tokens that pass emitted (accepted drafts + 1). A pass drafts when the gain
/// is at least the cost ratio of the pass with and without the drafts' rows (plus the
/// drafter's own time, [`DraftGate::record_draft_time`], over the plain pass's), while that ratio
/// is unmeasured (so it gets measured; at most [`DRAFT_PROBE_EVERY`] times in a row, then one
/// pass goes without drafts so the plain cost is measured too), and every
/// [`DRAFT_PROBE_EVERY`]-th pass while paused.
#[derive(Clone, Debug)]
pub struct DraftGate {
    gain: Option<f64>,
    /// Seconds the drafter itself takes per draft pass (MTP steps; None for prompt lookup).
    draft_s: Option<f64>,
    passes: u64,
    unmeasured_in_a_row: u64,
    paused: u64,
}

impl Default for DraftGate {
    fn default() -> Self {
        DraftGate::new()
    }
}

impl DraftGate {
    /// A gate with no history.
    pub fn new() -> DraftGate {
        DraftGate {
            gain: None,
            draft_s: None,
            passes: 0,
            unmeasured_in_a_row: 0,
            paused: 0,
        }
    }

    /// Whether the next pass of the sequence carries its `drafts` (> 0) draft rows, given the
    /// pass's other rows `base_rows` (1 when the sequence decodes alone) and the engine's
    /// measured pass costs.
    pub fn allow(&mut self, costs: &PassCosts, base_rows: usize, drafts: usize) -> bool {
        self.passes += 1;
        let gain = self.gain.unwrap_or((drafts + 1) as f64);
        let overhead = match (self.draft_s, costs.seconds(base_rows)) {
            (Some(d), Some(plain)) => d / plain.max(1e-12),
            _ => 0.0,
        };
        let on = match costs.ratio(base_rows + drafts, base_rows) {
            Some(ratio) => {
                let ratio = ratio + overhead;
                self.unmeasured_in_a_row = 0;
                gain >= ratio || self.passes.is_multiple_of(DRAFT_PROBE_EVERY)
            }
            None => {
                self.unmeasured_in_a_row += 1;
                // Measure the plain pass once in a while when only draft passes ran so far.
                self.unmeasured_in_a_row <= DRAFT_PROBE_EVERY || costs.seconds(base_rows).is_some()
            }
        };
        if !on {
            self.paused += 1;
            if self.unmeasured_in_a_row > DRAFT_PROBE_EVERY {
                self.unmeasured_in_a_row = 0;
            }
        }
        on
    }

    /// Records a draft pass that emitted `tokens` tokens (accepted drafts + the token sampled
    /// after them).
    pub fn record(&mut self, tokens: usize) {
        let t = tokens as f64;
        self.gain = Some(match self.gain {
            None => t,
            Some(g) => (1.0 - EMA_WEIGHT) * g + EMA_WEIGHT * t,
        });
    }

    /// Records the seconds the drafter took to propose one pass's drafts (the MTP layer's
    /// steps): they count in the cost of drafting.
    pub fn record_draft_time(&mut self, seconds: f64) {
        self.draft_s = Some(match self.draft_s {
            None => seconds,
            Some(d) => (1.0 - EMA_WEIGHT) * d + EMA_WEIGHT * seconds,
        });
    }

    /// The current estimate of tokens emitted per draft pass (None before the first).
    pub fn gain(&self) -> Option<f64> {
        self.gain
    }

    /// Decode passes the gate kept without drafts.
    pub fn paused_passes(&self) -> u64 {
        self.paused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_costs_average_per_row_count() {
        let mut c = PassCosts::default();
        assert_eq!(c.ratio(5, 1), None);
        c.record(1, 1.0);
        c.record(5, 2.0);
        assert_eq!(c.ratio(5, 1), Some(2.0));
        c.record(5, 3.0);
        assert!((c.seconds(5).unwrap() - 2.3).abs() < 1e-12);
        c.record(10_000, 9.0);
        assert_eq!(c.seconds(MAX_ROWS), Some(9.0));
    }

    #[test]
    fn gate_pauses_when_drafts_do_not_pay_and_probes() {
        let mut c = PassCosts::default();
        c.record(1, 1.0);
        c.record(5, 2.5);
        let mut g = DraftGate::new();
        assert!(g.allow(&c, 1, 4), "optimistic before any draft pass");
        // Every draft pass emits 1 token (nothing accepted) but costs 2.5 plain passes.
        let mut on = Vec::new();
        for _ in 0..64 {
            if on.last().copied().unwrap_or(true) {
                g.record(1);
            }
            on.push(g.allow(&c, 1, 4));
        }
        let off = on.iter().filter(|&&x| !x).count();
        assert!(off > 50, "paused most passes: {on:?}");
        assert!(on[10..].iter().any(|&x| x), "still probes: {on:?}");
        assert_eq!(g.paused_passes(), off as u64);
        // Drafts that are all accepted (5 tokens per pass) pay at 2.5x the cost.
        for _ in 0..20 {
            g.record(5);
        }
        assert!(g.allow(&c, 1, 4));
    }

    #[test]
    fn unmeasured_plain_cost_gets_measured() {
        let mut c = PassCosts::default();
        c.record(5, 2.0);
        let mut g = DraftGate::new();
        let on: Vec<bool> = (0..40).map(|_| g.allow(&c, 1, 4)).collect();
        assert!(on.iter().any(|&x| !x), "a plain pass is forced: {on:?}");
        assert!(on.iter().filter(|&&x| x).count() >= 32);
    }
}
