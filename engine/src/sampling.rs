//! Token sampling: greedy (temperature 0) or temperature + top-k + top-p with a seeded RNG,
//! applied in transformers' order (temperature, then top-k, then top-p).

use crate::error::{EngineError, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax); else logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1.0 = off).
    pub top_p: f32,
    /// RNG seed (StdRng): equal seeds give equal samples.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks ranges.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] for a negative or non-finite temperature or top-p outside (0, 1].
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(EngineError::Invalid(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Invalid(format!(
                "top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// Index of the largest logit; the lowest index wins ties; NaN is never chosen over a number.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || (logits[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best as u32
}

/// The candidate tokens after temperature, top-k and top-p, with their renormalized
/// probabilities (f64), most likely first (ties: lower id first).
pub fn candidates(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let t = p.temperature.max(f32::MIN_POSITIVE) as f64;
    let mut c: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v as f64 / t))
        .collect();
    c.sort_by(|a, b| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.0.cmp(&b.0))
    });
    if p.top_k > 0 && c.len() > p.top_k {
        c.truncate(p.top_k);
    }
    let max = c.first().map_or(0.0, |x| x.1);
    let mut sum = 0.0;
    for x in &mut c {
        x.1 = (x.1 - max).exp();
        sum += x.1;
    }
    for x in &mut c {
        x.1 /= sum;
    }
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            cum += x.1;
            if cum >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
        let s: f64 = c.iter().map(|x| x.1).sum();
        for x in &mut c {
            x.1 /= s;
        }
    }
    c
}

/// A sampler with its own seeded RNG.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            params,
            rng: StdRng::seed_from_u64(params.seed),
        }
    }

    /// Picks the next token from `logits` (`[vocab]`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature == 0.0 {
            return argmax(logits);
        }
        let c = candidates(logits, &self.params);
        let r: f64 = self.rng.gen::<f64>();
        let mut cum = 0.0;
        for x in &c {
            cum += x.1;
            if r < cum {
                return x.0;
            }
        }
        c.last().map_or_else(|| argmax(logits), |x| x.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_lowest_tie() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.0, 0.1, 5.0]), 2);
    }

    #[test]
    fn top_k_and_top_p_filter() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 0,
        };
        let c = candidates(&logits, &p);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 3]);
        assert!((c.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
        // Probabilities of softmax([0..4]) are ~[.012,.032,.087,.236,.643]; top-p 0.7 keeps 2.
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.7,
            seed: 0,
        };
        assert_eq!(candidates(&logits, &p).len(), 2);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 0,
        };
        assert_eq!(candidates(&logits, &p).len(), 1);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        };
        assert_eq!(candidates(&logits, &p).len(), 5);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_distribution() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 42,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let allowed: Vec<u32> = candidates(&logits, &p).iter().map(|x| x.0).collect();
        assert!(a.iter().all(|t| allowed.contains(t)));
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() > 1);
        let c = {
            let mut s = Sampler::new(SamplingParams { seed: 43, ..p });
            (0..100).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
        };
        assert_ne!(a, c);
    }

    #[test]
    fn validation() {
        assert!(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams::default().validate().is_ok());
    }
}
