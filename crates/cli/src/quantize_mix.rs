//! `--to q3_k_m | q4_k_m | q5_k_m`: llama.cpp's K-quant mixes, where the
//! tensors that hurt most when coarse get more bits. The recipe is
//! llama-quantize's (b11434, `llama_tensor_get_type_impl`) for these three
//! ftypes, by llama.cpp tensor name (`blk.N.attn_v.weight`, ...), with
//! `more(i, n) = i < n/8 || i ≥ 7n/8 || (i − n/8) % 3 == 2` (the first and last
//! eighth of the layers and every third one between):
//!
//! | tensor                         | Q3_K_M                     | Q4_K_M        | Q5_K_M        |
//! |--------------------------------|----------------------------|---------------|---------------|
//! | `output` (the head)            | Q6_K                       | Q6_K          | Q6_K          |
//! | `attn_v`, `attn_qkv`, `attn_kv_b` (i-th of n) | Q5_K if i < 2, else Q4_K | Q6_K if more(i, n) | Q6_K if more(i, n) |
//! | `attn_qkv` (then, in place of the row above)  | Q4_K       | Q5_K          | Q6_K          |
//! | `ffn_down*` (layer i of n)     | Q5_K if i < n/16, else Q4_K | Q6_K if more(i, n) | Q6_K if more(i, n) |
//! | `attn_output`                  | Q4_K                       | base          | base          |
//! | everything else quantized      | Q3_K                       | Q4_K          | Q5_K          |
//!
//! With 8 experts (Mixtral-like) `attn_v` and `attn_k` are Q8_0 and
//! `attn_output` Q5_K, as llama-quantize does. `attn_qkv` is first an
//! attn_v-like tensor and then overridden by its own row, as in llama.cpp.
//!
//! A row width that the chosen type's 256-value blocks do not divide falls
//! back as llama-quantize does: Q3_K → Q4_0, Q4_K → Q5_0, Q5_K → Q5_1,
//! Q6_K → Q8_0 (and the head to Q8_0); when even that block (32) does not
//! divide it, the tensor is not quantized (F16 from an HF checkpoint, its
//! source type from a GGUF).
//!
//! Differences from llama-quantize: the token embedding keeps its type (it
//! is in [`crate::quantize::DEFAULT_KEEP`] for every target; llama-quantize
//! gives it the base type), `--keep` patterns win over the recipe, and the
//! attn_v index `i` is the rank of the tensor's layer among the layers that
//! have one (llama.cpp counts them in file order, the same for files written
//! in layer order, as its converter and ours do).

use kernels::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    Q3KM,
    Q4KM,
    Q5KM,
}

impl Mix {
    pub fn parse(to: &str) -> Option<Mix> {
        match to {
            "q3_k_m" => Some(Mix::Q3KM),
            "q4_k_m" => Some(Mix::Q4KM),
            "q5_k_m" => Some(Mix::Q5KM),
            _ => None,
        }
    }

    /// The type of the tensors the recipe does not single out.
    pub fn base(self) -> DType {
        match self {
            Mix::Q3KM => DType::Q3_K,
            Mix::Q4KM => DType::Q4_K,
            Mix::Q5KM => DType::Q5_K,
        }
    }

    /// llama.cpp's `llama_ftype` (`LLAMA_FTYPE_MOSTLY_Q3_K_M` = 12, ...).
    pub fn ftype(self) -> u32 {
        match self {
            Mix::Q3KM => 12,
            Mix::Q4KM => 15,
            Mix::Q5KM => 17,
        }
    }
}

/// What the recipe needs to know about the model and the tensor list.
pub struct MixModel {
    pub n_layer: usize,
    pub n_expert: usize,
    /// Layers with an attn_v-like tensor, ascending (their rank is `i`).
    attn_v_layers: Vec<usize>,
}

/// `blk.N.` → `N`.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn attn_v_like(name: &str) -> bool {
    ["attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"].iter().any(|p| name.contains(p))
}

impl MixModel {
    /// From the llama.cpp names of all tensors that will be written.
    pub fn new<'a>(n_layer: usize, n_expert: usize, names: impl Iterator<Item = &'a str>) -> MixModel {
        let mut attn_v_layers: Vec<usize> = names.filter(|n| attn_v_like(n)).filter_map(layer_of).collect();
        attn_v_layers.sort_unstable();
        MixModel { n_layer, n_expert, attn_v_layers }
    }

    /// The recipe's type for tensor `name` whose rows are `cols` wide, after
    /// the width fallback; `None`: leave it unquantized.
    pub fn tensor_type(&self, mix: Mix, name: &str, cols: usize) -> Option<DType> {
        fit(self.chosen(mix, name), cols)
    }

    fn chosen(&self, mix: Mix, name: &str) -> DType {
        use DType::*;
        // (`i - n/8` only runs once `i ≥ n/8`.)
        let more = |i: usize, n: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        let layer = layer_of(name).unwrap_or(0);
        if name == "output.weight" {
            return Q6_K;
        }
        let mut t = mix.base();
        if attn_v_like(name) {
            let n = self.attn_v_layers.len();
            let i = self.attn_v_layers.partition_point(|&l| l < layer);
            t = match mix {
                Mix::Q3KM if i < 2 => Q5_K,
                Mix::Q3KM => Q4_K,
                Mix::Q4KM | Mix::Q5KM if more(i, n) => Q6_K,
                _ => t,
            };
            if self.n_expert == 8 {
                t = Q8_0;
            }
            if name.contains("attn_qkv.weight") {
                t = match mix {
                    Mix::Q3KM => Q4_K,
                    Mix::Q4KM => Q5_K,
                    Mix::Q5KM => Q6_K,
                };
            }
        } else if name.contains("attn_k.weight") && self.n_expert == 8 {
            t = Q8_0;
        } else if name.contains("ffn_down") {
            let n = self.n_layer;
            t = match mix {
                Mix::Q3KM if layer < n / 16 => Q5_K,
                Mix::Q3KM => Q4_K,
                _ if more(layer, n) => Q6_K,
                _ => t,
            };
        } else if name.contains("attn_output.weight") {
            if self.n_expert == 8 {
                t = Q5_K;
            } else if mix == Mix::Q3KM {
                t = Q4_K;
            }
        }
        t
    }
}

/// llama-quantize's fallback for rows that `t`'s blocks do not divide:
/// another type of 32-value blocks, or `None` (leave the tensor).
pub fn fit(t: DType, cols: usize) -> Option<DType> {
    if cols.is_multiple_of(t.block_elems()) {
        return Some(t);
    }
    let f = match t {
        DType::Q2_K | DType::Q3_K => DType::Q4_0,
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q6_K => DType::Q8_0,
        DType::IQ4_XS => DType::IQ4_NL,
        _ => return None,
    };
    cols.is_multiple_of(f.block_elems()).then_some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(n_layer: usize) -> MixModel {
        let names: Vec<String> = (0..n_layer).map(|l| format!("blk.{l}.attn_v.weight")).collect();
        MixModel::new(n_layer, 0, names.iter().map(String::as_str))
    }

    /// 32 layers (Llama-2-7B's count): Q4_K_M gives Q6_K to attn_v and
    /// ffn_down at layers 0–3, 6, 9, …, 27 (every third past the first
    /// eighth) and 28–31, as llama-quantize's log shows for such models.
    #[test]
    fn q4_k_m_layers() {
        let m = dense(32);
        let six: Vec<usize> = (0..32)
            .filter(|l| m.tensor_type(Mix::Q4KM, &format!("blk.{l}.ffn_down.weight"), 4096) == Some(DType::Q6_K))
            .collect();
        assert_eq!(six, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
        for l in 0..32 {
            let v = m.tensor_type(Mix::Q4KM, &format!("blk.{l}.attn_v.weight"), 4096);
            assert_eq!(v == Some(DType::Q6_K), six.contains(&l), "layer {l}");
        }
        assert_eq!(m.tensor_type(Mix::Q4KM, "blk.5.attn_q.weight", 4096), Some(DType::Q4_K));
        assert_eq!(m.tensor_type(Mix::Q4KM, "output.weight", 4096), Some(DType::Q6_K));
        assert_eq!(m.tensor_type(Mix::Q5KM, "blk.5.ffn_up.weight", 4096), Some(DType::Q5_K));
    }

    #[test]
    fn q3_k_m_and_fallbacks() {
        let m = dense(32);
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.1.attn_v.weight", 4096), Some(DType::Q5_K));
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.2.attn_v.weight", 4096), Some(DType::Q4_K));
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.1.ffn_down.weight", 4096), Some(DType::Q5_K));
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.2.ffn_down.weight", 4096), Some(DType::Q4_K));
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.2.attn_output.weight", 4096), Some(DType::Q4_K));
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.2.ffn_gate.weight", 4096), Some(DType::Q3_K));
        // Width 576 (SmolLM2): 256-value blocks do not fit.
        assert_eq!(m.tensor_type(Mix::Q3KM, "blk.2.ffn_gate.weight", 576), Some(DType::Q4_0));
        assert_eq!(m.tensor_type(Mix::Q4KM, "blk.5.attn_q.weight", 576), Some(DType::Q5_0));
        assert_eq!(m.tensor_type(Mix::Q5KM, "blk.5.attn_q.weight", 576), Some(DType::Q5_1));
        assert_eq!(m.tensor_type(Mix::Q4KM, "output.weight", 576), Some(DType::Q8_0));
        assert_eq!(m.tensor_type(Mix::Q4KM, "blk.5.attn_q.weight", 100), None);
    }
}
