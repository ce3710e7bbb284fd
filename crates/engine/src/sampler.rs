//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty,
//! seeded. Order: penalty → temperature → top-k → softmax → top-p → min-p → draw.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// ≤ 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables: drop tokens with p < min_p · p_max.
    pub min_p: f32,
    /// 1 disables. Applied to tokens seen in the prompt and output (HF/llama.cpp rule:
    /// positive logits divided, negative multiplied).
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Checks ranges; returns a message naming the bad value.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!("repetition penalty must be > 0, got {}", self.repetition_penalty));
        }
        Ok(())
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
    /// (probability or logit, token) candidates; reused between calls.
    cand: Vec<(f32, u32)>,
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler { params, rng, cand: Vec::new() }
    }

    /// Picks the next token from `logits` (modified in place by the penalty).
    /// `history` is every token so far (prompt and output).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if let Some(id) = self.distribution(logits, history) {
            return id;
        }
        let total: f32 = self.cand.iter().map(|c| c.0).sum();
        self.draw(total)
    }

    /// Checks a draft token proposed by a deterministic drafter (its
    /// distribution `q` is a point mass on `draft`): speculative sampling
    /// accepts it with probability `min(1, p/q) = p(draft)`, and on rejection
    /// draws from the residual `max(0, p − q)`, which is `p` without `draft`,
    /// renormalized. The token that comes out is distributed as `p` exactly.
    /// Greedy: the argmax, accepted when it is the draft. Returns (token,
    /// whether it is the draft).
    pub fn sample_draft(&mut self, logits: &mut [f32], history: &[u32], draft: u32) -> (u32, bool) {
        if let Some(id) = self.distribution(logits, history) {
            return (id, id == draft);
        }
        let p_draft = self.cand.iter().find(|c| c.1 == draft).map_or(0.0, |c| c.0);
        let total: f32 = self.cand.iter().map(|c| c.0).sum();
        if p_draft > 0.0 && self.rng.gen::<f32>() * total < p_draft {
            return (draft, true);
        }
        self.cand.retain(|c| c.1 != draft);
        if self.cand.is_empty() {
            // p was all on the draft (up to rounding): nothing else to draw.
            return (draft, true);
        }
        let total: f32 = self.cand.iter().map(|c| c.0).sum();
        (self.draw(total), false)
    }

    /// Applies the penalty, then either returns the greedy token, or leaves
    /// the filtered distribution (probability, token) in `self.cand`, most
    /// likely first, and returns `None`.
    fn distribution(&mut self, logits: &mut [f32], history: &[u32]) -> Option<u32> {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in history {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.temperature <= 0.0 {
            return Some(argmax(logits));
        }
        let inv_t = 1.0 / p.temperature;
        self.cand.clear();
        self.cand.extend(logits.iter().enumerate().map(|(i, &l)| (l * inv_t, i as u32)));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, |a, b| b.0.total_cmp(&a.0));
            self.cand.truncate(p.top_k);
        }
        self.cand.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        let max = self.cand[0].0;
        let mut sum = 0.0;
        for c in self.cand.iter_mut() {
            c.0 = (c.0 - max).exp();
            sum += c.0;
        }
        for c in self.cand.iter_mut() {
            c.0 /= sum;
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                acc += c.0;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = self.cand[0].0 * p.min_p;
            self.cand.retain(|c| c.0 >= floor);
        }
        None
    }

    /// Draws from `self.cand`, whose weights sum to `total`.
    fn draw(&mut self, total: f32) -> u32 {
        let mut r = self.rng.gen::<f32>() * total;
        for c in &self.cand {
            r -= c.0;
            if r <= 0.0 {
                return c.1;
            }
        }
        self.cand.last().map(|c| c.1).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.1, 3.0, 2.9], &[]), 1);
        }
    }

    #[test]
    fn same_seed_same_draws() {
        let params = SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        let logits = [1.0, 1.2, 0.8, 1.1];
        let da: Vec<u32> = (0..32).map(|_| a.sample(&mut logits.clone(), &[])).collect();
        let db: Vec<u32> = (0..32).map(|_| b.sample(&mut logits.clone(), &[])).collect();
        assert_eq!(da, db);
        assert!(da.iter().any(|&t| t != da[0]), "temperature 1 should vary");
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, ..Default::default() });
        for _ in 0..50 {
            assert_eq!(s.sample(&mut [5.0, 0.0, 0.0, 0.0], &[]), 0);
        }
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, min_p: 0.5, ..Default::default() });
        for _ in 0..50 {
            assert_ne!(s.sample(&mut [3.0, 3.0, 0.0, -1.0], &[]), 3);
        }
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() });
        assert_eq!(s.sample(&mut [2.0, 1.5], &[0]), 1);
    }

    #[test]
    fn drafts_are_checked_against_the_distribution() {
        // Greedy: accepted exactly when the draft is the argmax.
        let mut g = Sampler::new(SamplingParams::default());
        assert_eq!(g.sample_draft(&mut [0.1, 3.0], &[], 1), (1, true));
        assert_eq!(g.sample_draft(&mut [0.1, 3.0], &[], 0), (1, false));
        // A draft the filters cut (top-k 2) is never accepted nor drawn.
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 2, seed: 3, ..Default::default() });
        for _ in 0..50 {
            let (t, took) = s.sample_draft(&mut [3.0, 2.5, 0.0, -1.0], &[], 3);
            assert!(!took && t < 2, "{t} {took}");
        }
        // The only token left is always accepted.
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() });
        assert_eq!(s.sample_draft(&mut [0.0, 5.0], &[], 1), (1, true));
    }

    #[test]
    fn validation_names_the_value() {
        let p = SamplingParams { top_p: 1.5, ..Default::default() };
        assert!(p.validate().unwrap_err().contains("top-p"));
    }
}
