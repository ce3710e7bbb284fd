#!/usr/bin/env python3
"""Writes the ~1.1B random llama of make_test_model.py as an HF checkpoint in bf16.

Same shape (TinyLlama-1.1B with vocab 49152 and a separate lm_head) and weight
distribution (N(0, 0.02), norms all ones) as the GGUF files, so `shardlm quantize`
can turn it into NVFP4/MXFP4/FP8 safetensors for the benchmarks next to the GGUF
ones. No tokenizer (benchmarks feed token ids). Written tensor by tensor: the
safetensors header first (the shapes are known), then each tensor's bytes.

Usage: scripts/make_test_model_hf.py [--out DIR] [--seed N]
Default output: $SHARDLM_CACHE/test-1b/llama-1b-hf/ (config.json, model.safetensors).
Needs numpy.
"""

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_test_model import SHAPE, STD, cache_dir  # noqa: E402

VOCAB = 49152


def tensor_list(s: dict):
    """(HF name, shape, is_norm) in file order."""
    h, f = s["hidden"], s["ffn"]
    q, kv = s["n_heads"] * s["head_dim"], s["n_kv_heads"] * s["head_dim"]
    out = [("model.embed_tokens.weight", (VOCAB, h), False)]
    for i in range(s["n_layers"]):
        b = f"model.layers.{i}."
        out += [
            (b + "input_layernorm.weight", (h,), True),
            (b + "self_attn.q_proj.weight", (q, h), False),
            (b + "self_attn.k_proj.weight", (kv, h), False),
            (b + "self_attn.v_proj.weight", (kv, h), False),
            (b + "self_attn.o_proj.weight", (h, q), False),
            (b + "post_attention_layernorm.weight", (h,), True),
            (b + "mlp.gate_proj.weight", (f, h), False),
            (b + "mlp.up_proj.weight", (f, h), False),
            (b + "mlp.down_proj.weight", (h, f), False),
        ]
    out += [("model.norm.weight", (h,), True), ("lm_head.weight", (VOCAB, h), False)]
    return out


def to_bf16(x: np.ndarray) -> np.ndarray:
    """f32 → bf16 bits, round to nearest even (no NaN here)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=cache_dir() / "test-1b" / "llama-1b-hf")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    st = args.out / "model.safetensors"
    if st.exists():
        print("already present:", st)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    s = SHAPE
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"],
        "num_hidden_layers": s["n_layers"],
        "num_attention_heads": s["n_heads"],
        "num_key_value_heads": s["n_kv_heads"],
        "head_dim": s["head_dim"],
        "rope_theta": s["rope_theta"],
        "rms_norm_eps": s["rms_eps"],
        "max_position_embeddings": s["ctx"],
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=1))

    tensors = tensor_list(s)
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(args.seed)
    part = st.with_suffix(".safetensors.part")
    t0 = time.time()
    with open(part, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for i, (name, shape, is_norm) in enumerate(tensors):
            if is_norm:
                data = np.ones(shape, np.float32)
            else:
                data = rng.standard_normal(shape, dtype=np.float32)
                data *= STD
            fh.write(to_bf16(data).tobytes())
            if i % 27 == 0:
                print(f"  {i + 1}/{len(tensors)} tensors, {time.time() - t0:.0f} s", flush=True)
    part.rename(st)
    print(f"wrote {st} ({st.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
