#!/usr/bin/env python3
"""An agent's next turn after a long reply: how much of its prompt the prefix
cache serves, and its TTFT.

Since the prefix cache keeps only prompt rows (docs/ARCHITECTURE.md, "Only
prompt rows are cached; replies are re-warmed"), `serve` re-warms a finished
reply's blocks as prompt rows while idle. Each round: a ~1,400-token turn
answered with REPLY tokens (greedy, streamed), PAUSE seconds (an agent's tool
call), then the next turn (the reply plus a question), streamed; prints the
next turn's cached/prompt tokens and TTFT per binary, the binaries
alternating A B per round, each on a fresh `serve` (tests/server/conftest.py).

Usage: scripts/bench-rewarm.py --bins OLD NEW [--pause 3] [--reply 300] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import httpx  # noqa: E402
from conftest import API_KEY, start_server, stop_server  # noqa: E402
from test_serving import GREEDY, conversation  # noqa: E402

H = {"Authorization": f"Bearer {API_KEY}"}


def stream(srv, messages, n):
    """(TTFT s, text, cached tokens, prompt tokens) of one streamed chat turn."""
    body = {"model": "m", "messages": messages, "max_tokens": n, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **GREEDY}
    t0, first, text, usage = time.time(), None, [], None
    with httpx.stream("POST", srv.base + "/v1/chat/completions", json=body, headers=H, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            d = json.loads(line[5:])
            usage = d.get("usage") or usage
            for c in d.get("choices", []):
                if c["delta"].get("content"):
                    first = first or time.time() - t0
                    text.append(c["delta"]["content"])
    return first, "".join(text), usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bins", nargs="+", required=True)
    ap.add_argument("--pause", type=float, default=3.0)
    ap.add_argument("--reply", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = {b: [] for b in a.bins}
    for r in range(a.rounds):
        for b in a.bins:
            os.environ["SHARDLM_BIN"] = b
            srv = start_server()
            try:
                msgs = conversation(f"Session-{r}-{os.getpid()}.", lines=30)  # the same turn for every binary
                _, text, _, _ = stream(srv, msgs, a.reply)
                time.sleep(a.pause)
                msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "And line 5?"}]
                ttft, _, cached, prompt = stream(srv, msgs, 8)
            finally:
                stop_server(srv)
            rows[b].append((ttft, cached, prompt))
            print(f"round {r} {b}: next turn TTFT {ttft:.3f} s, cached {cached} of {prompt}", flush=True)
    for b, v in rows.items():
        print(f"{b}: median TTFT {statistics.median(x[0] for x in v):.3f} s, "
              f"median cached share {statistics.median(x[1] / x[2] for x in v):.3f}")


if __name__ == "__main__":
    main()
