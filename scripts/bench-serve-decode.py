#!/usr/bin/env python3
"""One stream's decode through `serve` against `bench` decode at the same depth
(issue 27: within 5%), alternating bench and serve round by round.

For serve, two readings of the same request (`/v1/completions`, streamed,
greedy, `ignore_eos`, GEN tokens after a ~40-token prompt):
  client   tokens ÷ (last chunk − first chunk), read with a bare socket
           client (no SSE/JSON parsing: on a 2-core machine a heavier client
           takes CPU from the engine it measures)
  server   the server's own inter-token latency (`/metrics` histogram
           `shardlm_inter_token_latency_seconds`, sum and count deltas)
and `shardlm bench -p 40 -g GEN -n 1` with the same flags. One server runs
the whole time; each round runs bench and one stream, in alternating order,
and the headline is the median of the rounds' serve ÷ bench ratios (this VM
drifts ±25% over minutes, far more than the 5% being measured).

Usage: scripts/bench-serve-decode.py [--rounds 12] [--gen 256] [--flags "--threads 2"]
Environment: SHARDLM (default target/release/shardlm).
"""

import argparse
import http.client
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("bsb", os.path.join(ROOT, "scripts", "bench-serve-batch.py"))
bsb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bsb)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("shardlm_inter_token_latency_seconds_sum") or \
                line.startswith("shardlm_inter_token_latency_seconds_count"):
            name, value = line.split()
            out[name.rsplit("_", 1)[1]] = float(value)
    return out


def stream(port, prompt, gen):
    """(tokens, first chunk time, last chunk time) of one streamed completion."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": gen, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()[:300]
    first = last = None
    chunks = 0
    while True:
        b = r.read1(65536)
        if not b:
            break
        n = b.count(b"data: {")
        if n:
            last = time.perf_counter()
            first = first or last
            chunks += n
    return chunks, first, last


def paired(rows):
    """Median of the per-round serve ÷ bench ratios (drift cancels within a round)."""
    return statistics.median(c / b for b, c, _ in rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--flags", default="--threads 2")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    a = ap.parse_args()
    binary = os.environ.get("SHARDLM", os.path.join(ROOT, "target", "release", "shardlm"))
    flags = shlex.split(a.flags)
    prompt = "Write a long story about a dragon who keeps a lighthouse, and the sailors who pass by at night."
    rows = []
    logdir = tempfile.mkdtemp()
    port = bsb.free_port()
    # One server for the whole run (it idles, parked, while bench runs), so a
    # round is seconds long and the VM's drift falls on both halves of it.
    srv = bsb.Server("serve", [binary, "serve", "--model", a.model, "--port", str(port), *flags], port,
                     os.path.join(logdir, "serve.log"))

    def bench():
        out = subprocess.run([binary, "bench", "--model", a.model, "-p", "40", "-g", str(a.gen), "-n", "1", "--json",
                              *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
        return json.loads(out.stdout)["avg"]["generation_tps"]

    def serve():
        m0 = metrics(port)
        chunks, first, last = stream(port, prompt, a.gen)
        m1 = metrics(port)
        return (chunks - 1) / (last - first), (m1["count"] - m0["count"]) / (m1["sum"] - m0["sum"])

    try:
        stream(port, prompt, a.gen)  # warm-up: the pool's pages and the prompt's blocks
        for r in range(a.rounds):
            # Alternate which half goes first, so an order effect cancels too.
            if r % 2 == 0:
                b = bench()
                client, server = serve()
            else:
                client, server = serve()
                b = bench()
            rows.append((b, client, server))
            print(f"round {r}: bench {b:.1f}  serve client {client:.1f}  serve server {server:.1f} tok/s  "
                  f"(serve/bench {client / b:.3f}, load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        srv.stop()
    b, c, s = (statistics.median(x[i] for x in rows) for i in range(3))
    print(f"medians: bench {b:.1f}, serve client {c:.1f} ({c / b:.2f}x), serve server {s:.1f} ({s / b:.2f}x); "
          f"median of the rounds' ratios {paired(rows):.3f}")
    if a.json:
        print(json.dumps({"bench_tps": b, "serve_client_tps": c, "serve_server_tps": s, "ratio_of_medians": c / b,
                          "median_round_ratio": paired(rows), "rounds": rows}))


if __name__ == "__main__":
    main()
