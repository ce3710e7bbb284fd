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
                let dim = rot_dim as f32;
                let corr =
                    |rot: f32| dim * (orig as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * theta.ln());
                let low = corr(beta_fast).floor().max(0.0);
                let high = corr(beta_slow).ceil().min(dim - 1.0);
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

    #[test]
    fn linear_divides_all() {
        let r = Rope::new(10000.0, 8, &RopeScaling::Linear { factor: 2.0 }, 100, RopeStyle::Neox);
        let p = Rope::new(10000.0, 8, &RopeScaling::None, 100, RopeStyle::Neox);
        for (a, b) in r.inv_freq.iter().zip(&p.inv_freq) {
            assert!((a - b / 2.0).abs() < 1e-9);
        }
    }
}
