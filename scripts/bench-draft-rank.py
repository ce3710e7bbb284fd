#!/usr/bin/env python3
"""Where the draft model runs (issue 28, `--draft-rank`): SmolLM2-135M Q4_0
drafting for Q8_0 on a pipeline of 2 ranks × 1 thread, the draft model on
rank 0 (beside the head stage, the default) against on rank 1 (the
embedding stage, `--draft-rank 1`), and no speculation, alternating in
every round, on the code-edit prompts of bench/spec/ (`run --chat`, greedy).
Drafting at every step (`SHARDLM_DRAFT_COST=0`): the placement, not the
cost policy, is what this compares. Prints median decode tok/s, the
acceptance rate, and whether every output was identical.

Usage: scripts/bench-draft-rank.py [--rounds 2] [--max-tokens 400]
Environment: SHARDLM (default target/release/shardlm).
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("bdm", os.path.join(ROOT, "scripts", "bench-draft-model.py"))
bdm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bdm)

SPLIT = ["--ranks", "2", "--strategy", "pipeline", "--threads", "1"]
PROMPTS = ["edit_python", "edit_rust", "edit_js"]


def run(binary, target, prompt, n, extra):
    env = dict(os.environ, SHARDLM_DRAFT_COST="0")
    out = subprocess.run([binary, "run", "--model", target, "--chat", "--prompt", prompt, "--max-tokens", str(n),
                          "--json", *SPLIT, *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         check=True, env=env)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=400)
    a = ap.parse_args()
    binary = os.environ.get("SHARDLM", os.path.join(ROOT, "target", "release", "shardlm"))
    target, draft = bdm.make_pair()
    configs = {
        "none": ["--draft", "none"],
        "rank 0": ["--draft-model", draft],
        "rank 1": ["--draft-model", draft, "--draft-rank", "1"],
    }
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    for p in PROMPTS:
        prompt = open(os.path.join(ROOT, "bench", "spec", f"{p}.txt")).read().rstrip("\n")
        got = {c: [] for c in configs}
        for _ in range(a.rounds):
            for c, extra in configs.items():
                got[c].append(run(binary, target, prompt, a.max_tokens, extra))
        ids = {json.dumps(x["output_ids"]) for runs in got.values() for x in runs}
        line = [f"{p:12} {len(got['none'][0]['output_ids']):4} tokens"]
        for c, runs in got.items():
            tps = statistics.median(x["decode_tok_s"] for x in runs)
            d = sum(x["drafted_tokens"] for x in runs)
            acc = sum(x["accepted_tokens"] for x in runs)
            line.append(f"{c} {tps:6.1f} tok/s" + (f" (acc {acc / d:.2f})" if d else ""))
        line.append(f"identical {len(ids) == 1}")
        print("  ".join(line), flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
