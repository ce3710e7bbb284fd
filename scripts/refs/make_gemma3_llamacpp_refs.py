#!/usr/bin/env python3
"""llama.cpp b11434 reference data for Gemma 3 270M Q4_K_M (the `gemma3-270m` alias).

Drives llama-server (`-fa off`, 1 thread: on a loaded machine 2 spin) over HTTP; run once, the output is
checked in, so CI needs no llama.cpp:
  * prompt token ids from /tokenize (`add_special`: BOS as the GGUF says,
    tokenizer.ggml.add_bos_token = true; chat prompts with specials parsed:
    llama.cpp strips the template's leading <bos> and adds it back here),
  * greedy decoding from /completion (top_k 1, 24 tokens, EOS ignored: the
    end-of-generation ids llama.cpp then bans are recorded as "banned_ids") with
    n_probs 2: per step the two best tokens and their log-probabilities,
    whose difference is the top-2 logit gap (softmax keeps differences),
  * chat prompts rendered by /apply-template with Gemma 3's own template
    (crates/formats/src/gemma3_chat_template.jinja, which shardlm uses for a
    Gemma 3 GGUF without one; this GGUF has none, and llama.cpp would
    otherwise fall back to ChatML).

Usage:  python3 scripts/refs/make_gemma3_llamacpp_refs.py [LLAMA_BIN_DIR]
Writes: tests/data/gemma3/llamacpp_refs.json
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.cache/shardlm/llama.cpp-b11434/build-487dbe8a/bin")
MODEL = os.path.expanduser("~/.cache/shardlm/gemma3-270m/gemma-3-270m-q4_k_m.gguf")
TEMPLATE = os.path.join(REPO, "crates", "formats", "src", "gemma3_chat_template.jinja")
OUT = os.path.join(REPO, "tests", "data", "gemma3", "llamacpp_refs.json")
PORT = 18093
N_GEN = 24

RAW_PROMPTS = [
    ("capital_france", "The capital of France is"),
    ("code_fibonacci", "def fibonacci(n):"),
    ("list_primes", "The first ten prime numbers are 2, 3, 5,"),
    ("story_opener", "Once upon a time, in a small village by the sea,"),
    ("factual_question", "Question: What is the boiling point of water at sea level?\nAnswer:"),
    ("non_ascii_french", "Le château de Versailles est situé à"),
    ("non_ascii_cjk_emoji", "日本の首都は東京です。🗼 Tokyo is"),
    ("recipe", "To make a simple tomato sauce, you need"),
]

CHATS = [
    ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_haiku", [{"role": "system", "content": "You are a poet."},
                    {"role": "user", "content": "Write a haiku about the ocean."}]),
    ("chat_multi_turn", [{"role": "user", "content": "Name a color."},
                         {"role": "assistant", "content": "Blue."},
                         {"role": "user", "content": "  And another one?  "}]),
]


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def greedy(ids):
    r = post("/completion", {"prompt": ids, "n_predict": N_GEN, "top_k": 1, "temperature": 0.0,
                             "samplers": ["top_k"], "n_probs": 2, "ignore_eos": True,
                             "cache_prompt": False, "return_tokens": True})
    banned = sorted(b["token"] for b in r["generation_settings"]["logit_bias"])
    out, top2 = [], []
    for step in r["completion_probabilities"]:
        best = step["top_logprobs"]
        assert best[0]["id"] == step["id"], step
        out.append(step["id"])
        top2.append([best[0]["id"], round(best[0]["logprob"], 4), best[1]["id"], round(best[1]["logprob"], 4)])
    assert len(out) == N_GEN, len(out)
    return out, top2, banned


def main():
    server = subprocess.Popen([os.path.join(BIN, "llama-server"), "-m", MODEL, "-fa", "off", "-t", "1",
                               "-c", "4096", "--port", str(PORT), "--jinja", "--chat-template-file", TEMPLATE],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        cases = []
        for name, text in RAW_PROMPTS:
            ids = post("/tokenize", {"content": text, "add_special": True})["tokens"]
            cases.append(dict(name=name, kind="raw", text=text, prompt_ids=ids))
        for name, messages in CHATS:
            text = post("/apply-template", {"messages": messages})["prompt"]
            ids = post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            cases.append(dict(name=name, kind="chat", messages=messages, text=text, prompt_ids=ids))
        banned = []
        for c in cases:
            c["output_ids"], c["top2"], banned = greedy(c["prompt_ids"])
            print(c["name"], flush=True)
        version = subprocess.run([os.path.join(BIN, "llama-server"), "--version"], capture_output=True, text=True)
        doc = {
            "model": os.path.basename(MODEL),
            "model_sha256": sha256_file(MODEL),
            "llama_cpp": (version.stdout + version.stderr).strip().splitlines()[0],
            "settings": "llama-server -fa off -t 1, greedy top_k 1, n_probs 2 (log-probabilities), EOS ignored",
            "banned_ids": banned,
            "n_gen": N_GEN,
            "cases": cases,
        }
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as f:
            json.dump(doc, f, indent=1, ensure_ascii=False)
        print(f"wrote {OUT}: {len(cases)} cases")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
