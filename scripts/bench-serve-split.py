#!/usr/bin/env python3
"""What `serve` gives agents on a split model, against `bench` and one process.

For each configuration (one process with 1 and with 2 threads; 2 ranks of 1
thread each, pipeline and tensor), alternating the configurations round by
round (A B C D A B C D ...), a fresh `shardlm serve` each time:

  ttft_s        TTFT of one ~3,000-token prompt (streamed /v1/chat/completions,
                greedy, a salt per round so the prefix cache cannot help)
  decode_1      one stream's decode tok/s (128 tokens)
  decode_8      aggregate decode tok/s of 8 concurrent streams × 128 tokens
and, with `shardlm bench` on the same split (`-p` the prompt's token count,
`-g 1`; then `-p 40 -g 128`, the depth of the decode streams):
  bench_ttft_s, bench_decode

Prints medians and the ratios issue 27 asks for:
  pipeline serve TTFT ÷ pipeline bench TTFT            ≤ 1.10
  pipeline serve TTFT ÷ one process (1 thread) TTFT    ≤ 0.75
  pipeline 8-stream aggregate ÷ one process (2 thr)    ≥ 0.90
  tensor 8-stream aggregate ÷ one process (2 thr)      ≥ 1.0
  serve single-stream decode ÷ bench decode            ≥ 0.95 (each config)

Usage: scripts/bench-serve-split.py [--rounds 2] [--model GGUF] [--lines 80]
           [--configs one1,one2,pipe2,tensor2] [--json PATH] [--light-client]
`--light-client` reads the decode streams with a bare socket instead of httpx
with a JSON parse per chunk: on a 2-core machine 8 such client threads take
20-40% of the server's aggregate (measured 2026-12-03).
Environment: SHARDLM (default target/release/shardlm).
"""

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("bsb", os.path.join(ROOT, "scripts", "bench-serve-batch.py"))
bsb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bsb)

CONFIGS = {
    "one1": ["--threads", "1"],
    "one2": ["--threads", "2"],
    "pipe2": ["--ranks", "2", "--strategy", "pipeline", "--threads", "1"],
    "tensor2": ["--ranks", "2", "--strategy", "tensor", "--threads", "1"],
}


def bench(args, flags, p, g):
    out = subprocess.run([args.shardlm, "bench", "--model", args.model, "-p", str(p), "-g", str(g), "-n", "1",
                          "--json", *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         check=True).stdout
    return json.loads(out)["avg"]


def one_round(name, args, rnd, raw_dir):
    flags = CONFIGS[name]
    port = bsb.free_port()
    argv = [args.shardlm, "serve", "--model", args.model, "--port", str(port), "--context", "8192", *flags]
    srv = bsb.Server(name, argv, port, os.path.join(raw_dir, f"{name}.{rnd}.log"))
    try:
        bsb.stream_chat(srv.base, [{"role": "user", "content": "Hello."}], 4)  # warm-up
        salt = f"Round-{rnd}-{name}-{random.randrange(16**8):08x}."
        messages = [{"role": "system", "content": f"{salt} You review code. Answer briefly."},
                    {"role": "user", "content": "Here is a file:\n\n" + bsb.code_file(salt, args.lines)
                     + "\n\nWhat does line 3 do?"}]
        long = bsb.stream_chat(srv.base, messages, 8)
        out = {"ttft_s": long["ttft"], "prompt_tokens": long["prompt_tokens"]}
        light = getattr(args, "light_client", False)
        out["decode_1"] = bsb.decode_case(srv.base, 1, 128, salt, light)
        out["decode_8"] = bsb.decode_case(srv.base, 8, 128, salt, light)
    finally:
        srv.stop()
    b = bench(args, flags, out["prompt_tokens"], 1)
    out["bench_ttft_s"] = b["ttft_s"]
    # At the depth of the serve streams (a short chat prompt, ~40 tokens).
    out["bench_decode"] = bench(args, flags, 40, 128)["generation_tps"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lines", type=int, default=80, help="lines of the made-up file (~36 tokens each)")
    ap.add_argument("--configs", default="one1,one2,pipe2,tensor2")
    ap.add_argument("--json")
    ap.add_argument("--light-client", action="store_true",
                    help="read the decode streams with a bare socket (less client CPU on a small machine)")
    args = ap.parse_args()
    args.shardlm = os.environ.get("SHARDLM", os.path.join(ROOT, "target", "release", "shardlm"))
    names = args.configs.split(",")
    raw_dir = tempfile.mkdtemp(prefix="bench-serve-split.")
    runs = {n: [] for n in names}
    for rnd in range(args.rounds):
        for n in names:
            r = one_round(n, args, rnd, raw_dir)
            runs[n].append(r)
            print(f"round {rnd} {n}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(f"\nmedians over {args.rounds} round(s); logs in {raw_dir}\n")
    print("| config | prompt tokens | serve TTFT s | bench TTFT s | serve ÷ bench TTFT | decode 1 stream | "
          "bench decode | serve ÷ bench decode | 8 streams aggregate |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, m in med.items():
        print(f"| {n} | {m['prompt_tokens']:.0f} | {m['ttft_s']:.2f} | {m['bench_ttft_s']:.2f} | "
              f"{m['ttft_s'] / m['bench_ttft_s']:.2f} | {m['decode_1']:.1f} | {m['bench_decode']:.1f} | "
              f"{m['decode_1'] / m['bench_decode']:.2f} | {m['decode_8']:.1f} |")
    ratios = {}
    if "pipe2" in med and "one1" in med:
        ratios["pipe2 serve TTFT / one1 serve TTFT (≤ 0.75)"] = med["pipe2"]["ttft_s"] / med["one1"]["ttft_s"]
    if "pipe2" in med:
        ratios["pipe2 serve TTFT / pipe2 bench TTFT (≤ 1.10)"] = med["pipe2"]["ttft_s"] / med["pipe2"]["bench_ttft_s"]
    for n in ("pipe2", "tensor2"):
        if n in med and "one2" in med:
            ratios[f"{n} 8-stream aggregate / one2 (≥ {'0.90' if n == 'pipe2' else '1.0'})"] = \
                med[n]["decode_8"] / med["one2"]["decode_8"]
    print()
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "medians": med, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
