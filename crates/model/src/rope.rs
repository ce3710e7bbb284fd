//! Rotary position embeddings: inverse frequencies with default, linear, llama3 and
//! yarn scaling (formulas as in transformers' `modeling_rope_utils`), and the
//! per-position cos/sin tables.

use formats::RopeScaling;

/// Precomputed inverse frequencies for one model.
#[derive(Debug, Clone)]
pub struct Rope {
    /// `rot_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplier on cos/sin (yarn's attention factor; 1 otherwise).
    pub attention_factor: f32,
    pub style: kernels::ops::RopeStyle,
}

impl Rope {
    pub fn new(
        theta: f32,
        rot_dim: usize,
        scaling: &RopeScaling,
        max_pos: usize,
        style: kernels::ops::RopeStyle,
    ) -> Rope {
        let half = rot_dim / 2;
        // As transformers: base ** (arange(0, dim, 2) / dim), computed in f32.
        let pos_freq: Vec<f32> = (0..half).map(|i| theta.powf((2 * i) as f32 / rot_dim as f32)).collect();
        let base_inv: Vec<f32> = pos_freq.iter().map(|p| 1.0 / p).collect();
        let mut attention_factor = 1.0f32;
        let inv_freq = match *scaling {
            RopeScaling::None => base_inv,
            RopeScaling::Linear { factor } => base_inv.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let old = original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base_inv
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor: af,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                let get_mscale = |scale: f32, m: f32| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                attention_factor = match (af, mscale, mscale_all_dim) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                        get_mscale(factor, m) / get_mscale(factor, ma)
                    }
                    _ => get_mscale(factor, 1.0),
                };
                let orig =
                    if original_max_position_embeddings > 0 { original_max_position_embeddings } else { max_pos };
                // The correction range in f64, as transformers computes it in Python.
                let dim = rot_dim as f64;
                let corr = |rot: f32| {
                    dim * (orig as f64 / (rot as f64 * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (theta as f64).ln())
                };
                let (low, high) = match truncate {
                    true => (corr(beta_fast).floor(), corr(beta_slow).ceil()),
                    false => (corr(beta_fast), corr(beta_slow)),
                };
                let (low, high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
                let high = if low == high { high + 0.001 } else { high };
                (0..half)
                    .map(|i| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrap_factor = 1.0 - ramp;
                        let extrap = 1.0 / pos_freq[i];
                        let interp = 1.0 / (factor * pos_freq[i]);
                        interp * (1.0 - extrap_factor) + extrap * extrap_factor
                    })
                    .collect()
            }
        };
        Rope { inv_freq, attention_factor, style }
    }

    /// Divides each inverse frequency by its entry of `divisors`: llama.cpp's
    /// `rope_freqs.weight` (convert_hf_to_gguf.py writes llama3 scaling that way,
    /// with no rope.scaling.type). One divisor per frequency, each positive and
    /// finite; anything else would silently skew positions, so it is an error.
    pub fn apply_freq_divisors(&mut self, divisors: &[f32]) -> Result<(), String> {
        if divisors.len() != self.inv_freq.len() {
            return Err(format!(
                "rope_freqs.weight has {} entries, the rope has {} frequencies",
                divisors.len(),
                self.inv_freq.len()
            ));
        }
        if let Some(d) = divisors.iter().find(|d| !(d.is_finite() && **d > 0.0)) {
            return Err(format!("rope_freqs.weight holds {d}, not a positive divisor"));
        }
        for (inv, d) in self.inv_freq.iter_mut().zip(divisors) {
            *inv /= d;
        }
        Ok(())
    }

    /// Fills `cos`/`sin` (each `rot_dim/2`) for position `pos`.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let a = pos as f32 * f;
            cos[i] = a.cos() * self.attention_factor;
            sin[i] = a.sin() * self.attention_factor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::ops::RopeStyle;

    #[test]
    fn default_frequencies() {
        let r = Rope::new(10000.0, 4, &RopeScaling::None, 100, RopeStyle::Neox);
        assert_eq!(r.inv_freq.len(), 2);
        assert!((r.inv_freq[0] - 1.0).abs() < 1e-7);
        assert!((r.inv_freq[1] - 0.01).abs() < 1e-7);
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 256,
        };
        let plain = Rope::new(500000.0, 16, &RopeScaling::None, 4096, RopeStyle::Neox);
        let r = Rope::new(500000.0, 16, &s, 4096, RopeStyle::Neox);
        assert_eq!(r.inv_freq[0], plain.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((r.inv_freq[last] - plain.inv_freq[last] / 8.0).abs() < 1e-12);
    }

    /// The divisors convert_hf_to_gguf.py writes as `rope_freqs.weight` for
    /// Llama 3.2's scaling, applied to the plain frequencies, give what
    /// `RopeScaling::Llama3` computes from the HF config: a llama3 GGUF and its
    /// safetensors source rotate alike.
    #[test]
    fn gguf_rope_freqs_match_llama3_scaling() {
        let (theta, dim, factor, lo, hi, old) = (500000.0f32, 64usize, 32.0f32, 1.0f32, 4.0f32, 8192usize);
        let s = RopeScaling::Llama3 {
            factor,
            low_freq_factor: lo,
            high_freq_factor: hi,
            original_max_position_embeddings: old,
        };
        let want = Rope::new(theta, dim, &s, 131072, RopeStyle::Interleaved);
        let mut got = Rope::new(theta, dim, &RopeScaling::None, 131072, RopeStyle::Interleaved);
        let old = old as f32;
        let divisors: Vec<f32> = got
            .inv_freq
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < old / hi {
                    1.0
                } else if wavelen > old / lo {
                    factor
                } else {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect();
        // All three regimes occur at this shape.
        assert!(divisors.contains(&1.0) && divisors.contains(&factor));
        assert!(divisors.iter().any(|&d| d > 1.0 && d < factor));
        got.apply_freq_divisors(&divisors).unwrap();
        for (a, b) in got.inv_freq.iter().zip(&want.inv_freq) {
            assert!((a - b).abs() <= 1e-6 * b, "{a} vs {b}");
        }
    }

    #[test]
    fn bad_rope_freqs_are_errors() {
        let mut r = Rope::new(10000.0, 8, &RopeScaling::None, 100, RopeStyle::Neox);
        assert!(r.apply_freq_divisors(&[1.0; 3]).unwrap_err().contains("3 entries"));
        assert!(r.apply_freq_divisors(&[1.0, 0.0, 1.0, 1.0]).is_err());
        assert!(r.apply_freq_divisors(&[1.0, f32::NAN, 1.0, 1.0]).is_err());
        assert!(r.apply_freq_divisors(&[2.0; 4]).is_ok());
    }

    /// gpt-oss's yarn (`truncate: false`): the ramp runs between the
    /// fractional correction dims 4.046 and 8.699 (truncated: 4 and 9).
    /// Expected values from transformers' formula evaluated in f64.
    #[test]
    fn yarn_without_truncation_matches_transformers() {
        let yarn = |truncate| RopeScaling::Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None,
            mscale: None,
            mscale_all_dim: None,
            truncate,
        };
        let r = Rope::new(150000.0, 32, &yarn(false), 4096, RopeStyle::Neox);
        let want = [0.05081327482, 0.01933500113, 0.00679495949, 0.002093792379, 0.0004564839192, 3.830881237e-05];
        for (i, w) in (4..10).zip(want) {
            assert!((r.inv_freq[i] as f64 - w).abs() <= 2e-6 * w, "inv_freq[{i}] = {} vs {w}", r.inv_freq[i]);
        }
        assert!((r.attention_factor - 1.3465736).abs() < 1e-6);
        let truncated = Rope::new(150000.0, 32, &yarn(true), 4096, RopeStyle::Neox);
        assert!((truncated.inv_freq[5] - r.inv_freq[5]).abs() > 1e-4 * r.inv_freq[5]);
    }

    #[test]
    fn linear_divides_all() {
        let r = Rope::new(10000.0, 8, &RopeScaling::Linear { factor: 2.0 }, 100, RopeStyle::Neox);
        let p = Rope::new(10000.0, 8, &RopeScaling::None, 100, RopeStyle::Neox);
        for (a, b) in r.inv_freq.iter().zip(&p.inv_freq) {
            assert!((a - b / 2.0).abs() < 1e-9);
        }
    }
}
