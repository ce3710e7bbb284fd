#!/usr/bin/env python3
"""Serving benchmark: prefix cache and batched decode, shardlm serve vs llama-server.

Runs `shardlm serve` and llama-server (`-np STREAMS`) on the same GGUF with the
same threads and per-sequence context, one at a time, alternating A B A B for
--rounds (a fresh server each time, so every round starts with empty caches),
and reports medians over the rounds of:

  prefix cache   TTFT of a ~2,000-token conversation's first turn, TTFT of the
                 second turn (the first turn + its reply + one more user turn),
                 and second / first                          target ≤ 0.20
  batched decode aggregate decode tok/s of STREAMS concurrent streams and of
                 one stream; STREAMS / 1                     target ≥ 3
                 and shardlm / llama-server at STREAMS       target ≥ 1

Everything goes through streaming /v1/chat/completions at temperature 0; the
decode streams send `ignore_eos: true` (both servers accept it) with a fixed
max_tokens, so every stream generates exactly that many tokens. A stream's
decode time runs from its first token to its last; the aggregate rate is all
streams' tokens after their first over the span from the earliest first token
to the latest last one.

Usage: scripts/bench-serve-batch.py [--rounds 3] [--threads N] [--context 4096]
           [--model GGUF] [--prefix-lines 54] [--gen 128] [--streams 8]
           [--no-llama] [--json PATH] [--shardlm-args "..."] [--llama-args "..."]
Environment:
  SHARDLM        the shardlm binary (default: target/release/shardlm; build it
                 with `cargo build --release -p shardlm`)
  LLAMA_SERVER   an existing llama-server; else scripts/bench-vs-llamacpp.sh
                 --llama-server builds llama.cpp b11434's with the same ISA
                 flags as its llama-bench
  SHARDLM_CACHE  where the default model is (default ~/.cache/shardlm)
"""

import argparse
import json
import os
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CACHE = os.environ.get("SHARDLM_CACHE", os.path.expanduser("~/.cache/shardlm"))
DEFAULT_MODEL = os.path.join(CACHE, "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")
WORDS = ("alpha beta gamma delta omega river stone lamp cloud north south copper violet engine "
         "garden window signal parcel ledger harbor").split()
TARGETS = {"ttft_ratio_max": 0.20, "batch_scaling_min": 3.0, "vs_llama_min": 1.0}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- servers --------------------------------------------------------------------


class Server:
    """One server process; `base` is its URL once /health answers 200."""

    def __init__(self, name, argv, port, log_path):
        self.name = name
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}; see {log_path}")
            try:
                # llama-server answers 503 while it loads the model.
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not become healthy in 300 s; see {log_path}")
            time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def shardlm_argv(args, port):
    return [args.shardlm, "serve", "--model", args.model, "--port", str(port), "--threads", str(args.threads),
            "--context", str(args.context), *shlex.split(args.shardlm_args)]


def llama_argv(args, port):
    # -c is the whole KV pool, split among the -np slots: each slot gets --context.
    return [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.streams),
            "-c", str(args.context * args.streams), *shlex.split(args.llama_args)]


def find_llama_server():
    path = os.environ.get("LLAMA_SERVER")
    if path:
        return path
    out = subprocess.run([os.path.join(ROOT, "scripts", "bench-vs-llamacpp.sh"), "--llama-server"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


# --- requests -------------------------------------------------------------------


def stream_chat(base, messages, max_tokens, ignore_eos=False):
    """One streamed chat completion: TTFT, first and last token times, token count, text."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    sent = time.perf_counter()
    times, text, usage, finished = [], [], None, None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{base}: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices") or []:
                if c.get("finish_reason"):
                    finished = time.perf_counter()
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
    if not times:
        raise RuntimeError(f"{base}: the stream produced no text")
    # A chunk can carry several tokens (UTF-8, stop-string hold-back): count from usage when given.
    tokens = usage["completion_tokens"] if usage else len(times)
    # The last token's time is when the finish chunk comes: tokens that carry
    # no text (special tokens generated under ignore_eos) send no content chunk.
    last = finished if finished is not None and usage else times[-1]
    return {"ttft": times[0] - sent, "first": times[0], "last": last, "tokens": tokens, "text": "".join(text),
            "prompt_tokens": usage["prompt_tokens"] if usage else None,
            "cached_tokens": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}


def code_file(salt, lines):
    """Numbered lines of a made-up Python file (about 36 tokens a line), varied so
    nothing but a real prefix match can reuse them."""
    rng = random.Random(salt)
    out = []
    for i in range(1, lines + 1):
        a, b, c = rng.sample(WORDS, 3)
        out.append(f"{i:04d}    {a}_{i} = compute_{b}(items[{rng.randrange(1000)}], "
                   f"factor={rng.random():.3f})  # {c} step {rng.randrange(100)}")
    return "\n".join(out)


def prefix_case(base, salt, lines, turn_tokens):
    messages = [{"role": "system", "content": f"{salt} You are a careful code reviewer. Answer briefly."},
                {"role": "user", "content": "Here is a file:\n\n" + code_file(salt, lines) + "\n\nWhat does line 3 do?"}]
    first = stream_chat(base, messages, turn_tokens)
    messages += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "And line 5?"}]
    second = stream_chat(base, messages, turn_tokens)
    return {"ttft_first_s": first["ttft"], "ttft_second_s": second["ttft"],
            "ttft_ratio": second["ttft"] / first["ttft"], "prompt_tokens_first": first["prompt_tokens"],
            "prompt_tokens_second": second["prompt_tokens"], "cached_tokens_second": second["cached_tokens"]}


def stream_chat_light(base, messages, max_tokens, ignore_eos=False):
    """As `stream_chat`, read with a bare socket and no JSON parsing: on a
    2-core machine httpx and a JSON parse per chunk in 8 client threads take
    CPU from the server being measured. Times the first chunk with text and
    the finish chunk, and takes the token count from the usage chunk."""
    import http.client
    host, port = base.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos})
    c = http.client.HTTPConnection(host, int(port), timeout=1800)
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{base}: HTTP {r.status}: {r.read()[:300]!r}")
    first = last = None
    tail = b""
    while True:
        b = r.read1(65536)
        if not b:
            break
        now = time.perf_counter()
        if first is None and b'"delta":{"content":"' in b:
            first = now
        # The finish chunk marks the last token (special tokens carry no text).
        if b'"finish_reason":"' in b:
            last = now
        tail = (tail + b)[-4096:]
    found = re.search(rb'"completion_tokens":(\d+)', tail)
    if first is None or last is None or not found:
        raise RuntimeError(f"{base}: the stream produced no text, no finish or no usage")
    return {"first": first, "last": last, "tokens": int(found.group(1))}


def decode_case(base, streams, gen, salt, light=False):
    """Aggregate decode tok/s of `streams` concurrent streams (different short
    prompts); `light` reads them with the bare-socket client."""
    barrier = threading.Barrier(streams)
    results, errors = [None] * streams, []

    def one(i):
        messages = [{"role": "user", "content": f"{salt} Write a long story about a {WORDS[i % len(WORDS)]} "
                                                f"and the number {i}."}]
        try:
            barrier.wait()
            results[i] = (stream_chat_light if light else stream_chat)(base, messages, gen, ignore_eos=True)
        except Exception as e:  # reported after the join, with the others' results
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    span = max(r["last"] for r in results) - min(r["first"] for r in results)
    decoded = sum(r["tokens"] - 1 for r in results)
    short = [r["tokens"] for r in results if r["tokens"] != gen]
    if short:
        print(f"  warning: {len(short)} stream(s) ended early ({short} tokens, asked {gen}): ignore_eos ignored?",
              file=sys.stderr)
    return decoded / span if span > 0 else float("nan")


def run_engine(name, argv, args, rnd, raw_dir):
    port = int(argv[argv.index("--port") + 1])
    srv = Server(name, argv, port, os.path.join(raw_dir, f"{name}.{rnd}.log"))
    try:
        stream_chat(srv.base, [{"role": "user", "content": "Hello."}], 4)  # warm-up
        salt = f"Round-{rnd}-{random.randrange(16**8):08x}."
        out = prefix_case(srv.base, salt, args.prefix_lines, args.turn_tokens)
        out["decode_1_tok_s"] = decode_case(srv.base, 1, args.gen, salt)
        out[f"decode_{args.streams}_tok_s"] = decode_case(srv.base, args.streams, args.gen, salt)
        out["batch_scaling"] = out[f"decode_{args.streams}_tok_s"] / out["decode_1_tok_s"]
        return out
    finally:
        srv.stop()


# --- report ---------------------------------------------------------------------


def medians(runs):
    keys = runs[0].keys() if runs else []
    return {k: statistics.median(r[k] for r in runs) for k in keys
            if all(isinstance(r[k], (int, float)) for r in runs)}


def report(med, args):
    s, ll = med.get("shardlm", {}), med.get("llama-server", {})
    n = args.streams

    def cell(d, k, fmt):
        return fmt.format(d[k]) if k in d else "-"

    rows = [
        ("TTFT turn 1 (ms)", "ttft_first_s", "{:.0f}", 1000, ""),
        ("TTFT turn 2 (ms)", "ttft_second_s", "{:.0f}", 1000, ""),
        ("turn 2 / turn 1", "ttft_ratio", "{:.3f}", 1, f"≤ {TARGETS['ttft_ratio_max']}"),
        ("decode, 1 stream (tok/s)", "decode_1_tok_s", "{:.1f}", 1, ""),
        (f"decode, {n} streams (tok/s)", f"decode_{n}_tok_s", "{:.1f}", 1, ""),
        (f"{n} streams / 1 stream", "batch_scaling", "{:.2f}", 1, f"≥ {TARGETS['batch_scaling_min']}"),
    ]
    print(f"\nmedians of {args.rounds} round(s); prompt of turn 1: {s.get('prompt_tokens_first', '?')} tokens "
          f"(shardlm), {args.gen} tokens a decode stream, {args.threads} threads, context {args.context}\n")
    print("| metric | shardlm | llama-server | target |")
    print("|---|---:|---:|---|")
    for label, key, fmt, scale, target in rows:
        sc = {key: s[key] * scale} if key in s else {}
        lc = {key: ll[key] * scale} if key in ll else {}
        print(f"| {label} | {cell(sc, key, fmt)} | {cell(lc, key, fmt)} | {target} |")
    vs = None
    if f"decode_{n}_tok_s" in s and f"decode_{n}_tok_s" in ll:
        vs = s[f"decode_{n}_tok_s"] / ll[f"decode_{n}_tok_s"]
        print(f"| shardlm / llama-server, {n} streams | {vs:.2f} | | ≥ {TARGETS['vs_llama_min']} |")
    checks = {}
    if "ttft_ratio" in s:
        checks["ttft_ratio"] = s["ttft_ratio"] <= TARGETS["ttft_ratio_max"]
    if "batch_scaling" in s:
        checks["batch_scaling"] = s["batch_scaling"] >= TARGETS["batch_scaling_min"]
    if vs is not None:
        checks["vs_llama"] = vs >= TARGETS["vs_llama_min"]
    print("\ntargets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in checks.items()))
    return vs, checks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--context", type=int, default=4096, help="tokens per sequence (both servers)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prefix-lines", type=int, default=54, help="lines of the conversation's file (54 ≈ 2,000 tokens)")
    ap.add_argument("--turn-tokens", type=int, default=16, help="max_tokens of each conversation turn")
    ap.add_argument("--gen", type=int, default=128, help="tokens per decode stream")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--no-llama", action="store_true", help="shardlm only")
    ap.add_argument("--json", help="write the rounds and medians here")
    ap.add_argument("--raw", help="directory for server logs (default: a temporary one)")
    ap.add_argument("--shardlm-args", default="", help="extra `shardlm serve` flags")
    ap.add_argument("--llama-args", default="", help="extra llama-server flags")
    args = ap.parse_args()
    args.shardlm = os.environ.get("SHARDLM", os.path.join(ROOT, "target", "release", "shardlm"))
    if not os.access(args.shardlm, os.X_OK):
        sys.exit(f"no shardlm binary at {args.shardlm} (cargo build --release -p shardlm, or set SHARDLM)")
    if not os.path.exists(args.model):
        sys.exit(f"no model at {args.model} (`shardlm run` fetches the default one)")
    args.llama_server = None if args.no_llama else find_llama_server()
    raw = args.raw or subprocess.run(["mktemp", "-d", "/tmp/bench-serve-batch.XXXXXX"], stdout=subprocess.PIPE,
                                     text=True, check=True).stdout.strip()
    os.makedirs(raw, exist_ok=True)
    print(f"server logs in {raw}", file=sys.stderr)
    engines = [("shardlm", shardlm_argv)] + ([] if args.no_llama else [("llama-server", llama_argv)])
    runs = {name: [] for name, _ in engines}
    load_before = open("/proc/loadavg").read().split()[:3]
    for rnd in range(1, args.rounds + 1):
        # A B A B: slow drift of a shared machine hits both alike.
        for name, argv in engines:
            print(f"round {rnd}/{args.rounds}: {name} (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
            runs[name].append(run_engine(name, argv(args, free_port()), args, rnd, raw))
            print("  " + json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                     for k, v in runs[name][-1].items()}), file=sys.stderr)
    med = {name: medians(r) for name, r in runs.items()}
    vs, checks = report(med, args)
    if args.json:
        env = {"commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                                        text=True).stdout.strip(),
               "cores": os.cpu_count(), "load_before": load_before,
               "load_after": open("/proc/loadavg").read().split()[:3],
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "shardlm": args.shardlm, "llama_server": args.llama_server, "model": args.model}
        params = {k: getattr(args, k) for k in ("rounds", "threads", "context", "prefix_lines", "turn_tokens", "gen",
                                                "streams", "shardlm_args", "llama_args")}
        with open(args.json, "w") as fh:
            json.dump({"env": env, "params": params, "targets": TARGETS, "rounds": runs, "median": med,
                       "shardlm_over_llama": vs, "targets_met": checks}, fh, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
