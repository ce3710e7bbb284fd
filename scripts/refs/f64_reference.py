#!/usr/bin/env python3
"""Independent float64 reference forward pass for SmolLM2-135M (GGUF, llama arch).

The weights are read with ``gguf.GGUFReader`` and dequantized with
``gguf.quants.dequantize`` (Q4_1 / Q8_0 -> f32), then promoted to float64.  All
activations are kept in float64: no activation quantization, unlike llama.cpp's
CPU matmuls, which quantize the activations to 8 bits (Q8_0/Q8_1) before the
dot product.  Differences of a few tenths of a logit against llama.cpp are
therefore expected.

Architecture (read from the GGUF metadata, checked below):
  * token embedding (Q8_0), tied as the output projection (no output.weight)
  * 30 blocks: RMSNorm(eps 1e-5) -> GQA attention (9 q heads, 3 kv heads,
    head_dim 64, rope theta 1e5) -> residual; RMSNorm -> SiLU-gated MLP -> residual
  * final RMSNorm, logits = embedding @ h

RoPE: llama.cpp's HF->GGUF converter permutes the rows of attn_q / attn_k for the
llama architecture, so with GGUF weights the rotation is applied to *adjacent*
pairs (x[2i], x[2i+1]) with angle pos * theta^(-2i/64) (ggml "normal" rope
mode), not to the HF "rotate_half" halves.

Usage:
  python3 scripts/refs/f64_reference.py                      # reads llamacpp_refs.json, writes f64_refs.json
  python3 scripts/refs/f64_reference.py --ids 504 3575 282   # debug: print top-5 after these ids
"""

import argparse
import base64
import hashlib
import json
import math
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
DATA_DIR = os.path.join(REPO, "tests", "data", "smollm2")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def field(reader, key):
    return reader.fields[key].contents()


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        assert field(r, "general.architecture") == "llama"
        self.n_layer = int(field(r, "llama.block_count"))
        self.n_embd = int(field(r, "llama.embedding_length"))
        self.n_ff = int(field(r, "llama.feed_forward_length"))
        self.n_head = int(field(r, "llama.attention.head_count"))
        self.n_head_kv = int(field(r, "llama.attention.head_count_kv"))
        self.rope_base = float(field(r, "llama.rope.freq_base"))
        # The GGUF stores eps as f32 (9.9999997e-06); llama.cpp uses that f32 value.
        self.eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
        self.head_dim = self.n_embd // self.n_head
        assert int(field(r, "llama.rope.dimension_count")) == self.head_dim
        self.tokens = field(r, "tokenizer.ggml.tokens")

        t = {tt.name: tt for tt in r.tensors}

        def W(name):
            tt = t[name]
            # dequantize returns numpy shape (rows = ne[1], cols = ne[0]), i.e. (out, in)
            return dequantize(tt.data, tt.tensor_type).astype(np.float64)

        assert "output.weight" not in t, "expected tied embeddings"
        self.tok_embd = W("token_embd.weight")          # (vocab, n_embd)
        self.vocab = self.tok_embd.shape[0]
        self.output_norm = W("output_norm.weight")
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = dict(
                attn_norm=W(p + "attn_norm.weight"),
                wq=W(p + "attn_q.weight"),
                wk=W(p + "attn_k.weight"),
                wv=W(p + "attn_v.weight"),
                wo=W(p + "attn_output.weight"),
                ffn_norm=W(p + "ffn_norm.weight"),
                gate=W(p + "ffn_gate.weight"),
                up=W(p + "ffn_up.weight"),
                down=W(p + "ffn_down.weight"),
            )
            assert L["wq"].shape == (self.n_embd, self.n_embd)
            assert L["wk"].shape == (self.n_head_kv * self.head_dim, self.n_embd)
            assert L["down"].shape == (self.n_embd, self.n_ff)
            self.layers.append(L)

    def rmsnorm(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.eps) * w

    def rope(self, x, pos):
        # x: (T, H, D); interleaved pairs (2i, 2i+1)
        D = self.head_dim
        i = np.arange(D // 2, dtype=np.float64)
        inv = self.rope_base ** (-2.0 * i / D)               # (D/2,)
        ang = pos[:, None].astype(np.float64) * inv[None, :]  # (T, D/2)
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        x0 = x[..., 0::2]
        x1 = x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, ids):
        """Teacher-forced forward over the whole sequence; returns (T, vocab) f64 logits."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        H, KV, D = self.n_head, self.n_head_kv, self.head_dim
        group = H // KV
        pos = np.arange(T)
        x = self.tok_embd[ids].copy()                      # (T, E)
        mask = np.triu(np.full((T, T), -np.inf), k=1)
        scale = 1.0 / math.sqrt(D)
        for L in self.layers:
            h = self.rmsnorm(x, L["attn_norm"])
            q = (h @ L["wq"].T).reshape(T, H, D)
            k = (h @ L["wk"].T).reshape(T, KV, D)
            v = (h @ L["wv"].T).reshape(T, KV, D)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            att_out = np.empty((T, H, D))
            for hh in range(H):
                kvh = hh // group
                sc = (q[:, hh, :] @ k[:, kvh, :].T) * scale + mask   # (T, T)
                sc = sc - sc.max(axis=-1, keepdims=True)
                p = np.exp(sc)
                p /= p.sum(axis=-1, keepdims=True)
                att_out[:, hh, :] = p @ v[:, kvh, :]
            x = x + att_out.reshape(T, H * D) @ L["wo"].T
            h = self.rmsnorm(x, L["ffn_norm"])
            g = h @ L["gate"].T
            u = h @ L["up"].T
            a = g / (1.0 + np.exp(-g)) * u
            x = x + a @ L["down"].T
        x = self.rmsnorm(x, self.output_norm)
        return x @ self.tok_embd.T


def topk(row, k):
    # stable: sort by (-logit, id)
    idx = np.lexsort((np.arange(len(row)), -row))[:k]
    return idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--llamacpp-refs", default=os.path.join(DATA_DIR, "llamacpp_refs.json"))
    ap.add_argument("--out", default=os.path.join(DATA_DIR, "f64_refs.json"))
    ap.add_argument("--ids", type=int, nargs="*", help="debug: print top-5 after these ids and exit")
    args = ap.parse_args()

    m = Model(args.model)
    if args.ids:
        lg = m.forward(args.ids)[-1]
        for i in topk(lg, 5):
            print(i, repr(m.tokens[i]), round(float(lg[i]), 4))
        return

    with open(args.llamacpp_refs) as f:
        ref = json.load(f)
    msha = sha256_file(args.model)
    assert msha == ref["model_sha256"], "llamacpp_refs.json was made with a different model file"

    out_cases = []
    all_d = []           # f64 top-1 logit  -  llama.cpp (incremental) top-1 logit
    all_d_batch = []     # same vs llama.cpp teacher-forced batch
    all_d_same = []      # f64 logit of llama.cpp's chosen token - llama.cpp top-1 logit
    agree = total = 0
    summary = []
    for ci, case in enumerate(ref["cases"]):
        P = case["prompt_ids"]
        O = case["output_ids"]
        seq = P + O
        logits = m.forward(seq)
        steps = []
        n_agree = 0
        d_case = []
        for k in range(len(O) + 1):
            row = logits[len(P) - 1 + k]
            top = topk(row, 5)
            steps.append([[int(i), round(float(row[i]), 4)] for i in top])
            if k < len(O):
                total += 1
                if int(top[0]) == O[k]:
                    agree += 1
                    n_agree += 1
                lc_id, lc_logit = case["top2"][k][0], case["top2"][k][1]
                d = float(row[top[0]]) - lc_logit
                all_d.append(d)
                d_case.append(d)
                all_d_same.append(float(row[lc_id]) - lc_logit)
                if "top2_batch" in case:
                    all_d_batch.append(float(row[top[0]]) - case["top2_batch"][k][1])
        oc = {
            "name": case["name"],
            "kind": case["kind"],
            "prompt_len": len(P),
            "ids": seq,
            "top1_agrees_with_llamacpp": n_agree,
            "steps": steps,
        }
        if ci < 2:
            last = logits[len(P) - 1].astype("<f4")
            oc["last_logits_b64"] = base64.b64encode(last.tobytes()).decode("ascii")
        out_cases.append(oc)
        d_case = np.array(d_case)
        summary.append((case["name"], n_agree, len(O), float(np.sqrt(np.mean(d_case ** 2))),
                        float(np.max(np.abs(d_case)))))

    d = np.array(all_d)
    ds = np.array(all_d_same)
    stats = {
        "top1_agreement": f"{agree}/{total}",
        "top1_logit_vs_llamacpp_incremental": {
            "rms": round(float(np.sqrt(np.mean(d ** 2))), 4),
            "max_abs": round(float(np.max(np.abs(d))), 4),
            "mean": round(float(np.mean(d)), 4),
        },
        "llamacpp_token_logit_vs_llamacpp_incremental": {
            "rms": round(float(np.sqrt(np.mean(ds ** 2))), 4),
            "max_abs": round(float(np.max(np.abs(ds))), 4),
        },
    }
    if all_d_batch:
        db = np.array(all_d_batch)
        stats["top1_logit_vs_llamacpp_batch"] = {
            "rms": round(float(np.sqrt(np.mean(db ** 2))), 4),
            "max_abs": round(float(np.max(np.abs(db))), 4),
        }
    out = {
        "generator": "python3 scripts/refs/f64_reference.py (numpy %s, gguf-py %s; float64 forward "
                     "on gguf.quants.dequantize'd weights, interleaved-pair rope)" % (
                         np.__version__, getattr(gguf, "__version__", "0.19.0")),
        "model_sha256": msha,
        "source": "tests/data/smollm2/llamacpp_refs.json (prompt_ids + output_ids, teacher forced)",
        "layout": "steps[k] = top-5 [id, logit] at position prompt_len-1+k of ids; steps[k] "
                  "predicts output token k for k < len(output); the last entry is the position "
                  "after the final output token. last_logits_b64 = all vocab logits at position "
                  "prompt_len-1 as little-endian f32, base64.",
        "stats": stats,
        "cases": out_cases,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    for name, a, n, rms, mx in summary:
        print(f"{name:24s} top1 agree {a}/{n}  top1-logit drift rms {rms:.4f} max {mx:.4f}")
    print(json.dumps(stats, indent=1))
    print("wrote", args.out, os.path.getsize(args.out), "bytes")


if __name__ == "__main__":
    main()
