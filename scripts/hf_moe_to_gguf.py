#!/usr/bin/env python3
"""Converts a small HF mixture-of-experts checkpoint (qwen3_moe, qwen2_moe,
mixtral or deepseek_v3; bf16/f32 `model.safetensors` + `config.json`) to GGUF
with llama.cpp's own Python package (`gguf`), the way llama.cpp's
`convert_hf_to_gguf.py` lays it out:

- tensor names from gguf-py's `TensorNameMap` for the architecture (so they are
  llama.cpp's names, not ours);
- each layer's experts stacked into one `ffn_{gate,up,down}_exps` tensor
  `[n_experts, out, in]` (HF keeps one tensor per expert);
- Mixtral as arch `llama` with q/k rows permuted for adjacent-pair rope, as the
  converter does;
- the shared expert's gate (qwen2_moe) as a `[hidden]` vector;
- the MoE metadata keys (`expert_count`, `expert_used_count`,
  `expert_feed_forward_length`, `expert_shared_feed_forward_length`).
- deepseek_v3 as arch `deepseek2`, as b11434's `DeepseekV2Model` writes it:
  `kv_b_proj` split per head into `attn_k_b` (each head's k rows transposed,
  `[heads, kv_lora, nope]`) and `attn_v_b` (`[heads, v, kv_lora]`);
  `e_score_correction_bias` as `exp_probs_b.bias`; no q/k permutation (llama.cpp
  ropes deepseek2 in adjacent pairs, which is HF's `rope_interleave`);
  `head_count_kv` 1 and `key_length`/`value_length` of the latent cache
  (`kv_lora + rope`, `kv_lora`) beside `key_length_mla`/`value_length_mla`;
  `q_lora_rank`, `kv_lora_rank`, `rope.dimension_count`,
  `leading_dense_block_count`, `expert_shared_count`, `expert_weights_scale`,
  `expert_weights_norm` (only when true), `expert_group_count`,
  `expert_group_used_count`, `expert_gating_func`, and yarn's
  `yarn_log_multiplier` = 0.1 · mscale_all_dim. One deviation: transformers'
  DeepseekV3Config has no `scoring_func`, so the converter would leave
  `expert_gating_func` out (llama.cpp then routes by softmax, the V2 rule);
  it is written as sigmoid, which DeepSeek V3 always uses and its released
  config.json states.

Weights are written as F32 (the bf16 values exactly), so the GGUF must give the
transformers logits; `--outtype bf16|f16|q8_0` writes the 2-D and 3-D weights in
that type instead, with the converter's exceptions (1-D tensors, norms,
routers `ffn_gate_inp*` and non-`.weight` tensors stay F32), through gguf-py's
own `gguf.quants` (bf16 is again exact for a bf16 checkpoint). Layers that are dense in a MoE model (qwen's
`mlp_only_layers`) get the dense names `ffn_gate/up/down`, which llama.cpp's
qwen3moe graph does not expect but shardlm reads as a dense layer.

With `--dummy-vocab`, a placeholder SentencePiece vocabulary (`<unk>`, `<s>`,
`</s>`, then `t3`, `t4`, ...) is added so llama.cpp itself loads the file
(its loader needs a tokenizer; ids are all that is compared).

Usage: scripts/hf_moe_to_gguf.py HF_DIR OUT.gguf [--dummy-vocab] [--outtype f32|bf16|f16|q8_0]
Needs `numpy` and `gguf` (pip install numpy gguf).
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

ARCHS = {
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
    "deepseek_v3": gguf.MODEL_ARCH.DEEPSEEK2,
}
# Dense-layer names for the MoE architectures that lack them.
DENSE_TWIN = {
    gguf.MODEL_ARCH.QWEN3MOE: gguf.MODEL_ARCH.QWEN3,
    gguf.MODEL_ARCH.QWEN2MOE: gguf.MODEL_ARCH.QWEN2,
    gguf.MODEL_ARCH.LLAMA: gguf.MODEL_ARCH.LLAMA,
    gguf.MODEL_ARCH.DEEPSEEK2: gguf.MODEL_ARCH.DEEPSEEK2,
}


def read_safetensors(path: Path) -> dict:
    """name -> float32 array (bf16, f16 and f32 accepted)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a : base + b]
        dt, shape = info["dtype"], info["shape"]
        if dt == "BF16":
            v = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            v = np.frombuffer(buf, dtype=np.float16).astype(np.float32)
        elif dt == "F32":
            v = np.frombuffer(buf, dtype=np.float32)
        else:
            sys.exit(f"error: {path}: tensor {name} has dtype {dt}; expected BF16, F16 or F32")
        out[name] = v.reshape(shape)
    return out


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation: per head, rotate-half order -> pair order."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_theta(cfg: dict) -> float:
    # Older configs keep rope_theta at the top level, newer ones in rope_parameters.
    return float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def add_yarn(w: gguf.GGUFWriter, cfg: dict) -> dict:
    """TextModel's rope scaling keys (yarn only); returns the rope parameters."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind == "yarn" and rope.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if (f := rope.get("attention_factor", rope.get("attn_factor"))) is not None:
            w.add_rope_scaling_yarn_attn_factor(f)
        if (b := rope.get("beta_fast")) is not None:
            w.add_rope_scaling_yarn_beta_fast(b)
        if (b := rope.get("beta_slow")) is not None:
            w.add_rope_scaling_yarn_beta_slow(b)
    elif kind not in (None, "default"):
        sys.exit(f"error: rope scaling {kind!r} is not handled by this script")
    return rope


def deepseek2_metadata(w: gguf.GGUFWriter, cfg: dict) -> None:
    """The keys `DeepseekV2Model.set_gguf_parameters` (and the `TextModel`
    keys under it) end up with, for a DeepSeek V3 config."""
    heads, rope_dim, kv_lora = cfg["num_attention_heads"], cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    # MLA with absorption runs as MQA: one KV "head" of the latent ‖ rope key.
    w.add_head_count_kv(1)
    rope = add_yarn(w, cfg)
    w.add_rope_freq_base(rope_theta(cfg))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(cfg["topk_group"])
    # See the module docs: sigmoid unless the config says otherwise.
    scoring = cfg.get("scoring_func", "sigmoid")
    w.add_expert_gating_func(
        {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID, "softmax": gguf.ExpertGatingFuncType.SOFTMAX}[scoring]
    )
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace") or 0)
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank") is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + rope_dim)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope_dim)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope_dim)
    if rope.get("mscale_all_dim") is not None:
        # llama.cpp's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: stored times 0.1.
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def split_kv_b(t: np.ndarray, cfg: dict) -> tuple:
    """`kv_b_proj` `[heads·(nope + v), r]` → (`k_b` `[heads, r, nope]`, `v_b`
    `[heads, v, r]`), as the converter's `modify_tensors` does (its head count
    is the config's `num_key_value_heads`, read before it is set to 1)."""
    heads, nope, v = cfg["num_key_value_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    kv_b = t.reshape(heads, nope + v, t.shape[-1])
    return kv_b[:, :nope, :].transpose(0, 2, 1), kv_b[:, nope:, :]


def deepseek2_tensors(plain: dict, cfg: dict) -> dict:
    """The renames of `ModelBase.filter_tensors` (`e_score_correction_bias` →
    `e_score_correction.bias`, mapped to `exp_probs_b.bias`) and the
    `kv_b_proj` split of `DeepseekV2Model.modify_tensors`."""
    out = {}
    for name, t in plain.items():
        if name.endswith("e_score_correction_bias"):
            out[name.replace("e_score_correction_bias", "e_score_correction.bias")] = t
        elif name.endswith("kv_b_proj.weight"):
            out[name.replace("kv_b_proj", "k_b_proj")], out[name.replace("kv_b_proj", "v_b_proj")] = split_kv_b(t, cfg)
        else:
            out[name] = t
    return out


def add_dummy_vocab(w: gguf.GGUFWriter, n: int) -> None:
    """A placeholder SentencePiece vocabulary of `n` tokens (see the module docs)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n)
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (n - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def generic_metadata(w: gguf.GGUFWriter, cfg: dict) -> None:
    """qwen2_moe / qwen3_moe / mixtral keys."""
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_theta(cfg))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if "moe_intermediate_size" in cfg:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])


OUTTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}


def tensor_type(name: str, t: np.ndarray, outtype: str):
    """`ModelBase.prepare_tensors`' choice for tensor `name` (GGUF name)."""
    if outtype == "f32" or t.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    if ".ffn_gate_inp" in name:
        return gguf.GGMLQuantizationType.F32
    return OUTTYPES[outtype][0]


def add(w: gguf.GGUFWriter, name: str, t: np.ndarray, outtype: str) -> None:
    t = np.ascontiguousarray(t, dtype=np.float32)
    qtype = tensor_type(name, t, outtype)
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, t)
        return
    try:
        w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    except gguf.QuantError:
        # As the converter: rows that are not whole blocks fall back to F16.
        w.add_tensor(name, gguf.quants.quantize(t, gguf.GGMLQuantizationType.F16), raw_dtype=gguf.GGMLQuantizationType.F16)


def main() -> None:
    argv = sys.argv[1:]
    outtype = "f32"
    if "--outtype" in argv:
        i = argv.index("--outtype")
        if i + 1 >= len(argv) or argv[i + 1] not in OUTTYPES:
            sys.exit(f"error: --outtype needs one of {', '.join(OUTTYPES)}")
        outtype = argv[i + 1]
        del argv[i : i + 2]
    args = [a for a in argv if a != "--dummy-vocab"]
    if len(args) != 2:
        sys.exit(__doc__)
    src, out = Path(args[0]), Path(args[1])
    cfg = json.loads((src / "config.json").read_text())
    mt = cfg["model_type"]
    if mt not in ARCHS:
        sys.exit(f"error: {src}: model_type {mt!r} is not one of {', '.join(ARCHS)}")
    arch = ARCHS[mt]
    n_layers = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, n_layers)
    dense_names = gguf.get_tensor_name_map(DENSE_TWIN[arch], n_layers)
    tensors = read_safetensors(src / "model.safetensors")

    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if arch == gguf.MODEL_ARCH.DEEPSEEK2:
        deepseek2_metadata(w, cfg)
    else:
        generic_metadata(w, cfg)
    w.add_file_type(OUTTYPES[outtype][1])
    if "--dummy-vocab" in sys.argv[1:]:
        add_dummy_vocab(w, cfg["vocab_size"])

    # Stack experts: (layer, proj) -> {expert: array}.
    stacks: dict = {}
    plain = {}
    for name, t in tensors.items():
        if ".experts." in name:
            pre, rest = name.split(".experts.")
            e, proj = rest.split(".", 1)
            proj = {"w1.weight": "gate_proj", "w3.weight": "up_proj", "w2.weight": "down_proj"}.get(
                proj, proj.removesuffix(".weight")
            )
            stacks.setdefault((pre, proj), {})[int(e)] = t
        else:
            plain[name] = t

    def gguf_name(hf: str) -> str:
        got = names.get_name(hf, try_suffixes=(".weight", ".bias")) or dense_names.get_name(
            hf, try_suffixes=(".weight", ".bias")
        )
        if got is None:
            sys.exit(f"error: {src}: no llama.cpp name for tensor {hf}")
        return got

    if arch == gguf.MODEL_ARCH.DEEPSEEK2:
        plain = deepseek2_tensors(plain, cfg)
    for name, t in plain.items():
        g = gguf_name(name)
        if arch == gguf.MODEL_ARCH.LLAMA and (g.endswith("attn_q.weight") or g.endswith("attn_k.weight")):
            t = permute(t, heads if g.endswith("attn_q.weight") else kv_heads)
        if g.endswith("ffn_gate_inp_shexp.weight"):
            t = t.reshape(-1)
        add(w, g, t, outtype)
    for (pre, proj), per in sorted(stacks.items()):
        stacked = np.stack([per[e] for e in sorted(per)])
        # Mixtral's block is `block_sparse_moe`; the name map knows `mlp.experts`.
        g = gguf_name(f"{pre.replace('block_sparse_moe', 'mlp')}.experts.{proj}.weight")
        add(w, g, stacked, outtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({len(plain)} tensors + {len(stacks)} expert stacks)")


if __name__ == "__main__":
    main()
