#!/usr/bin/env python3
"""Compares `shardlm plan`'s serving predictions with `serve` (issue 27):
TTFT of a ~3,000-token prompt and the aggregate decode tok/s of 8 concurrent
streams, for one process (2 threads) and 2 ranks × 1 thread (pipeline,
tensor). The measurements are `scripts/bench-serve-split.py`'s (a fresh
`serve` per configuration and round, configurations alternating); the plan
runs right after each round, on the same machine state.

  scripts/plan-check-serve.py [--rounds 2] [--json PATH]

Environment: SHARDLM (default target/release/shardlm)."""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("bss", os.path.join(ROOT, "scripts", "bench-serve-split.py"))
bss = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bss)

# config -> (plan machines, threads, links, strategy, ranks)
PLAN = {
    "one2": ("local", 2, [], "single", 1),
    "pipe2": ("2xlocal", 1, ["--links", "local-shm"], "pipeline", 2),
    "tensor2": ("2xlocal", 1, ["--links", "local-shm"], "tensor", 2),
}


def plan(args, name, context):
    machines, threads, links, strategy, ranks = PLAN[name]
    out = subprocess.run([args.shardlm, "plan", "--model", args.model, "--machines", machines, "--threads",
                          str(threads), *links, "--context", str(context), "--streams", "8", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    preds = json.loads(out)["predictions"]
    return next(p for p in preds if p["strategy"] == strategy and p["ranks"] == ranks)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lines", type=int, default=80)
    ap.add_argument("--json")
    ap.add_argument("--httpx-client", action="store_true",
                    help="read the decode streams with httpx and parse every chunk, as bench-serve-split.py does "
                         "by default (on a 2-core machine that client takes CPU the planner does not model)")
    args = ap.parse_args()
    args.light_client = not args.httpx_client
    args.shardlm = os.environ.get("SHARDLM", os.path.join(ROOT, "target", "release", "shardlm"))
    raw = tempfile.mkdtemp(prefix="plan-check-serve.")
    rows = {n: [] for n in PLAN}
    for rnd in range(args.rounds):
        for n in PLAN:
            m = bss.one_round(n, args, rnd, raw)
            # The 8 streams decode ~128 tokens after a ~40-token prompt: plan at their mean depth.
            p_ttft = plan(args, n, int(m["prompt_tokens"]))
            p_serve = plan(args, n, 104)
            r = {"ttft_measured": m["ttft_s"], "ttft_predicted": p_ttft["ttft_s"],
                 "agg_measured": m["decode_8"], "agg_predicted": p_serve["serve_tok_s"],
                 "prompt_tokens": m["prompt_tokens"]}
            rows[n].append(r)
            print(f"round {rnd} {n}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    print("\n| config | prompt | TTFT predicted | TTFT measured | error | 8-stream predicted | "
          "8-stream measured | error |")
    print("|---|---|---|---|---|---|---|---|")
    med = {}
    for n, rs in rows.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        med[n] = m
        e1 = m["ttft_predicted"] / m["ttft_measured"] - 1
        e2 = m["agg_predicted"] / m["agg_measured"] - 1
        print(f"| {n} | {m['prompt_tokens']:.0f} | {m['ttft_predicted']:.2f} s | {m['ttft_measured']:.2f} s | "
              f"{e1:+.0%} | {m['agg_predicted']:.0f} tok/s | {m['agg_measured']:.0f} tok/s | {e2:+.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
