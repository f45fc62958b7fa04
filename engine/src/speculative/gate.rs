//! The draft gate: how many drafts a sequence's next decode pass carries, from what drafting
//! measurably gains (this sequence's acceptance rate) against what it costs (the time of a pass
//! with the drafts' extra rows over the time of the pass without them, measured by the engine
//! for every row count it runs). Drafting pauses while it does not pay and probes again every
//! [`DRAFT_PROBE_EVERY`] paused passes. Only speed changes, never tokens: verification emits
//! what plain decode would (see [`crate::speculative`]).

/// Weight of the latest pass in the moving estimates (acceptance counts, seconds per pass).
pub const EMA_WEIGHT: f64 = 0.3;

/// While drafting is paused, every this many paused passes of the sequence still drafts one
/// token, to keep the acceptance estimate current.
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

/// Prior of the per-draft acceptance estimate: acceptance 0.8 with the weight of 2 drafts, so
/// that a new sequence drafts (and its acceptance gets measured).
const PRIOR_ACCEPTED: f64 = 1.6;
const PRIOR_DRAWS: f64 = 2.0;

/// Extra cost per draft row assumed while a pass of that many rows is unmeasured, as a share of
/// the plain pass (extrapolated from the nearest measured row count when there is one).
const UNMEASURED_ROW_COST: f64 = 0.5;

/// One sequence's draft gate (see the module doc).
///
/// Speculative decoding's expected tokens per pass with k drafts and a per-draft acceptance
/// rate a are `(1 - a^(k+1)) / (1 - a)` (Leviathan et al. 2023, eq. 1). The gate estimates a
/// from this sequence's verify passes (accepted drafts over drafts up to and including the first
/// rejected one, decayed by [`EMA_WEIGHT`] per pass, with an optimistic prior), prices a pass of
/// k draft rows by the engine's measured pass times ([`PassCosts`]: the pass with them over the
/// pass without them, plus the drafter's own time, [`DraftGate::record_draft_time`]), and
/// chooses the k in `1..=k_max` with the most tokens per unit of cost. Drafting pauses while
/// even that k does not beat a plain pass, and every [`DRAFT_PROBE_EVERY`]-th paused pass drafts
/// one token anyway, to keep the estimate current.
#[derive(Clone, Debug)]
pub struct DraftGate {
    accepted: f64,
    draws: f64,
    /// Seconds the drafter itself takes per draft pass (MTP steps; None for prompt lookup).
    draft_s: Option<f64>,
    passes: u64,
    paused: u64,
}

impl Default for DraftGate {
    fn default() -> Self {
        DraftGate::new()
    }
}

/// Expected tokens a pass emits with `k` drafts at per-draft acceptance `a` (accepted drafts +
/// the token after them).
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    if a >= 1.0 {
        return (k + 1) as f64;
    }
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

impl DraftGate {
    /// A gate with no history.
    pub fn new() -> DraftGate {
        DraftGate {
            accepted: 0.0,
            draws: 0.0,
            draft_s: None,
            passes: 0,
            paused: 0,
        }
    }

    /// The estimated per-draft acceptance rate (0..1).
    pub fn acceptance(&self) -> f64 {
        (self.accepted + PRIOR_ACCEPTED) / (self.draws + PRIOR_DRAWS)
    }

    /// The estimated cost of a pass of `base_rows + k` rows over one of `base_rows`.
    fn cost_ratio(&self, costs: &PassCosts, base_rows: usize, k: usize) -> f64 {
        let plain = costs.seconds(base_rows);
        let ratio = match (costs.seconds(base_rows + k), plain) {
            (Some(w), Some(p)) => w / p.max(1e-12),
            (_, Some(p)) => {
                // The nearest measured larger pass, scaled linearly in rows.
                let near =
                    (base_rows + k + 1..=MAX_ROWS).find_map(|r| costs.seconds(r).map(|s| (r, s)));
                match near {
                    Some((r, s)) => {
                        1.0 + (s / p.max(1e-12) - 1.0).max(0.0) * k as f64 / (r - base_rows) as f64
                    }
                    None => 1.0 + UNMEASURED_ROW_COST * k as f64,
                }
            }
            _ => 1.0 + UNMEASURED_ROW_COST * k as f64,
        };
        let overhead = match (self.draft_s, plain) {
            (Some(d), Some(p)) => d / p.max(1e-12),
            _ => 0.0,
        };
        ratio + overhead
    }

    /// How many drafts (0..=`k_max`) the sequence's next pass should carry, given the pass's
    /// rows without them `base_rows` (1 when the sequence decodes alone), the tokens that pass
    /// is expected to emit `base_tokens` (this sequence's plain token included: 1 alone, about
    /// the number of decoding sequences in a batch) and the engine's measured pass costs: the k
    /// with the most expected tokens per second for the whole pass,
    /// `(base_tokens - 1 + expected_tokens(a, k)) / (base_tokens * cost_ratio)`, 0 while no k
    /// beats the plain pass (1 on every [`DRAFT_PROBE_EVERY`]-th such pass).
    ///
    /// The drafts' extra rows slow every sequence of the pass, not only this one: beside seven
    /// other decoding sequences on a compute-bound machine (each row costs about as much as the
    /// next) one more token for this sequence does not pay for an eighth more pass time, though
    /// alone it would. `base_tokens` below 1 counts as 1.
    pub fn choose(
        &mut self,
        costs: &PassCosts,
        base_rows: usize,
        base_tokens: f64,
        k_max: usize,
    ) -> usize {
        if k_max == 0 {
            return 0;
        }
        self.passes += 1;
        if costs.seconds(base_rows).is_none() && self.passes.is_multiple_of(DRAFT_PROBE_EVERY) {
            // The plain pass is unmeasured (every pass so far drafted): run one to measure it.
            return 0;
        }
        let a = self.acceptance();
        let base = base_tokens.max(1.0);
        let (mut best_k, mut best) = (0, 1.0);
        for k in 1..=k_max {
            let value = (base - 1.0 + expected_tokens(a, k))
                / (base * self.cost_ratio(costs, base_rows, k));
            if value > best {
                (best_k, best) = (k, value);
            }
        }
        if best_k == 0 {
            self.paused += 1;
            if self.paused.is_multiple_of(DRAFT_PROBE_EVERY) {
                return 1;
            }
        }
        best_k
    }

    /// Records a verify pass that carried `proposed` drafts of which the first `accepted` were
    /// accepted.
    pub fn record(&mut self, accepted: usize, proposed: usize) {
        let draws = (accepted + usize::from(accepted < proposed)) as f64;
        self.accepted = (1.0 - EMA_WEIGHT) * self.accepted + accepted as f64;
        self.draws = (1.0 - EMA_WEIGHT) * self.draws + draws;
    }

    /// Records the seconds the drafter took to propose one pass's drafts (the MTP layer's
    /// steps): they count in the cost of drafting.
    pub fn record_draft_time(&mut self, seconds: f64) {
        self.draft_s = Some(match self.draft_s {
            None => seconds,
            Some(d) => (1.0 - EMA_WEIGHT) * d + EMA_WEIGHT * seconds,
        });
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
    fn expected_tokens_follow_the_geometric_series() {
        assert_eq!(expected_tokens(0.0, 4), 1.0);
        assert_eq!(expected_tokens(1.0, 4), 5.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn gate_pauses_when_drafts_do_not_pay_and_probes() {
        let mut c = PassCosts::default();
        c.record(1, 1.0);
        c.record(2, 1.4);
        c.record(3, 1.8);
        c.record(5, 2.6);
        let mut g = DraftGate::new();
        assert!(
            g.choose(&c, 1, 1.0, 4) > 0,
            "optimistic before any verify pass"
        );
        // Nothing is ever accepted: drafting stops, probing one draft now and then.
        let mut ks = Vec::new();
        for _ in 0..64 {
            let k = g.choose(&c, 1, 1.0, 4);
            if k > 0 {
                g.record(0, k);
            }
            ks.push(k);
        }
        let off = ks.iter().filter(|&&k| k == 0).count();
        assert!(off > 50, "paused most passes: {ks:?}");
        assert!(ks[20..].contains(&1), "still probes: {ks:?}");
        assert!(g.paused_passes() as usize >= off);
        // Drafts that are all accepted pay, and the longest pays most at this cost.
        for _ in 0..20 {
            g.record(4, 4);
        }
        assert!(g.acceptance() > 0.95);
        assert_eq!(g.choose(&c, 1, 1.0, 4), 4);
    }

    #[test]
    fn draft_length_follows_acceptance_and_cost() {
        // Each draft row costs as much as the plain pass (a compute-bound resident model).
        let mut c = PassCosts::default();
        for r in 1..=5 {
            c.record(r, r as f64);
        }
        let mut g = DraftGate::new();
        for _ in 0..20 {
            g.record(1, 2);
        }
        // Acceptance ~0.5: one more token per row never beats its cost.
        assert_eq!(g.choose(&c, 1, 1.0, 4), 0);
        // Cheap rows (a streamed model: the pass is expert reads): drafting pays.
        let mut c = PassCosts::default();
        for r in 1..=5 {
            c.record(r, 1.0 + 0.05 * r as f64);
        }
        assert!(g.choose(&c, 1, 1.0, 4) >= 2);
        // The drafter's own time counts.
        g.record_draft_time(10.0);
        assert_eq!(g.choose(&c, 1, 1.0, 4), 0);
    }

    #[test]
    fn drafts_beside_other_sequences_pay_for_the_whole_pass() {
        // A compute-bound resident model: each row costs 10% of a one-row pass on top of a
        // fixed 90% (weights read once per pass).
        let mut c = PassCosts::default();
        for r in 1..=16 {
            c.record(r, 0.9 + 0.1 * r as f64);
        }
        let mut g = DraftGate::new();
        for _ in 0..20 {
            g.record(1, 2);
        }
        // Acceptance ~0.5: alone, a draft row (+10%) buys half a token (+50%).
        assert!(g.choose(&c, 1, 1.0, 4) >= 1);
        // Beside seven decoding sequences the pass emits 8 tokens in 1.7 s; one draft row
        // adds 0.1 s (+5.9%) and about 0.57 tokens (+7%): still (barely) pays.
        assert!(g.choose(&c, 8, 8.0, 4) >= 1);
        // Rows at full cost (every row as dear as a one-row pass, nearly so on 2 cores at batch
        // 8): a draft adds 1/8 of the pass time and about 0.76 tokens to its 8 (+9.5%).
        let mut c = PassCosts::default();
        for r in 1..=16 {
            c.record(r, r as f64);
        }
        let mut g = DraftGate::new();
        for _ in 0..20 {
            g.record(3, 4);
        }
        assert_eq!(
            g.choose(&c, 8, 8.0, 4),
            0,
            "batch: drafts slow the other seven"
        );
        // What the gate did before it counted the other sequences' tokens: 1.75 tokens for
        // 1.125x the time looked like a gain.
        assert!(expected_tokens(g.acceptance(), 1) / g.cost_ratio(&c, 8, 1) > 1.0);
    }

    #[test]
    fn unmeasured_costs_are_extrapolated() {
        let mut c = PassCosts::default();
        c.record(1, 1.0);
        let g = DraftGate::new();
        assert!((g.cost_ratio(&c, 1, 2) - 2.0).abs() < 1e-12);
        c.record(5, 3.0);
        assert!(
            (g.cost_ratio(&c, 1, 2) - 2.0).abs() < 1e-12,
            "halfway to the 5-row pass"
        );
    }
}
