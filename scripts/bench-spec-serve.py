#!/usr/bin/env python3
"""Speculative decoding through `serve`, the path agents use (issue 28).

The prompts of bench/spec/ (a 55-line file in Python, Rust and JavaScript
with an instruction to rename one thing, answered with the whole file; a
short story) go to `/v1/chat/completions`, streamed and greedy, to one
`serve --draft ngram` per round; each prompt is asked without speculation
(the request's `"draft": "none"` extension field) and then with it, so both
readings come from the same process, alternating A B. A plain request never
feeds the shared n-gram pool, so the speculating request of a prompt never
drafts from its own earlier answer; a new server each round starts with an
empty pool. Decode tok/s is read by a bare socket client (no SSE or JSON
parsing while it streams: on a 2-core machine a heavier client takes CPU
from the engine it measures): (completion tokens − 1) ÷ (last chunk − first
chunk), tokens from the final usage chunk.

Usage: scripts/bench-spec-serve.py [--rounds 3] [--max-tokens 700] [--prose-tokens 150]
                                   [--splits single,pipeline2]
Environment: SHARDLM (default target/release/shardlm), SHARDLM_MODEL (default
the cached SmolLM2-135M Q4_1).
"""

import argparse
import http.client
import importlib.util
import json
import os
import statistics
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("bsb", os.path.join(ROOT, "scripts", "bench-serve-batch.py"))
bsb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bsb)

SPLITS = {
    "single": ["--threads", "2"],
    "pipeline2": ["--ranks", "2", "--strategy", "pipeline", "--threads", "1"],
}
PROMPTS = ["edit_python", "edit_rust", "edit_js", "prose"]


def stream(port, prompt, max_tokens, draft):
    """(completion tokens, decode tok/s, text, drafted, accepted) of one streamed chat completion."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "draft": draft,
    }
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()[:300]
    first = last = None
    raw = []
    while True:
        b = r.read1(65536)
        if not b:
            break
        raw.append(b)
        if b.count(b"data: {"):
            last = time.perf_counter()
            first = first or last
    text, usage = [], {}
    for line in b"".join(raw).decode().splitlines():
        if not line.startswith("data: {"):
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices") or []:
            text.append(ch.get("delta", {}).get("content") or "")
        usage = ev.get("usage") or usage
    n = usage.get("completion_tokens", 0)
    tps = (n - 1) / (last - first) if n > 1 and last > first else 0.0
    return n, tps, "".join(text), usage


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        for name in ("shardlm_spec_draft_tokens_total", "shardlm_spec_accepted_tokens_total"):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=700)
    ap.add_argument("--prose-tokens", type=int, default=150)
    ap.add_argument("--splits", default="single,pipeline2")
    a = ap.parse_args()
    binary = os.environ.get("SHARDLM", os.path.join(ROOT, "target", "release", "shardlm"))
    model = os.environ.get("SHARDLM_MODEL",
                           os.path.expanduser("~/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    # Without the files' last newline, as scripts/bench-spec.sh passes them
    # (`$(cat F)`): the same prompts, so the same answers as `run --chat`.
    prompts = {p: open(os.path.join(ROOT, "bench", "spec", f"{p}.txt")).read().rstrip("\n") for p in PROMPTS}
    logdir = tempfile.mkdtemp()
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    for split in a.splits.split(","):
        got = {p: {"none": [], "ngram": []} for p in PROMPTS}
        texts = {p: set() for p in PROMPTS}
        counts = {p: [0, 0] for p in PROMPTS}
        for r in range(a.rounds):
            port = bsb.free_port()
            argv = [binary, "serve", "--model", model, "--port", str(port), "--draft", "ngram", *SPLITS[split]]
            srv = bsb.Server("serve", argv, port, os.path.join(logdir, f"{split}.{r}.log"))
            try:
                stream(port, "Hello.", 4, "none")  # warm-up
                for p in PROMPTS:
                    n_max = a.prose_tokens if p == "prose" else a.max_tokens
                    for mode in ("none", "ngram"):
                        m0 = metrics(port)
                        n, tps, text, _ = stream(port, prompts[p], n_max, mode)
                        m1 = metrics(port)
                        got[p][mode].append(tps)
                        texts[p].add(text)
                        if mode == "ngram":
                            for i, k in enumerate(("shardlm_spec_draft_tokens_total",
                                                   "shardlm_spec_accepted_tokens_total")):
                                counts[p][i] += m1.get(k, 0) - m0.get(k, 0)
                        print(f"  {split} round {r} {p:12} {mode:5} {n:4} tokens {tps:7.1f} tok/s", flush=True)
            finally:
                srv.stop()
        for p in PROMPTS:
            a_, b_ = statistics.median(got[p]["none"]), statistics.median(got[p]["ngram"])
            d, acc = counts[p]
            print(f"{split:9} {p:12} none {a_:7.1f} tok/s  ngram {b_:7.1f} tok/s  speedup {b_ / a_:5.2f}x  "
                  f"acceptance {acc / max(d, 1):.2f} ({acc:.0f}/{d:.0f})  identical {len(texts[p]) == 1}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
