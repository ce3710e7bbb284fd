#!/usr/bin/env python3
"""Converts a small HF hybrid linear-attention checkpoint (qwen3_next,
qwen3_5_text or qwen3_5_moe_text; bf16/f32 `model.safetensors` +
`config.json`) to GGUF with llama.cpp's own Python package (`gguf`), laid out
as llama.cpp b11434's `convert_hf_to_gguf.py` writes it (`conversion/qwen.py`:
`Qwen3NextModel`, `_LinearAttentionVReorderBase`, `Qwen3_5TextModel`,
`Qwen3_5MoeTextModel`):

- arch `qwen3next`, `qwen35` or `qwen35moe`; tensor names from gguf-py's
  `TensorNameMap` for that arch (so `post_attention_layernorm` is
  `post_attention_norm`, `linear_attn.in_proj_ba` is `ssm_ba`, ...);
- `A_log` stored as `ssm_a = -exp(A_log)`, `dt_bias` as `ssm_dt.bias`, the
  conv `[C, 1, K]` squeezed to `[C, K]` (kept F32), every RMSNorm but the
  gated one (`linear_attn.norm`) stored as `1 + w`;
- Qwen3-Next's fused `in_proj_qkvz` (grouped per key head) split into
  `attn_qkv` (all q, all k, all v) and `attn_gate` (z);
- Qwen3.5: the value heads reordered from grouped to tiled order (head
  `k*r + j` moves to `j*nk + k`) in the v rows of `attn_qkv` and of the conv,
  `attn_gate`, `ssm_beta`, `ssm_alpha`, `ssm_a`, `ssm_dt` and the columns of
  `ssm_out`; `rope.dimension_sections` [11, 11, 10, 0] when the config has no
  `mrope_section`;
- metadata: the generic keys, the MoE ones, `ssm.conv_kernel`,
  `ssm.state_size` (key head width), `ssm.group_count` (key heads),
  `ssm.time_step_rank` (value heads), `ssm.inner_size` (value width),
  `attention.recurrent_layers`, `full_attention_interval` and
  `rope.dimension_count` = head_dim * partial_rotary_factor;
- experts stacked into `ffn_{gate,up,down}_exps` `[n_expert, out, in]`.

`--legacy-ssm-in` writes Qwen3-Next's `in_proj_qkvz` whole as `ssm_in` (as
older converters did; llama.cpp still reads it).

Weights are F32 by default (the bf16 values exactly); `--outtype bf16|f16|q8_0`
as in `scripts/hf_moe_to_gguf.py`, whose helpers this uses. `--dummy-vocab`
adds a placeholder vocabulary so llama.cpp itself loads the file.

Usage: scripts/hf_hybrid_to_gguf.py HF_DIR OUT.gguf [--dummy-vocab] [--legacy-ssm-in] [--outtype f32|bf16|f16|q8_0]
Needs `numpy` and `gguf` (pip install numpy gguf).
"""

import json
import sys
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_moe_to_gguf import OUTTYPES, add, add_dummy_vocab, read_safetensors, rope_theta  # noqa: E402

ARCHS = {
    "qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT,
    "qwen3_5_text": gguf.MODEL_ARCH.QWEN35,
    "qwen3_5": gguf.MODEL_ARCH.QWEN35,
    "qwen3_5_moe_text": gguf.MODEL_ARCH.QWEN35MOE,
    "qwen3_5_moe": gguf.MODEL_ARCH.QWEN35MOE,
}


def rope_parameters(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def metadata(w: gguf.GGUFWriter, cfg: dict, arch) -> None:
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    n_layers = cfg["num_hidden_layers"]
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    if cfg.get("intermediate_size"):
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_theta(cfg))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("num_experts"):
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    if (types := cfg.get("layer_types")) is not None:
        # b11434's `add_recurrent_layers` (older gguf-py releases lack the method).
        w.add_array(f"{w.arch}.attention.recurrent_layers", [t == "linear_attention" for t in types])
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    rope = rope_parameters(cfg)
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    if arch != gguf.MODEL_ARCH.QWEN3NEXT:
        w.add_rope_dimension_sections((list(rope.get("mrope_section", [11, 11, 10])) + [0, 0, 0, 0])[:4])


def tiled(t: np.ndarray, axis: int, nk: int, r: int, width: int) -> np.ndarray:
    """Value heads along `axis` (each `width` wide) from grouped (k, j) to tiled (j, k) order."""
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(nk, r, width, *rest).swapaxes(0, 1).reshape(nk * r * width, *rest)
    return np.moveaxis(t, 0, axis)


def transform(name: str, t: np.ndarray, cfg: dict, arch, legacy: bool = False) -> list:
    """One HF tensor → [(HF-like name for the name map, array)] (the converter's `modify_tensors`)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = nv // nk
    if arch != gguf.MODEL_ARCH.QWEN3NEXT and nk != nv and "linear_attn." in name:
        if ".in_proj_qkv." in name:
            t = np.concatenate([t[: 2 * nk * dk], tiled(t[2 * nk * dk :], 0, nk, r, dv)])
        elif ".in_proj_z." in name:
            t = tiled(t, 0, nk, r, dv)
        elif ".in_proj_b." in name or ".in_proj_a." in name or ".A_log" in name or ".dt_bias" in name:
            t = tiled(t, 0, nk, r, 1)
        elif ".conv1d." in name:
            t = t.reshape(t.shape[0], -1)
            t = np.concatenate([t[: 2 * nk * dk], tiled(t[2 * nk * dk :], 0, nk, r, dv)])
        elif ".out_proj." in name:
            t = tiled(t, 1, nk, r, dv)
    if name.endswith(".A_log"):
        return [(name, -np.exp(t))]
    if name.endswith(".dt_bias"):
        return [(name.removesuffix(".dt_bias") + ".dt_proj.bias", t)]
    if "conv1d" in name:
        return [(name, t.reshape(t.shape[0], -1))]
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return [(name, t + 1)]
    if name.endswith("in_proj_qkvz.weight") and not legacy:
        # Per key head [q dk | k dk | v r*dv | z r*dv] → all q, all k, all v; z.
        g = t.reshape(nk, 2 * dk + 2 * r * dv, -1)
        q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
        bid = name.split(".")[2]
        flat = [x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)]
        return [(f"@blk.{bid}.attn_qkv.weight", np.concatenate(flat[:3])), (f"@blk.{bid}.attn_gate.weight", flat[3])]
    return [(name, t)]


def main() -> None:
    argv = sys.argv[1:]
    outtype = "f32"
    if "--outtype" in argv:
        i = argv.index("--outtype")
        if i + 1 >= len(argv) or argv[i + 1] not in OUTTYPES:
            sys.exit(f"error: --outtype needs one of {', '.join(OUTTYPES)}")
        outtype = argv[i + 1]
        del argv[i : i + 2]
    legacy = "--legacy-ssm-in" in argv
    args = [a for a in argv if a not in ("--dummy-vocab", "--legacy-ssm-in")]
    if len(args) != 2:
        sys.exit(__doc__)
    src, out = Path(args[0]), Path(args[1])
    cfg = json.loads((src / "config.json").read_text())
    cfg = {**cfg, **cfg.get("text_config", {})}
    mt = cfg["model_type"]
    if mt not in ARCHS:
        sys.exit(f"error: {src}: model_type {mt!r} is not one of {', '.join(ARCHS)}")
    arch = ARCHS[mt]
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    tensors = read_safetensors(src / "model.safetensors")

    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    metadata(w, cfg, arch)
    w.add_file_type(OUTTYPES[outtype][1])
    if "--dummy-vocab" in sys.argv[1:]:
        add_dummy_vocab(w, cfg["vocab_size"])

    def gguf_name(hf: str) -> str:
        if hf.startswith("@"):
            return hf[1:]
        got = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if got is None:
            sys.exit(f"error: {src}: no llama.cpp name for tensor {hf}")
        return got

    stacks: dict = {}
    n_plain = 0
    for name, t in tensors.items():
        if ".experts." in name:
            pre, rest = name.split(".experts.")
            e, proj = rest.split(".", 1)
            stacks.setdefault((pre, proj.removesuffix(".weight")), {})[int(e)] = t
            continue
        for hf, x in transform(name, t, cfg, arch, legacy):
            g = gguf_name(hf)
            if g.endswith("ffn_gate_inp_shexp.weight"):
                x = x.reshape(-1)
            if ".ssm_conv1d." in g:
                # The converter keeps the conv in F32 whatever the outtype.
                w.add_tensor(g, np.ascontiguousarray(x, dtype=np.float32))
            else:
                add(w, g, x, outtype)
            n_plain += 1
    for (pre, proj), per in sorted(stacks.items()):
        add(w, gguf_name(f"{pre}.experts.{proj}.weight"), np.stack([per[e] for e in sorted(per)]), outtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({n_plain} tensors + {len(stacks)} expert stacks)")


if __name__ == "__main__":
    main()
