#!/usr/bin/env python3
"""Writes a ~1.1B-parameter random-weight llama-shaped test model as GGUF, once with
Q4_0 and once with Q8_0 weights, for benchmarking shardlm against llama.cpp on the
same file.

Shape: TinyLlama-1.1B (22 layers, hidden 2048, FFN 5632, 32 heads, 4 KV heads,
head_dim 64, rope theta 10000, RMS eps 1e-5, context 4096) with a separate
output.weight. The tokenizer metadata (vocab 49152) is copied from the SmolLM2 GGUF
so llama.cpp accepts the file. Norm weights are F32 ones; every matrix is drawn
from N(0, 0.02) once and written to both files, so the two differ only in the
quantization.

Usage: scripts/make_test_model.py [--out DIR] [--tokenizer-from GGUF] [--seed N]
Default output: $SHARDLM_CACHE/test-1b/llama-1b-{q4_0,q8_0}.gguf
(SHARDLM_CACHE defaults to ~/.cache/shardlm). Needs the `gguf` and `numpy` packages.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import gguf

Q = gguf.GGMLQuantizationType

SHAPE = dict(
    n_layers=22,
    hidden=2048,
    ffn=5632,
    n_heads=32,
    n_kv_heads=4,
    head_dim=64,
    rope_theta=10000.0,
    rms_eps=1e-5,
    ctx=4096,
)
STD = 0.02
# (file suffix, tensor type, general.file_type: LLAMA_FTYPE_MOSTLY_Q4_0 = 2, _Q8_0 = 7)
VARIANTS = [("q4_0", Q.Q4_0, 2), ("q8_0", Q.Q8_0, 7)]


def cache_dir() -> Path:
    env = os.environ.get("SHARDLM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "shardlm"


def tensor_list(s: dict, vocab: int):
    """(name, numpy shape (rows, cols) or (n,), is_norm) in file order."""
    h, f, kv = s["hidden"], s["ffn"], s["n_kv_heads"] * s["head_dim"]
    q = s["n_heads"] * s["head_dim"]
    out = [("token_embd.weight", (vocab, h), False)]
    for i in range(s["n_layers"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (h,), True),
            (b + "attn_q.weight", (q, h), False),
            (b + "attn_k.weight", (kv, h), False),
            (b + "attn_v.weight", (kv, h), False),
            (b + "attn_output.weight", (h, q), False),
            (b + "ffn_norm.weight", (h,), True),
            (b + "ffn_gate.weight", (f, h), False),
            (b + "ffn_up.weight", (f, h), False),
            (b + "ffn_down.weight", (h, f), False),
        ]
    out += [("output_norm.weight", (h,), True), ("output.weight", (vocab, h), False)]
    return out


def copy_tokenizer(src: gguf.GGUFReader, writers) -> int:
    """Copies every tokenizer.* key; returns the vocabulary size."""
    vocab = None
    for key, field in src.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
        for w in writers:
            w.add_key_value(key, value, vtype, sub_type=sub)
    if vocab is None:
        sys.exit("the tokenizer source has no tokenizer.ggml.tokens")
    return vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=cache_dir() / "test-1b")
    ap.add_argument(
        "--tokenizer-from",
        type=Path,
        default=cache_dir() / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf",
        help="GGUF whose tokenizer.* metadata is copied (default: the cached SmolLM2)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rewrite files that already exist")
    args = ap.parse_args()

    paths = [args.out / f"llama-1b-{suffix}.gguf" for suffix, _, _ in VARIANTS]
    if not args.force and all(p.exists() for p in paths):
        print("already present:", *map(str, paths))
        return
    if not args.tokenizer_from.exists():
        sys.exit(f"{args.tokenizer_from} not found (run `shardlm run --prompt-ids 1` once to fetch SmolLM2)")
    args.out.mkdir(parents=True, exist_ok=True)
    s = SHAPE
    src = gguf.GGUFReader(args.tokenizer_from)
    tmp = [p.with_suffix(".gguf.part") for p in paths]
    writers = [gguf.GGUFWriter(t, "llama") for t in tmp]
    vocab = copy_tokenizer(src, writers)
    tensors = tensor_list(s, vocab)
    n_params = sum(int(np.prod(shape)) for _, shape, _ in tensors)

    for w, (suffix, qtype, ftype) in zip(writers, VARIANTS):
        w.add_name(f"shardlm random llama 1.1B {suffix}")
        w.add_context_length(s["ctx"])
        w.add_embedding_length(s["hidden"])
        w.add_block_count(s["n_layers"])
        w.add_feed_forward_length(s["ffn"])
        w.add_head_count(s["n_heads"])
        w.add_head_count_kv(s["n_kv_heads"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_dimension_count(s["head_dim"])
        w.add_rope_freq_base(s["rope_theta"])
        w.add_layer_norm_rms_eps(s["rms_eps"])
        w.add_vocab_size(vocab)
        w.add_file_type(ftype)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, shape, is_norm in tensors:
            if is_norm:
                w.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
            else:
                byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
                w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()

    print(f"{n_params / 1e9:.3f}B parameters, vocab {vocab}; writing", *map(str, paths), flush=True)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    for i, (name, shape, is_norm) in enumerate(tensors):
        if is_norm:
            data = np.ones(shape, dtype=np.float32)
            for w in writers:
                w.write_tensor_data(data)
            continue
        data = rng.standard_normal(shape, dtype=np.float32)
        data *= STD
        for w, (_, qtype, _) in zip(writers, VARIANTS):
            w.write_tensor_data(gguf.quants.quantize(data, qtype))
        if i % 27 == 0:
            print(f"  {i + 1}/{len(tensors)} tensors, {time.time() - t0:.0f} s", flush=True)
    for w in writers:
        w.close()
    for t, p in zip(tmp, paths):
        t.rename(p)
        print(f"wrote {p} ({p.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
