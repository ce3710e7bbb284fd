#!/usr/bin/env python3
"""Single-stream decode through HTTP against `shardlm bench` on the same model.

Starts `shardlm serve`, streams /v1/completions (greedy, a prompt that makes the
model count so it runs to max_tokens) and times the tokens after the first;
then runs `shardlm bench -p PROMPT -g N` and prints both decode rates.
Usage: scripts/bench-serve.py [-g 128] [-n 3] [extra serve flags...]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import httpx

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "target", "release", "shardlm"))


def http_decode(port, n_tokens):
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    times, usage = [], None
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                elif chunk["choices"] and chunk["choices"][0]["text"]:
                    times.append(time.perf_counter())
    # Text chunks can merge tokens (UTF-8, stop-string hold-back): rate from the usage count.
    decoded = usage["completion_tokens"] - 1
    return decoded / (times[-1] - times[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("-n", type=int, default=3)
    args, serve_flags = ap.parse_known_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([BIN, "serve", "--port", str(port), *serve_flags], stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        http_decode(port, 16)  # warm-up
        rates = [http_decode(port, args.g) for _ in range(args.n)]
    finally:
        proc.terminate()
        proc.wait()
    out = subprocess.run([BIN, "bench", "-p", "30", "-g", str(args.g), "-n", str(args.n), "--json", *serve_flags],
                         capture_output=True, text=True, check=True).stdout
    bench = json.loads(out.strip().splitlines()[-1])["avg"]["generation_tps"]
    http = sorted(rates)[len(rates) // 2]
    print(json.dumps({"http_decode_tok_s": round(http, 1), "bench_decode_tok_s": round(bench, 1),
                      "http_over_bench": round(http / bench, 3)}))


if __name__ == "__main__":
    sys.exit(main())
