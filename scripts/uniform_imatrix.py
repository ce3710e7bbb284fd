#!/usr/bin/env python3
"""Writes a uniform importance matrix for a GGUF model, in llama.cpp's legacy
.dat format: per 2-D weight, its input width (ne0) ones and ncall 1 (a stacked
expert tensor: ne0 ones per expert). That is
what "no importance" means to llama-quantize, which b11434 refuses to write
IQ3_XXS, IQ2_* and IQ1_* without (speed and interop tests need the files, not
a tuned quantization).

Usage: scripts/uniform_imatrix.py MODEL.gguf OUT.imatrix  (needs `pip install gguf`)
"""
import struct
import sys

from gguf import GGUFReader


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    # A stacked expert tensor (ne0, ne1, n_expert) takes ne0 values per expert.
    ents = [
        (t.name, int(t.shape[0]) * (int(t.shape[2]) if len(t.shape) >= 3 else 1))
        for t in GGUFReader(src).tensors
        if len(t.shape) >= 2
    ]
    with open(out, "wb") as f:
        f.write(struct.pack("<i", len(ents)))
        for name, n in ents:
            f.write(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, n))
            f.write(struct.pack(f"<{n}f", *([1.0] * n)))


if __name__ == "__main__":
    main()
