#!/usr/bin/env python3
"""Writes a random-weight Qwen3-Next-shaped HF checkpoint (bf16) for benchmarks.

Default shape (~2.0B total, ~0.5B active): hidden 1024, 24 layers in the 3:1
pattern (18 Gated DeltaNet, 6 gated full attention), linear attention with 8
key / 16 value heads of 128 (conv kernel 4), full attention 8 heads / 2 KV
heads of 128 (partial rotary 0.25), 64 experts of width 384 top-8 plus a
gated shared expert of 768, vocab 32000. `--tiny` writes a 2-layer toy of
the same layout (to check the script); `--1b` a ~1.2B-total one (experts of
width 192, shared expert 384; ~0.35B active), the shape of the llama.cpp
comparison in docs/PERFORMANCE.md. Weights N(0, 0.02); RMSNorm weights 0
(the zero-centered norms mean 1 + w = 1), the gated norm's 1; A_log log(U(1,16)),
dt_bias 1. No tokenizer (benchmarks feed token ids). Written tensor by
tensor, the safetensors header first.

Usage: scripts/make_hybrid_model.py [--out DIR] [--seed N] [--tiny | --1b]
Default output: $SHARDLM_CACHE/test-hybrid/qwen3-next-2b-hf/. Needs numpy.
"""

import argparse
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_model import cache_dir  # noqa: E402

SHAPE = dict(hidden=1024, layers=24, nk=8, nv=16, dk=128, dv=128, conv=4, heads=8, kv_heads=2, head_dim=128,
             experts=64, top_k=8, expert_ffn=384, shared_ffn=768, vocab=32000)
ONE_B = dict(SHAPE, expert_ffn=192, shared_ffn=384)
TINY = dict(SHAPE, hidden=128, layers=4, nk=2, nv=4, dk=32, dv=32, heads=4, kv_heads=2, head_dim=32, experts=8,
            top_k=2, expert_ffn=64, shared_ffn=64, vocab=1024)


def tensors(s: dict):
    """(name, shape, init) in file order; init: normal, zeros, ones, a_log, dt."""
    h, e = s["hidden"], s["expert_ffn"]
    key, val = s["nk"] * s["dk"], s["nv"] * s["dv"]
    out = [("model.embed_tokens.weight", (s["vocab"], h), "normal")]
    for i in range(s["layers"]):
        b = f"model.layers.{i}."
        out.append((b + "input_layernorm.weight", (h,), "zeros"))
        if (i + 1) % 4 != 0:
            la = b + "linear_attn."
            out += [
                (la + "in_proj_qkvz.weight", (2 * key + 2 * val, h), "normal"),
                (la + "in_proj_ba.weight", (2 * s["nv"], h), "normal"),
                (la + "conv1d.weight", (2 * key + val, 1, s["conv"]), "normal"),
                (la + "A_log", (s["nv"],), "a_log"),
                (la + "dt_bias", (s["nv"],), "dt"),
                (la + "norm.weight", (s["dv"],), "ones"),
                (la + "out_proj.weight", (h, val), "normal"),
            ]
        else:
            q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
            at = b + "self_attn."
            out += [
                (at + "q_proj.weight", (2 * q, h), "normal"),
                (at + "k_proj.weight", (kv, h), "normal"),
                (at + "v_proj.weight", (kv, h), "normal"),
                (at + "o_proj.weight", (h, q), "normal"),
                (at + "q_norm.weight", (s["head_dim"],), "zeros"),
                (at + "k_norm.weight", (s["head_dim"],), "zeros"),
            ]
        out.append((b + "post_attention_layernorm.weight", (h,), "zeros"))
        m = b + "mlp."
        out.append((m + "gate.weight", (s["experts"], h), "normal"))
        for x in range(s["experts"]):
            out += [
                (m + f"experts.{x}.gate_proj.weight", (e, h), "normal"),
                (m + f"experts.{x}.up_proj.weight", (e, h), "normal"),
                (m + f"experts.{x}.down_proj.weight", (h, e), "normal"),
            ]
        f = s["shared_ffn"]
        out += [
            (m + "shared_expert.gate_proj.weight", (f, h), "normal"),
            (m + "shared_expert.up_proj.weight", (f, h), "normal"),
            (m + "shared_expert.down_proj.weight", (h, f), "normal"),
            (m + "shared_expert_gate.weight", (1, h), "normal"),
        ]
    out += [("model.norm.weight", (h,), "zeros"), ("lm_head.weight", (s["vocab"], h), "normal")]
    return out


def config(s: dict) -> dict:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": s["hidden"],
        "intermediate_size": s["expert_ffn"],
        "num_hidden_layers": s["layers"],
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(s["layers"])],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "linear_num_key_heads": s["nk"],
        "linear_num_value_heads": s["nv"],
        "linear_key_head_dim": s["dk"],
        "linear_value_head_dim": s["dv"],
        "linear_conv_kernel_dim": s["conv"],
        "num_experts": s["experts"],
        "num_experts_per_tok": s["top_k"],
        "moe_intermediate_size": s["expert_ffn"],
        "shared_expert_intermediate_size": s["shared_ffn"],
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "vocab_size": s["vocab"],
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=cache_dir() / "test-hybrid" / "qwen3-next-2b-hf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--1b", dest="one_b", action="store_true")
    args = ap.parse_args()
    s = TINY if args.tiny else ONE_B if args.one_b else SHAPE
    st = args.out / "model.safetensors"
    if st.exists():
        print("already present:", st)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config(s), indent=1))
    ts = tensors(s)
    header, offset = {}, 0
    for name, shape, _ in ts:
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
        for i, (name, shape, init) in enumerate(ts):
            if init == "normal":
                data = rng.standard_normal(shape, dtype=np.float32) * 0.02
            elif init == "zeros":
                data = np.zeros(shape, np.float32)
            elif init == "ones":
                data = np.ones(shape, np.float32)
            elif init == "a_log":
                data = np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
            else:
                data = np.ones(shape, np.float32)
            fh.write(to_bf16(data).tobytes())
            if i % 200 == 0:
                print(f"  {i + 1}/{len(ts)} tensors, {time.time() - t0:.0f} s", flush=True)
    part.rename(st)
    print(f"wrote {st} ({st.stat().st_size / 2**30:.2f} GiB, {offset / 2 / 1e9:.2f} B params)")


if __name__ == "__main__":
    main()
