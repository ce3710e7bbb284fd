#!/usr/bin/env python3
"""Converts a small HF mixture-of-experts checkpoint (qwen3_moe, qwen2_moe or
mixtral; bf16/f32 `model.safetensors` + `config.json`) to GGUF with llama.cpp's
own Python package (`gguf`), the way llama.cpp's `convert_hf_to_gguf.py` lays it
out:

- tensor names from gguf-py's `TensorNameMap` for the architecture (so they are
  llama.cpp's names, not ours);
- each layer's experts stacked into one `ffn_{gate,up,down}_exps` tensor
  `[n_experts, out, in]` (HF keeps one tensor per expert);
- Mixtral as arch `llama` with q/k rows permuted for adjacent-pair rope, as the
  converter does;
- the shared expert's gate (qwen2_moe) as a `[hidden]` vector;
- the MoE metadata keys (`expert_count`, `expert_used_count`,
  `expert_feed_forward_length`, `expert_shared_feed_forward_length`).

Weights are written as F32 (the bf16 values exactly), so the GGUF must give the
transformers logits. Layers that are dense in a MoE model (qwen's
`mlp_only_layers`) get the dense names `ffn_gate/up/down`, which llama.cpp's
qwen3moe graph does not expect but shardlm reads as a dense layer.

Usage: scripts/hf_moe_to_gguf.py HF_DIR OUT.gguf
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
}
# Dense-layer names for the MoE architectures that lack them.
DENSE_TWIN = {
    gguf.MODEL_ARCH.QWEN3MOE: gguf.MODEL_ARCH.QWEN3,
    gguf.MODEL_ARCH.QWEN2MOE: gguf.MODEL_ARCH.QWEN2,
    gguf.MODEL_ARCH.LLAMA: gguf.MODEL_ARCH.LLAMA,
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


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
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
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    # Older configs keep rope_theta at the top level, newer ones in rope_parameters.
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if "moe_intermediate_size" in cfg:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

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

    for name, t in plain.items():
        g = gguf_name(name)
        if arch == gguf.MODEL_ARCH.LLAMA and (g.endswith("attn_q.weight") or g.endswith("attn_k.weight")):
            t = permute(t, heads if g.endswith("attn_q.weight") else kv_heads)
        if g.endswith("ffn_gate_inp_shexp.weight"):
            t = t.reshape(-1)
        w.add_tensor(g, np.ascontiguousarray(t, dtype=np.float32))
    for (pre, proj), per in sorted(stacks.items()):
        stacked = np.stack([per[e] for e in sorted(per)])
        # Mixtral's block is `block_sparse_moe`; the name map knows `mlp.experts`.
        g = gguf_name(f"{pre.replace('block_sparse_moe', 'mlp')}.experts.{proj}.weight")
        w.add_tensor(g, np.ascontiguousarray(stacked, dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({len(plain)} tensors + {len(stacks)} expert stacks)")


if __name__ == "__main__":
    main()
