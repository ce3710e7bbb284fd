#!/usr/bin/env python3
"""Speculative decoding with a draft model (issue 28): SmolLM2-135M Q4_0
drafting for SmolLM2-135M Q8_0 (both made from the cached Q4_1 GGUF by
`shardlm quantize`), against llama.cpp's draft-model speculation on the
same two files, on the code-edit prompts of bench/spec/.

Five configurations, alternated A B F C D in every round, medians reported:
  A  shardlm run --chat --threads T                       (no speculation)
  B  shardlm run --chat --threads T --draft-model Q4_0    (drafts while they pay)
  F  B with SHARDLM_DRAFT_COST=0                          (drafts at every step)
  C  llama-server -m Q8_0 -t T                            (no speculation)
  D  llama-server -m Q8_0 -md Q4_0 --spec-type draft-simple -t T --poll 0 --poll-draft 0
     (llama.cpp's default draft lengths; without --spec-type it loads the
     draft model and does not speculate, and with its default polling the
     target's and the draft's thread pools spin against each other on 2
     cores: 0.8-4 tok/s)
shardlm reads `decode_tok_s`, drafted and accepted tokens from `run --json`;
llama-server `timings.predicted_per_second`, `draft_n` and
`draft_n_accepted` of a greedy /v1/chat/completions (prompt cache off, the
same chat template from the GGUF). Both servers stay up (idle) throughout.

Usage: scripts/bench-draft-model.py [--rounds 3] [--max-tokens 700] [--threads 2]
                                    [--prompts edit_python,edit_rust,edit_js]
Environment: SHARDLM (default $CARGO_TARGET_DIR/release/shardlm or
target/release/shardlm), LLAMA_BIN (llama.cpp's bin directory, default
~/.cache/shardlm/llama.cpp-b11434/build-487dbe8a/bin).
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CACHE = os.environ.get("SHARDLM_CACHE", os.path.expanduser("~/.cache/shardlm"))
SHARDLM = os.environ.get("SHARDLM", os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release/shardlm"))
LLAMA_BIN = os.environ.get("LLAMA_BIN", os.path.join(CACHE, "llama.cpp-b11434/build-487dbe8a/bin"))


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def make_pair():
    """The Q8_0 target and Q4_0 draft, quantized once into the cache."""
    src = os.path.join(CACHE, "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = os.path.join(CACHE, "draft-bench")
    os.makedirs(out, exist_ok=True)
    pair = []
    for ty in ["q8_0", "q4_0"]:
        path = os.path.join(out, f"SmolLM2-135M-Instruct.{ty}.gguf")
        if not os.path.exists(path):
            part = path.replace(".gguf", ".part.gguf")  # quantize writes names ending in .gguf
            subprocess.run([SHARDLM, "quantize", src, part, "--to", ty], check=True, stdout=subprocess.DEVNULL)
            os.rename(part, path)
        pair.append(path)
    return pair


def shardlm_run(target, prompt, n, threads, draft, cost=None):
    args = [SHARDLM, "run", "--model", target, "--chat", "--prompt", prompt, "--max-tokens", str(n),
            "--threads", str(threads), "--json"]
    if draft:
        args += ["--draft-model", draft]
    env = dict(os.environ)
    if cost is not None:
        env["SHARDLM_DRAFT_COST"] = str(cost)
    j = json.loads(subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout)
    return {"tok_s": j["decode_tok_s"], "drafted": j["drafted_tokens"], "accepted": j["accepted_tokens"],
            "ids": j["output_ids"], "text": j["text"]}


class LlamaServer:
    def __init__(self, port, target, threads, draft):
        args = [os.path.join(LLAMA_BIN, "llama-server"), "-m", target, "-t", str(threads), "-c", "4096",
                "-np", "1", "--port", str(port), "--host", "127.0.0.1"]
        if draft:
            args += ["-md", draft, "--spec-type", "draft-simple", "--poll", "0", "--poll-draft", "0"]
        env = dict(os.environ, LD_LIBRARY_PATH=LLAMA_BIN)
        self.port = port
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama-server on port {port} did not start")

    def chat(self, prompt, n):
        body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                           "temperature": 0, "cache_prompt": False})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        j = json.loads(r.read())
        assert r.status == 200, j
        t = j.get("timings", {})
        return {"tok_s": t.get("predicted_per_second", 0.0), "drafted": t.get("draft_n", 0),
                "accepted": t.get("draft_n_accepted", 0), "ids": None,
                "text": j["choices"][0]["message"]["content"]}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=700)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default="edit_python,edit_rust,edit_js")
    a = ap.parse_args()
    target, draft = make_pair()
    print(f"target {target}\ndraft  {draft}\nload before: {load()}", flush=True)
    servers = {"C": LlamaServer(18431, target, a.threads, None), "D": LlamaServer(18432, target, a.threads, draft)}
    try:
        for p in a.prompts.split(","):
            with open(os.path.join(ROOT, "bench/spec", p + ".txt")) as f:
                prompt = f.read()
            runs = {k: [] for k in "ABFCD"}
            for _ in range(a.rounds):
                runs["A"].append(shardlm_run(target, prompt, a.max_tokens, a.threads, None))
                runs["B"].append(shardlm_run(target, prompt, a.max_tokens, a.threads, draft))
                runs["F"].append(shardlm_run(target, prompt, a.max_tokens, a.threads, draft, cost=0))
                runs["C"].append(servers["C"].chat(prompt, a.max_tokens))
                runs["D"].append(servers["D"].chat(prompt, a.max_tokens))
            med = {k: statistics.median(r["tok_s"] for r in v) for k, v in runs.items()}
            acc = {}
            for k in "BFD":
                d = sum(r["drafted"] for r in runs[k])
                acc[k] = (sum(r["accepted"] for r in runs[k]), d)
            same = all(r["ids"] == runs["A"][0]["ids"] for r in runs["A"] + runs["B"] + runs["F"])
            same_llama = all(r["text"] == runs["C"][0]["text"] for r in runs["C"] + runs["D"])
            rate = lambda k: f"{acc[k][0] / max(acc[k][1], 1):.2f} ({acc[k][0]}/{acc[k][1]})"
            print(f"{p:12} tokens {len(runs['A'][0]['ids']):4}  identical {same} (llama.cpp {same_llama})\n"
                  f"  shardlm   none {med['A']:6.1f}  draft-model {med['B']:6.1f} ({med['B'] / med['A']:4.2f}x, "
                  f"acceptance {rate('B')})  always drafting {med['F']:6.1f} ({med['F'] / med['A']:4.2f}x, "
                  f"acceptance {rate('F')})\n"
                  f"  llama.cpp none {med['C']:6.1f}  -md          {med['D']:6.1f} ({med['D'] / max(med['C'], 1e-9):4.2f}x, "
                  f"acceptance {rate('D')})\n"
                  f"  shardlm / llama.cpp: none {med['A'] / max(med['C'], 1e-9):4.2f}x  with the draft model "
                  f"{med['B'] / max(med['D'], 1e-9):4.2f}x (always drafting {med['F'] / max(med['D'], 1e-9):4.2f}x)",
                  flush=True)
    finally:
        for s in servers.values():
            s.stop()
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
