#!/usr/bin/env python3
"""The disk tier of the prefix cache (issue 31): TTFT of a conversation's next
turn after a server restart with `--kv-disk`, against the same turn on a cold
server (no disk tier), alternating A B A B; and the disk tier's read
throughput while loading, against `dd` reading the same files.

  scripts/bench-kv-disk.py --model smollm2-135m --tokens 2000 --rounds 3
  scripts/bench-kv-disk.py --model gemma3-270m --tokens 20000 --rounds 2

Prints one line per measurement and a summary; --json writes it all."""

import argparse
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "server"))
import conftest  # noqa: E402
from conftest import start_server, stop_server  # noqa: E402
import openai  # noqa: E402


def conversation(tokens, salt):
    rng = random.Random(salt)
    words = "alpha beta gamma delta omega river stone lamp cloud north copper violet engine garden".split()
    lines = []
    for i in range(1, max(2, tokens // 34)):
        a, b, c = rng.sample(words, 3)
        lines.append(f"{i:05d}    {a}_{i} = compute_{b}(items[{rng.randrange(1000)}], "
                     f"factor={rng.random():.3f})  # {c} step {rng.randrange(100)}")
    return [{"role": "system", "content": f"{salt} You review code and answer briefly."},
            {"role": "user", "content": "Here is a file:\n\n" + "\n".join(lines) + "\n\nWhat does line 3 do?"}]


def ttft(srv, messages, max_tokens=8):
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key=conftest.API_KEY, max_retries=0, timeout=3600)
    t0 = time.time()
    first, text, usage = None, "", None
    for ch in c.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0,
                                        stream=True, stream_options={"include_usage": True}):
        if ch.choices and ch.choices[0].delta.content:
            first = first or time.time() - t0
            text += ch.choices[0].delta.content
        if ch.usage:
            usage = ch.usage
    return first, text, usage


def drop_from_page_cache(files):
    """Writes dirty pages back, then asks the kernel to drop the files' pages
    (posix_fadvise DONTNEED: no root needed), so the next read comes from disk."""
    os.sync()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def dd_direct(directory, mb=256):
    """The disk's own sequential read figure: `dd` of a fresh file with O_DIRECT, MB/s."""
    path = os.path.join(directory, "dd-probe.bin")
    subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={mb}", "conv=fdatasync"],
                   check=True, capture_output=True)
    out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M", "iflag=direct"],
                         check=True, capture_output=True, text=True).stderr
    os.remove(path)
    # "268435456 bytes (268 MB, 256 MiB) copied, 0.8 s, 335 MB/s"
    secs = float(out.strip().splitlines()[-1].split(",")[-2].split()[0])
    return mb * (1 << 20) / secs / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-args", default="", help="extra flags for every server")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--warm-cache", action="store_true",
                    help="leave the block files in the page cache (default: drop them, so loads read the disk)")
    a = ap.parse_args()
    os.environ["SHARDLM_SERVE_ARGS"] = f"--model {a.model} {a.serve_args}"
    rows = []
    for r in range(a.rounds):
        salt = f"Round-{r}-{random.randrange(16**8):08x}."
        msgs = conversation(a.tokens, salt)
        with tempfile.TemporaryDirectory(dir=os.environ.get("KV_DISK_BENCH_DIR")) as d:
            # B first on odd rounds, so neither always runs on a warmer machine.
            order = ["cold", "disk"] if r % 2 == 0 else ["disk", "cold"]
            got = {}
            for which in order:
                if which == "cold":
                    srv = start_server()
                    t1, reply, _ = ttft(srv, msgs)
                    turn2 = msgs + [{"role": "assistant", "content": reply},
                                    {"role": "user", "content": "And line 5?"}]
                    stop_server(srv)
                    srv = start_server()
                    t, text, usage = ttft(srv, turn2)
                    stop_server(srv)
                    got["cold"] = (t, text, usage)
                else:
                    srv = start_server("--kv-disk", d)
                    t1, reply, _ = ttft(srv, msgs)
                    stop_server(srv)
                    turn2 = msgs + [{"role": "assistant", "content": reply},
                                    {"role": "user", "content": "And line 5?"}]
                    if not a.warm_cache:
                        drop_from_page_cache(glob.glob(os.path.join(d, "*", "*.kvb")))
                    srv = start_server("--kv-disk", d)
                    t, text, usage = ttft(srv, turn2)
                    m = srv.metrics()
                    stop_server(srv)
                    secs = m.get("shardlm_kv_disk_load_microseconds_total", 0) / 1e6
                    mbs = m.get("shardlm_kv_disk_bytes_read_total", 0) / 1e6 / secs if secs else 0.0
                    got["disk"] = (t, text, usage, mbs, dd_direct(d))
            (tc, text_c, uc), (tw, text_w, uw, mbs, dd) = got["cold"], got["disk"]
            row = {"round": r, "prompt_tokens": uw.prompt_tokens,
                   "cached_tokens": uw.prompt_tokens_details.cached_tokens,
                   "ttft_cold_s": tc, "ttft_restart_s": tw, "ratio": tw / tc,
                   "same_text": text_c == text_w, "load_mb_s": mbs, "dd_mb_s": dd}
            rows.append(row)
            print(f"round {r}: prompt {row['prompt_tokens']} tokens, {row['cached_tokens']} from disk; "
                  f"TTFT cold {tc:.3f} s, after restart {tw:.3f} s: {tw / tc:.3f}x; same text {row['same_text']}; "
                  f"load {mbs:.0f} MB/s, dd O_DIRECT {dd:.0f} MB/s", flush=True)
    med = statistics.median(x["ratio"] for x in rows)
    print(f"median TTFT after restart / cold: {med:.3f}x over {len(rows)} rounds ({a.model}, {a.tokens} tokens)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "tokens": a.tokens, "rows": rows, "median_ratio": med}, f, indent=1)


if __name__ == "__main__":
    main()
