#!/usr/bin/env python3
"""Greedy-decoding reference data from llama.cpp (via llama-cpp-python) for SmolLM2-135M.

For every case:
  * tokenize with llama.cpp's tokenizer (add_bos=False: the GGUF has
    tokenizer.ggml.add_bos_token = false; special=True only for chat prompts),
  * incremental greedy decoding: one llama_decode for the whole prompt (only the
    last position's logits requested), then one llama_decode per generated
    token; the next token is the argmax of that step's logits (ties -> lowest id),
    48 tokens, EOS is *ignored* (generation continues past <|im_end|>; the index
    of the first EOS-like token is recorded as "eos_index"),
  * top2[k] = [id1, logit1, id2, logit2] of the logits that produced output token k,
  * teacher forcing: a fresh context decodes prompt + output in ONE batch with
    logits for every position; top2_batch[k] is the same data at position
    prompt_len-1+k, to measure batch-vs-incremental drift inside llama.cpp.

Usage:  python3 scripts/refs/make_llamacpp_refs.py
Writes: tests/data/smollm2/llamacpp_refs.json
"""

import ctypes
import hashlib
import json
import os
import sys

import jinja2
import numpy as np
import llama_cpp
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
MODEL = os.path.expanduser("~/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(REPO, "tests", "data", "smollm2", "llamacpp_refs.json")

N_GEN = 48
N_CTX = 2048
N_THREADS = 2
SEED = 0

RAW_PROMPTS = [
    ("capital_france", "The capital of France is"),
    ("code_fibonacci", "def fibonacci(n):"),
    ("list_primes", "The first ten prime numbers are 2, 3, 5,"),
    ("story_opener", "Once upon a time, in a small village by the sea,"),
    ("factual_question", "Question: What is the boiling point of water at sea level?\nAnswer:"),
    ("non_ascii_french", "Le château de Versailles est situé à"),
    ("non_ascii_cjk_emoji", "日本の首都は東京です。🗼 Tokyo is"),
]

CHAT_MESSAGES = [
    ("chat_capital", "What is the capital of France?"),
    ("chat_haiku", "Write a haiku about the ocean."),
]

SYSTEM_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
EXPECTED_CHAT = ("<|im_start|>system\n" + SYSTEM_DEFAULT + "<|im_end|>\n"
                 "<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def new_llama(logits_all):
    return Llama(model_path=MODEL, n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                 seed=SEED, logits_all=logits_all, verbose=False)


def top2_of(row):
    order = np.lexsort((np.arange(len(row)), -row))[:2]
    return [int(order[0]), float(row[order[0]]), int(order[1]), float(row[order[1]])]


def r4(t):
    return [t[0], round(t[1], 4), t[2], round(t[3], 4)]


def last_logits(llm):
    n_vocab = llm.n_vocab()
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float64).copy()


def greedy_incremental(llm, prompt_ids):
    llm.reset()
    llm.eval(prompt_ids)             # one decode of the prompt, only the last logits requested
    out, top2, rows = [], [], []
    for _ in range(N_GEN):
        row = last_logits(llm)
        t = top2_of(row)
        out.append(t[0])
        top2.append(t)
        rows.append(row)
        llm.eval([t[0]])             # single-token decode step
    return out, top2, np.array(rows)


def teacher_forced_batch(llm_all, prompt_ids, out_ids):
    llm_all.reset()
    seq = prompt_ids + out_ids
    assert len(seq) <= llm_all.n_batch
    llm_all.eval(seq)                # one decode, logits for every position
    P = len(prompt_ids)
    rows = np.array(llm_all.scores[P - 1:P - 1 + len(out_ids), :], dtype=np.float64)
    return [top2_of(r) for r in rows], rows


def main():
    assert llama_cpp.__version__, "llama_cpp missing"
    llm = new_llama(False)
    llm_all = new_llama(True)
    add_bos = bool(llm._model.add_bos_token())
    assert llm.metadata.get("tokenizer.ggml.add_bos_token") == "false", llm.metadata.get(
        "tokenizer.ggml.add_bos_token")
    assert not add_bos
    eos = llm.token_eos()
    eos_like = {eos, 0}  # <|im_end|> (2, eos) and <|endoftext|> (0)

    tmpl = jinja2.Environment().from_string(llm.metadata["tokenizer.chat_template"])

    cases = []
    for name, text in RAW_PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        cases.append(dict(name=name, kind="raw", text=text, prompt_ids=ids))
    for name, msg in CHAT_MESSAGES:
        text = tmpl.render(messages=[{"role": "user", "content": msg}], add_generation_prompt=True)
        assert text == EXPECTED_CHAT.format(msg=msg), repr(text)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert ids[0] == 1 and ids.count(1) == 3, ids  # <|im_start|> parsed as a special token
        cases.append(dict(name=name, kind="chat", text=text, prompt_ids=ids))

    max_d_top1 = 0.0       # |batch - incremental| of the incremental top-1 logit
    max_d_all = 0.0        # |batch - incremental| over the whole vocab
    sq = []
    top1_mismatch = 0
    gaps = []
    for c in cases:
        out, top2, rows_inc = greedy_incremental(llm, c["prompt_ids"])
        top2_b, rows_b = teacher_forced_batch(llm_all, c["prompt_ids"], out)
        for k in range(N_GEN):
            d = abs(rows_b[k, out[k]] - rows_inc[k, out[k]])
            sq.append(d * d)
            max_d_top1 = max(max_d_top1, d)
            max_d_all = max(max_d_all, float(np.max(np.abs(rows_b[k] - rows_inc[k]))))
            if top2_b[k][0] != out[k]:
                top1_mismatch += 1
            gaps.append(top2[k][1] - top2[k][3])
        eos_index = next((i for i, t in enumerate(out) if t in eos_like), None)
        c["output_ids"] = out
        c["output_text"] = llm.detokenize(out, special=True).decode("utf-8", errors="replace")
        c["eos_index"] = eos_index
        c["top2"] = [r4(t) for t in top2]
        c["top2_batch"] = [r4(t) for t in top2_b]
        print(f"--- {c['name']} ({c['kind']}) prompt {len(c['prompt_ids'])} toks, eos_index={eos_index}")
        print(repr(c["text"]))
        print("  =>", repr(c["output_text"]))

    gaps = np.array(gaps)
    fr = next(c for c in cases if c["name"] == "capital_france")
    paris = llm.tokenize(b" Paris", add_bos=False, special=False)
    assert fr["output_ids"][:len(paris)] == paris, (fr["output_ids"][:4], paris)

    stats = {
        "n_steps": int(len(gaps)),
        "batch_vs_incremental": {
            "max_abs_top1_logit": round(max_d_top1, 4),
            "rms_top1_logit": round(float(np.sqrt(np.mean(sq))), 4),
            "max_abs_any_logit": round(max_d_all, 4),
            "batch_top1_differs_from_greedy": top1_mismatch,
        },
        "top2_gap": {
            "lt_0.05": int(np.sum(gaps < 0.05)),
            "lt_0.25": int(np.sum(gaps < 0.25)),
            "ge_1.0": int(np.sum(gaps >= 1.0)),
            "min": round(float(gaps.min()), 4),
        },
    }
    doc = {
        "generator": "python3 scripts/refs/make_llamacpp_refs.py  (llama-cpp-python %s; "
                     "Llama(n_ctx=%d, n_threads=%d, n_threads_batch=%d, seed=%d, n_batch=512, "
                     "flash_attn=False), CPU)" % (llama_cpp.__version__, N_CTX, N_THREADS,
                                                   N_THREADS, SEED),
        "llama_cpp_version": llama_cpp.__version__,
        "model": os.path.basename(MODEL),
        "model_sha256": sha256_file(MODEL),
        "add_bos": add_bos,
        "eos_handling": "ignored: always %d greedy tokens; eos_index = first output index whose id "
                        "is 2 <|im_end|> (eos) or 0 <|endoftext|>, null if none" % N_GEN,
        "greedy": "argmax of each decode step's logits (ties -> lowest id); prompt decoded in one "
                  "batch, then one llama_decode per token",
        "layout": "top2[k] = [id1, logit1, id2, logit2] of the logits that produced output_ids[k] "
                  "(incremental); top2_batch[k] = same from one teacher-forced decode of "
                  "prompt_ids+output_ids at position len(prompt_ids)-1+k",
        "stats": stats,
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(json.dumps(stats, indent=1))
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
