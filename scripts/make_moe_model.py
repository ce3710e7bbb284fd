#!/usr/bin/env python3
"""Writes a random-weight mixture-of-experts model of realistic shape as a
qwen3moe GGUF, in Q4_0, Q8_0 and MXFP4, for benchmarking shardlm against
llama.cpp on the same file (NVFP4: gguf-py cannot quantize to it, so
`scripts/bench-moe.sh` makes that one with `shardlm quantize` from the Q8_0 file).

Shape (a scaled-down Qwen3-30B-A3B): 24 layers, hidden 1024, 16 query heads and
4 KV heads of 64, 64 experts of width 512, top-8 routing (renormalized, as
qwen3moe does), vocabulary 49152 (SmolLM2's tokenizer, copied so llama.cpp
accepts the file), context 32768. That is about 2.6B parameters in all and 0.4B
active per token.

Every expert matrix is drawn from N(0, 0.02). To keep generation to seconds,
each projection has a pool of 32 random matrices, quantized once, and every
expert of every layer is a copy of a randomly chosen one: the file still holds
64 distinct byte ranges per projection and layer, so a decode step reads as
many bytes as a real model's. Routers (F32), attention and the embedding/output
are drawn per tensor; norms are ones.

Usage: scripts/make_moe_model.py [--out DIR] [--tokenizer-from GGUF] [--seed N] [--force]
Default output: $SHARDLM_CACHE/test-moe/qwen3moe-2.6b-{q4_0,q8_0,mxfp4}.gguf
Needs `numpy` and `gguf`.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_model import cache_dir, copy_tokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType
SHAPE = dict(
    n_layers=24,
    hidden=1024,
    n_heads=16,
    n_kv_heads=4,
    head_dim=64,
    n_experts=64,
    top_k=8,
    expert_ffn=512,
    rope_theta=1e6,
    rms_eps=1e-6,
    ctx=32768,
)
STD = 0.02
POOL = 32
# (file suffix, tensor type, general.file_type: MOSTLY_Q4_0 = 2, Q8_0 = 7, MXFP4_MOE = 38)
VARIANTS = [("q4_0", Q.Q4_0, 2), ("q8_0", Q.Q8_0, 7), ("mxfp4", Q.MXFP4, 38)]


def tensor_list(s: dict, vocab: int):
    """(name, numpy shape, kind) in file order; kind: norm, router, dense or experts."""
    h, hd = s["hidden"], s["head_dim"]
    q, kv = s["n_heads"] * hd, s["n_kv_heads"] * hd
    e, f = s["n_experts"], s["expert_ffn"]
    out = [("token_embd.weight", (vocab, h), "dense")]
    for i in range(s["n_layers"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (h,), "norm"),
            (b + "attn_q.weight", (q, h), "dense"),
            (b + "attn_k.weight", (kv, h), "dense"),
            (b + "attn_v.weight", (kv, h), "dense"),
            (b + "attn_output.weight", (h, q), "dense"),
            (b + "attn_q_norm.weight", (hd,), "norm"),
            (b + "attn_k_norm.weight", (hd,), "norm"),
            (b + "ffn_norm.weight", (h,), "norm"),
            (b + "ffn_gate_inp.weight", (e, h), "router"),
            (b + "ffn_gate_exps.weight", (e, f, h), "experts"),
            (b + "ffn_up_exps.weight", (e, f, h), "experts"),
            (b + "ffn_down_exps.weight", (e, h, f), "experts"),
        ]
    out += [("output_norm.weight", (h,), "norm"), ("output.weight", (vocab, h), "dense")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=cache_dir() / "test-moe")
    ap.add_argument(
        "--tokenizer-from",
        type=Path,
        default=cache_dir() / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf",
        help="GGUF whose tokenizer.* metadata is copied (default: the cached SmolLM2)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rewrite files that already exist")
    args = ap.parse_args()

    paths = [args.out / f"qwen3moe-2.6b-{suffix}.gguf" for suffix, _, _ in VARIANTS]
    if not args.force and all(p.exists() for p in paths):
        print("already present:", *map(str, paths))
        return
    if not args.tokenizer_from.exists():
        sys.exit(f"{args.tokenizer_from} not found (run `shardlm run --prompt-ids 1` once to fetch SmolLM2)")
    args.out.mkdir(parents=True, exist_ok=True)
    s = SHAPE
    src = gguf.GGUFReader(args.tokenizer_from)
    tmp = [p.with_suffix(".gguf.part") for p in paths]
    writers = [gguf.GGUFWriter(t, "qwen3moe") for t in tmp]
    vocab = copy_tokenizer(src, writers)
    tensors = tensor_list(s, vocab)
    n_params = sum(int(np.prod(shape)) for _, shape, _ in tensors)
    per_expert = 3 * s["hidden"] * s["expert_ffn"]
    n_active = n_params - s["n_layers"] * (s["n_experts"] - s["top_k"]) * per_expert

    for w, (suffix, qtype, ftype) in zip(writers, VARIANTS):
        w.add_name(f"shardlm random qwen3moe 2.6B-A0.4B {suffix}")
        w.add_context_length(s["ctx"])
        w.add_embedding_length(s["hidden"])
        w.add_block_count(s["n_layers"])
        w.add_feed_forward_length(s["expert_ffn"] * s["top_k"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
        w.add_expert_count(s["n_experts"])
        w.add_expert_used_count(s["top_k"])
        w.add_head_count(s["n_heads"])
        w.add_head_count_kv(s["n_kv_heads"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_freq_base(s["rope_theta"])
        w.add_layer_norm_rms_eps(s["rms_eps"])
        w.add_vocab_size(vocab)
        w.add_file_type(ftype)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, shape, kind in tensors:
            if kind in ("norm", "router"):
                w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            else:
                byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
                w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()

    print(
        f"{n_params / 1e9:.2f}B parameters, {n_active / 1e9:.2f}B active, vocab {vocab}; writing",
        *map(str, paths),
        flush=True,
    )
    rng = np.random.default_rng(args.seed)
    f, h = s["expert_ffn"], s["hidden"]
    # pools[shape][variant] = list of quantized matrices
    pools = {}
    for shape in [(f, h), (h, f)]:
        mats = [rng.standard_normal(shape, dtype=np.float32) * STD for _ in range(POOL)]
        pools[shape] = [[gguf.quants.quantize(m, qt) for m in mats] for _, qt, _ in VARIANTS]
    t0 = time.time()
    for i, (name, shape, kind) in enumerate(tensors):
        if kind == "norm":
            data = np.ones(shape, dtype=np.float32)
            for w in writers:
                w.write_tensor_data(data)
        elif kind == "router":
            data = rng.standard_normal(shape, dtype=np.float32) * STD
            for w in writers:
                w.write_tensor_data(data)
        elif kind == "experts":
            picks = rng.integers(0, POOL, size=shape[0])
            for v, w in enumerate(writers):
                w.write_tensor_data(np.stack([pools[shape[1:]][v][p] for p in picks]))
        else:
            data = rng.standard_normal(shape, dtype=np.float32) * STD
            for w, (_, qtype, _) in zip(writers, VARIANTS):
                w.write_tensor_data(gguf.quants.quantize(data, qtype))
        if i % 48 == 0:
            print(f"  {i + 1}/{len(tensors)} tensors, {time.time() - t0:.0f} s", flush=True)
    for w in writers:
        w.close()
    for t, p in zip(tmp, paths):
        t.rename(p)
        print(f"wrote {p} ({p.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
