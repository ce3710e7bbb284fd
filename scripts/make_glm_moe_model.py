#!/usr/bin/env python3
"""Writes a random-weight GLM-4.5-shaped mixture-of-experts model as a Hugging
Face directory (config.json, model.safetensors in bf16, a placeholder BPE
tokenizer.json), for `shardlm quantize DIR out.gguf --to q4_0` and a benchmark
against llama.cpp on the same GGUF (issue 25; scripts/bench-glm-moe.sh).

Shape (a scaled-down GLM-4.5-Air): 24 layers, the first dense (width 2816),
hidden 1024, 8 query heads and 2 KV heads of 128 with q/k/v biases, rotary on
half of each head, 64 routed experts of width 512 with top-8 sigmoid routing
(a correction bias, one group, routed scaling 2.5, renormalized) and one shared
expert of width 512, vocabulary 49152, untied head, no MTP layer. About 2.5B
parameters, 0.4B active per token.

Experts are drawn from a pool of 32 random N(0, 0.02) matrices per projection
shape (as scripts/make_moe_model.py does), so generation takes seconds while
the file still holds distinct bytes per expert; everything else is drawn per
tensor. The routers' correction biases are small random values, so routing
varies by token.

Usage: scripts/make_glm_moe_model.py [--out DIR] [--seed N] [--force]
Default output: $SHARDLM_CACHE/test-glm/glm4moe-2.5b-hf. Needs numpy.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_model import cache_dir  # noqa: E402

CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "vocab_size": 49152,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "partial_rotary_factor": 0.5,
    "attention_bias": True,
    "use_qk_norm": False,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
STD = 0.02
POOL = 32


def bf16(a: np.ndarray) -> bytes:
    """float32 → bf16 bytes, rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.tobytes()


def tensors(c: dict):
    """(name, shape, kind) in file order; kind: norm, bias, router, expert or dense."""
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    e, f, fd = c["n_routed_experts"], c["moe_intermediate_size"], c["intermediate_size"]
    out = [("model.embed_tokens.weight", (c["vocab_size"], h), "dense")]
    for i in range(c["num_hidden_layers"]):
        b = f"model.layers.{i}."
        out += [
            (b + "input_layernorm.weight", (h,), "norm"),
            (b + "self_attn.q_proj.weight", (q, h), "dense"),
            (b + "self_attn.q_proj.bias", (q,), "bias"),
            (b + "self_attn.k_proj.weight", (kv, h), "dense"),
            (b + "self_attn.k_proj.bias", (kv,), "bias"),
            (b + "self_attn.v_proj.weight", (kv, h), "dense"),
            (b + "self_attn.v_proj.bias", (kv,), "bias"),
            (b + "self_attn.o_proj.weight", (h, q), "dense"),
            (b + "post_attention_layernorm.weight", (h,), "norm"),
        ]
        if i < c["first_k_dense_replace"]:
            out += [(b + f"mlp.{p}_proj.weight", s, "dense")
                    for p, s in [("gate", (fd, h)), ("up", (fd, h)), ("down", (h, fd))]]
            continue
        out += [(b + "mlp.gate.weight", (e, h), "router"), (b + "mlp.gate.e_score_correction_bias", (e,), "bias")]
        for x in range(e):
            out += [(b + f"mlp.experts.{x}.{p}_proj.weight", s, "expert")
                    for p, s in [("gate", (f, h)), ("up", (f, h)), ("down", (h, f))]]
        out += [(b + f"mlp.shared_experts.{p}_proj.weight", s, "dense")
                for p, s in [("gate", (f, h)), ("up", (f, h)), ("down", (h, f))]]
    out += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (c["vocab_size"], h), "dense")]
    return out


def placeholder_tokenizer(n: int) -> dict:
    """`<unk> <s> </s> t3 t4 …`, no merges: llama.cpp will not load a GGUF
    without a vocabulary, and a benchmark needs no real one."""
    toks = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n)]
    return {"version": "1.0",
            "added_tokens": [{"id": i, "content": toks[i], "special": True} for i in range(3)],
            "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks)}, "merges": []}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=cache_dir() / "test-glm" / "glm4moe-2.5b-hf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    st = args.out / "model.safetensors"
    if st.exists() and not args.force:
        print("already present:", args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    c = CONFIG
    (args.out / "config.json").write_text(json.dumps(c, indent=2))
    (args.out / "tokenizer.json").write_text(json.dumps(placeholder_tokenizer(c["vocab_size"])))
    (args.out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    ts = tensors(c)
    header, off = {}, 0
    for name, shape, _ in ts:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    n_params = off // 2
    active = n_params - (c["num_hidden_layers"] - c["first_k_dense_replace"]) * (
        c["n_routed_experts"] - c["num_experts_per_tok"]) * 3 * c["hidden_size"] * c["moe_intermediate_size"]
    print(f"{n_params / 1e9:.2f}B parameters, {active / 1e9:.2f}B active; writing {st} ({off / 2**30:.1f} GiB)",
          flush=True)
    rng = np.random.default_rng(args.seed)
    f, h = c["moe_intermediate_size"], c["hidden_size"]
    pool = {s: [bf16(rng.standard_normal(s, dtype=np.float32) * STD) for _ in range(POOL)] for s in [(f, h), (h, f)]}
    tmp = st.with_suffix(".part")
    with open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(hb)))
        out.write(hb)
        for i, (name, shape, kind) in enumerate(ts):
            if kind == "norm":
                out.write(bf16(np.ones(shape, dtype=np.float32)))
            elif kind == "bias":
                out.write(bf16(rng.standard_normal(shape, dtype=np.float32) * STD))
            elif kind == "expert":
                out.write(pool[shape][int(rng.integers(0, POOL))])
            else:
                out.write(bf16(rng.standard_normal(shape, dtype=np.float32) * STD))
            if i % 2000 == 0:
                print(f"  {i + 1}/{len(ts)} tensors", flush=True)
    tmp.rename(st)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
