//! Writes an HF MoE fixture as the GGUF llama.cpp's converter would make of it:
//! its tensor names, the experts of each layer stacked into one
//! `ffn_{gate,up,down}_exps` tensor `[n_experts, out, in]`, the shared expert's
//! gate as a `[hidden]` vector, and (llama arch) q/k rows permuted for
//! adjacent-pair rope. Weights stay bf16. gpt-oss's fused experts
//! (`gate_up_proj` `[E, hidden, 2·ffn]`, gate/up interleaved) are split and
//! transposed into `ffn_{gate,up,down}_exps` with their biases, as llama.cpp's
//! converter does.

use formats::gguf_writer::GgufWriter;
use kernels::DType;
use std::collections::BTreeMap;
use std::path::Path;

/// HF part of a layer tensor name → llama.cpp's.
const PARTS: [(&str, &str); 22] = [
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.router", "ffn_gate_inp"),
    ("self_attn", "attn_sinks"),
    ("block_sparse_moe.gate", "ffn_gate_inp"),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
    ("model.embed_tokens", "token_embd"),
    ("model.norm", "output_norm"),
    ("lm_head", "output"),
];

fn gguf_name(hf: &str) -> String {
    // gpt-oss's bare `self_attn.sinks` parameter.
    let hf = &hf.replace("self_attn.sinks", "self_attn.weight");
    let (stem, suffix) = hf.rsplit_once('.').unwrap();
    let (layer, part) = match stem.strip_prefix("model.layers.") {
        Some(rest) => {
            let (l, p) = rest.split_once('.').unwrap();
            (Some(l), p)
        }
        None => (None, stem),
    };
    let g = PARTS.iter().find(|(h, _)| *h == part).unwrap_or_else(|| panic!("no GGUF name for {hf}")).1;
    match layer {
        Some(l) => format!("blk.{l}.{g}.{suffix}"),
        None => format!("{g}.{suffix}"),
    }
}

/// llama.cpp's `permute` of q/k rows: within each head, the rotate-half order
/// `[2, hd/2]` becomes the pair order `[hd/2, 2]`.
fn permute_rows(data: &[u8], rows: usize, heads: usize) -> Vec<u8> {
    let rb = data.len() / rows;
    let hd = rows / heads;
    let mut out = vec![0u8; data.len()];
    for h in 0..heads {
        for a in 0..2 {
            for b in 0..hd / 2 {
                let (new, old) = (h * hd + b * 2 + a, h * hd + a * hd / 2 + b);
                out[new * rb..(new + 1) * rb].copy_from_slice(&data[old * rb..(old + 1) * rb]);
            }
        }
    }
    out
}

/// One expert's projection: shape and bytes, keyed by (layer, GGUF name) and
/// expert index below.
type Tensor = (Vec<usize>, Vec<u8>);

/// Writes fixture `dir`'s `model.safetensors` as a GGUF of architecture `arch`
/// with the integer metadata `ints` (`<arch>.` is prefixed). `heads`:
/// (query, KV) head counts, for the llama permutation.
pub fn write(dir: &Path, arch: &str, ints: &[(&str, u32)], heads: (usize, usize), path: &Path) {
    write_meta(dir, arch, ints, &[("rope.freq_base", 1e6)], &[], heads, path)
}

/// [`write`] with float and string metadata of its own (`<arch>.` prefixed).
pub fn write_meta(
    dir: &Path,
    arch: &str,
    ints: &[(&str, u32)],
    floats: &[(&str, f32)],
    strs: &[(&str, &str)],
    heads: (usize, usize),
    path: &Path,
) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", arch).add_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6);
    for (k, v) in ints {
        w.add_u32(&format!("{arch}.{k}"), *v);
    }
    for (k, v) in floats {
        w.add_f32(&format!("{arch}.{k}"), *v);
    }
    for (k, v) in strs {
        w.add_str(&format!("{arch}.{k}"), v);
    }
    let mut experts: BTreeMap<(String, &str), BTreeMap<usize, Tensor>> = BTreeMap::new();
    for (name, t) in st.tensors() {
        if let Some((pre, rest)) = name.split_once(".experts.") {
            if !rest.contains('.') {
                let layer = pre.strip_prefix("model.layers.").unwrap().split_once('.').unwrap().0;
                for (g, shape, data) in gpt_oss_experts(rest, t.shape(), t.data()) {
                    w.add_tensor(&format!("blk.{layer}.{g}"), &shape, DType::BF16, data);
                }
                continue;
            }
            let (e, proj) = rest.split_once('.').unwrap();
            let g = match proj {
                "gate_proj.weight" | "w1.weight" => "ffn_gate_exps",
                "up_proj.weight" | "w3.weight" => "ffn_up_exps",
                "down_proj.weight" | "w2.weight" => "ffn_down_exps",
                other => panic!("unknown expert tensor {other}"),
            };
            let layer = pre.strip_prefix("model.layers.").unwrap().split_once('.').unwrap().0.to_string();
            experts.entry((layer, g)).or_default().insert(e.parse().unwrap(), (t.shape().to_vec(), t.data().to_vec()));
            continue;
        }
        let mut g = gguf_name(&name);
        if arch == "gpt-oss" {
            g = g.replace("ffn_norm", "attn_post_norm");
        }
        let mut data = t.data().to_vec();
        let mut shape = t.shape().to_vec();
        if arch == "llama" && (g.ends_with("attn_q.weight") || g.ends_with("attn_k.weight")) {
            let n = if g.ends_with("attn_q.weight") { heads.0 } else { heads.1 };
            data = permute_rows(&data, shape[0], n);
        }
        if g.ends_with("ffn_gate_inp_shexp.weight") {
            shape = vec![shape[1]];
        }
        w.add_tensor(&g, &shape, DType::BF16, data);
    }
    for ((layer, g), per) in experts {
        let one = per[&0].0.clone();
        let data: Vec<u8> = per.values().flat_map(|(_, d)| d.iter().copied()).collect();
        w.add_tensor(&format!("blk.{layer}.{g}.weight"), &[per.len(), one[0], one[1]], DType::BF16, data);
    }
    w.write_to(path).unwrap();
}

/// One gpt-oss stacked expert tensor (bf16) → llama.cpp's tensors:
/// `gate_up_proj` `[E, h, 2f]` → `ffn_gate_exps`/`ffn_up_exps` `[E, f, h]`
/// (even/odd columns, transposed), `down_proj` `[E, f, h]` → `[E, h, f]`,
/// `gate_up_proj_bias` `[E, 2f]` → two `[E, f]` biases, `down_proj_bias` as is.
fn gpt_oss_experts(name: &str, shape: &[usize], data: &[u8]) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let at = |i: usize| [data[2 * i], data[2 * i + 1]];
    // `[E, rows, cols]` → `[E, cols', rows]` for the columns `pick` lists.
    let transposed = |e: usize, rows: usize, cols: usize, pick: &[usize]| -> Vec<u8> {
        let mut out = Vec::with_capacity(e * pick.len() * rows * 2);
        for x in 0..e {
            for &c in pick {
                for r in 0..rows {
                    out.extend(at((x * rows + r) * cols + c));
                }
            }
        }
        out
    };
    let even_odd = |n: usize| -> [Vec<usize>; 2] { [(0..n).step_by(2).collect(), (1..n).step_by(2).collect()] };
    match name {
        "gate_up_proj" => {
            let (e, h, f2) = (shape[0], shape[1], shape[2]);
            let [even, odd] = even_odd(f2);
            vec![
                ("ffn_gate_exps.weight".into(), vec![e, f2 / 2, h], transposed(e, h, f2, &even)),
                ("ffn_up_exps.weight".into(), vec![e, f2 / 2, h], transposed(e, h, f2, &odd)),
            ]
        }
        "down_proj" => {
            let (e, f, h) = (shape[0], shape[1], shape[2]);
            vec![("ffn_down_exps.weight".into(), vec![e, h, f], transposed(e, f, h, &(0..h).collect::<Vec<_>>()))]
        }
        "gate_up_proj_bias" => {
            let (e, f2) = (shape[0], shape[1]);
            let [even, odd] = even_odd(f2);
            let pick = |cols: &[usize]| -> Vec<u8> {
                (0..e).flat_map(|x| cols.iter().flat_map(move |&c| at(x * f2 + c))).collect()
            };
            vec![
                ("ffn_gate_exps.bias".into(), vec![e, f2 / 2], pick(&even)),
                ("ffn_up_exps.bias".into(), vec![e, f2 / 2], pick(&odd)),
            ]
        }
        "down_proj_bias" => vec![("ffn_down_exps.bias".into(), shape.to_vec(), data.to_vec())],
        other => panic!("unknown gpt-oss expert tensor {other}"),
    }
}
