#!/usr/bin/env python3
"""Writes a random-weight llama-architecture GGUF with a 131072-token context and
llama3 rope scaling, as Llama 3.2 has (rope theta 500000, factor 32, low/high
frequency factors 1 and 4, original context 8192), for long-context benchmarks of
shardlm and llama.cpp on the same file.

Shapes (--shape):
  smollm2  SmolLM2-135M: hidden 576, 30 layers, 9 heads, 3 KV heads, FFN 1536,
           vocab 49152, tied embeddings (the default)
  1b       Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192,
           vocab 128256, tied embeddings
  tiny     2 layers, hidden 64, 2 heads, 1 KV head, FFN 128: a few-MiB file for
           tests of the long-context code paths, not for speed
  kv       2 layers, hidden 256, 4 heads, 4 KV heads (no sharing), FFN 512: the
           KV cache dominates memory at long context (0.125 GiB at 65536 in
           f16, against ~50 MiB of everything else) at a minute of prefill

The llama3 scaling is written the way llama.cpp's convert_hf_to_gguf.py writes it
for Llama 3.x: as a `rope_freqs.weight` tensor of per-frequency divisors, with no
rope.scaling.type key (llama.cpp has no "llama3" scaling type; it divides each
inverse frequency by that tensor). The tokenizer metadata is copied from the
SmolLM2 GGUF; a larger --vocab pads it with unused `<pad_N>` tokens so both
engines accept the file (random weights do not care which tokenizer it is).

Weights: N(0, 0.02) matrices in --type (q8_0 default, or q4_0 or f16), F32 ones
for the norms. The tiny shape takes a second, smollm2 about 20 s, 1b a few
minutes on two cores.

Usage: scripts/make_longctx_model.py [--shape smollm2|1b|tiny|kv] [--type q8_0|q4_0|f16]
       [--vocab N] [--out FILE] [--tokenizer-from GGUF] [--seed N] [--force]
Default output: $SHARDLM_CACHE/longctx/longctx-<shape>-<type>.gguf
(SHARDLM_CACHE defaults to ~/.cache/shardlm). Needs the `gguf` and `numpy` packages.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_model import cache_dir, copy_tokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType

SHAPES = {
    "smollm2": dict(n_layers=30, hidden=576, ffn=1536, n_heads=9, n_kv_heads=3, head_dim=64, vocab=49152),
    "1b": dict(n_layers=16, hidden=2048, ffn=8192, n_heads=32, n_kv_heads=8, head_dim=64, vocab=128256),
    "tiny": dict(n_layers=2, hidden=64, ffn=128, n_heads=2, n_kv_heads=1, head_dim=32, vocab=49152),
    "kv": dict(n_layers=2, hidden=256, ffn=512, n_heads=4, n_kv_heads=4, head_dim=64, vocab=49152),
}
CTX = 131072
ROPE_THETA = 500000.0
# Llama 3.2's rope_scaling block.
LLAMA3 = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
RMS_EPS = 1e-5
STD = 0.02
# --type -> (tensor type, general.file_type: LLAMA_FTYPE_MOSTLY_F16 = 1, Q4_0 = 2, Q8_0 = 7)
TYPES = {"f16": (Q.F16, 1), "q4_0": (Q.Q4_0, 2), "q8_0": (Q.Q8_0, 7)}


def llama3_rope_factors(head_dim: int) -> np.ndarray:
    """The divisors convert_hf_to_gguf.py stores as rope_freqs.weight for llama3 scaling."""
    freqs = 1.0 / (ROPE_THETA ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old = LLAMA3["original_max_position_embeddings"]
    lo, hi, factor = LLAMA3["low_freq_factor"], LLAMA3["high_freq_factor"], LLAMA3["factor"]
    low_wavelen, high_wavelen = old / lo, old / hi
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensor_list(s: dict):
    """(name, numpy shape, kind) in file order; kind is 'norm', 'rope' or 'matrix'.
    The embedding is tied (no output.weight), as in both reference models."""
    h, f = s["hidden"], s["ffn"]
    q, kv = s["n_heads"] * s["head_dim"], s["n_kv_heads"] * s["head_dim"]
    out = [("rope_freqs.weight", (s["head_dim"] // 2,), "rope"), ("token_embd.weight", (s["vocab"], h), "matrix")]
    for i in range(s["n_layers"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (h,), "norm"),
            (b + "attn_q.weight", (q, h), "matrix"),
            (b + "attn_k.weight", (kv, h), "matrix"),
            (b + "attn_v.weight", (kv, h), "matrix"),
            (b + "attn_output.weight", (h, q), "matrix"),
            (b + "ffn_norm.weight", (h,), "norm"),
            (b + "ffn_gate.weight", (f, h), "matrix"),
            (b + "ffn_up.weight", (f, h), "matrix"),
            (b + "ffn_down.weight", (h, f), "matrix"),
        ]
    out.append(("output_norm.weight", (h,), "norm"))
    return out


def pad_tokenizer(w: gguf.GGUFWriter, src: gguf.GGUFReader, vocab: int) -> None:
    """Copies the tokenizer, with unused `<pad_N>` tokens appended up to `vocab`."""
    have = len(src.fields["tokenizer.ggml.tokens"].contents())
    for key, field in src.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        if key == "tokenizer.ggml.tokens":
            value = value + [f"<pad_{i}>" for i in range(have, vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.UNUSED)] * (vocab - have)
        elif key == "tokenizer.ggml.scores":
            value = value + [0.0] * (vocab - have)
        w.add_key_value(key, value, vtype, sub_type=sub)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--type", choices=sorted(TYPES), default="q8_0")
    ap.add_argument("--vocab", type=int, help="vocabulary size (default: the shape's)")
    ap.add_argument("--out", type=Path, help="output file")
    ap.add_argument(
        "--tokenizer-from",
        type=Path,
        default=cache_dir() / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf",
        help="GGUF whose tokenizer.* metadata is copied (default: the cached SmolLM2)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rewrite a file that already exists")
    args = ap.parse_args()

    s = dict(SHAPES[args.shape])
    if args.vocab:
        s["vocab"] = args.vocab
    qtype, ftype = TYPES[args.type]
    path = args.out or cache_dir() / "longctx" / f"longctx-{args.shape}-{args.type}.gguf"
    if path.exists() and not args.force:
        print("already present:", path)
        return
    if not args.tokenizer_from.exists():
        sys.exit(f"{args.tokenizer_from} not found (run `shardlm run --prompt-ids 1` once to fetch SmolLM2)")
    src = gguf.GGUFReader(args.tokenizer_from)
    src_vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    if s["vocab"] < src_vocab:
        sys.exit(f"--vocab {s['vocab']} is smaller than the tokenizer's {src_vocab} tokens")
    # Quantized rows are whole blocks of 32.
    if args.type != "f16" and any(d % 32 for d in (s["hidden"], s["ffn"], s["n_heads"] * s["head_dim"])):
        sys.exit("every matrix row length must be a multiple of 32 for quantized types")

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.part")
    w = gguf.GGUFWriter(tmp, "llama")
    if s["vocab"] == src_vocab:
        copy_tokenizer(src, [w])
    else:
        pad_tokenizer(w, src, s["vocab"])
    tensors = tensor_list(s)
    n_params = sum(int(np.prod(shape)) for _, shape, kind in tensors if kind == "matrix")

    w.add_name(f"shardlm random llama long-context {args.shape} {args.type}")
    w.add_context_length(CTX)
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["n_layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(s["vocab"])
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, shape, kind in tensors:
        if kind != "matrix":
            w.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
        else:
            byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    print(f"{n_params / 1e6:.1f}M parameters, vocab {s['vocab']}, {args.type}; writing {path}", flush=True)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    for i, (name, shape, kind) in enumerate(tensors):
        if kind == "rope":
            w.write_tensor_data(llama3_rope_factors(s["head_dim"]))
        elif kind == "norm":
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
        else:
            data = rng.standard_normal(shape, dtype=np.float32)
            data *= STD
            w.write_tensor_data(gguf.quants.quantize(data, qtype))
        if i % 45 == 0:
            print(f"  {i + 1}/{len(tensors)} tensors, {time.time() - t0:.0f} s", flush=True)
    w.close()
    tmp.rename(path)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
