#!/usr/bin/env python3
"""Writes tests/fixtures/quants/gguf_py_dequant.bin: blocks of every K- and
I-quant type shardlm reads, with gguf-py's dequantization of them, for the
bit-exact test in crates/kernels/tests/gguf_py_dequant.rs.

    python3 scripts/make_quant_fixture.py [FILE.gguf ...]

Blocks: random codes with valid f16 scales (ordinary, tiny, negative and zero),
seeded, so the file is reproducible; plus, for every GGUF file given, the first
blocks of its first tensor of each of these types (real llama-quantize output).

Format (little-endian): repeated records `u32 ggml_type, u32 n_blocks,
u32 n_bytes, bytes, n_values·f32` (n_values = n_blocks · block size).
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants

TYPES = [T.Q2_K, T.Q3_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.IQ4_NL, T.IQ4_XS]
RANDOM_BLOCKS = 3
REAL_BLOCKS = 2
# Byte offsets of each type's f16 scales inside a block.
F16_AT = {T.Q2_K: [80, 82], T.Q3_K: [108]}


def scale(rng: np.random.Generator) -> int:
    r = rng.integers(0, 10)
    v = 0.0 if r == 0 else -rng.uniform(1e-3, 0.05) if r == 1 else rng.uniform(1e-5, 1e-3) if r == 2 else rng.uniform(1e-3, 0.05)
    return int(np.array(v, dtype=np.float16).view(np.uint16))


def random_blocks(rng: np.random.Generator, t: T, n: int) -> bytes:
    from gguf.constants import GGML_QUANT_SIZES

    _, size = GGML_QUANT_SIZES[t]
    out = bytearray()
    for _ in range(n):
        b = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        if t == T.IQ1_M:
            bits = scale(rng)
            for i in range(4):
                b[49 + 2 * i] = (b[49 + 2 * i] & 0x0F) | (((bits >> (4 * i)) & 15) << 4)
        else:
            for o in F16_AT.get(t, [0]):
                b[o : o + 2] = struct.pack("<H", scale(rng))
        out += b
    return bytes(out)


def real_blocks(paths: list[str]) -> dict:
    from gguf.constants import GGML_QUANT_SIZES

    found = {}
    for p in paths:
        for tensor in GGUFReader(p).tensors:
            t = T(tensor.tensor_type)
            if t in TYPES and t not in found:
                _, size = GGML_QUANT_SIZES[t]
                found[t] = bytes(np.asarray(tensor.data).reshape(-1).view(np.uint8)[: REAL_BLOCKS * size])
    return found


def main() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    rng = np.random.default_rng(23)
    real = real_blocks(sys.argv[1:])
    out = bytearray()
    for t in TYPES:
        block, size = GGML_QUANT_SIZES[t]
        for data in [random_blocks(rng, t, RANDOM_BLOCKS)] + ([real[t]] if t in real else []):
            vals = quants.dequantize(np.frombuffer(data, dtype=np.uint8), t).astype(np.float32).reshape(-1)
            n = len(data) // size
            assert vals.size == n * block
            out += struct.pack("<III", int(t), n, len(data)) + data + vals.astype("<f4").tobytes()
    dst = Path(__file__).resolve().parent.parent / "tests/fixtures/quants/gguf_py_dequant.bin"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(out)
    print(f"wrote {dst} ({len(out)} bytes; real blocks for {sorted(x.name for x in real)})")


if __name__ == "__main__":
    main()
