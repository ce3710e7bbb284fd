#!/usr/bin/env python3
"""TTFT of a coding agent's first request: shardlm serve vs llama-server.

Claude Code's first request (measured, issue 10) carries a ~28K-character
system prompt and 12 tools with ~48K characters of descriptions and schemas:
about 20K tokens. This builds a request of that size and shape from the repo's
own docs (system text, tool descriptions), sends it once to each server
(`/v1/chat/completions`, streamed, greedy, 8 tokens; `--context 32768` with
YaRN rope scaling on both), alternating A B for `--rounds`, and prints each
TTFT and the prompt size each server counted.

Usage: scripts/bench-agent-ttft.py [--rounds 1] [--threads 2] [--json PATH]
"""

import argparse
import importlib.util
import json
import os
import statistics
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("bsb", os.path.join(ROOT, "scripts", "bench-serve-batch.py"))
bsb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bsb)


def docs_text():
    parts = []
    for name in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if name.endswith(".md"):
            with open(os.path.join(ROOT, "docs", name)) as f:
                parts.append(f.read())
    return "\n".join(parts)


def agent_request(system_chars=28_000, tool_chars=48_000, n_tools=12, tools_as_text=True):
    text = docs_text()
    system = "You are an interactive coding agent.\n" + text[:system_chars]
    per_tool = tool_chars // n_tools
    tools = []
    for i in range(n_tools):
        desc = text[system_chars + i * per_tool: system_chars + (i + 1) * per_tool - 400]
        tools.append({"type": "function", "function": {
            "name": f"tool_{i}", "description": desc,
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "An absolute path."},
                "pattern": {"type": "string", "description": "What to look for."},
                "limit": {"type": "integer", "description": "At most this many results."}},
                "required": ["path"]}}})
    if tools_as_text:
        # The same bytes for both servers: llama-server renders `tools` only
        # with --jinja and a tool-aware template (SmolLM2's is not), and would
        # otherwise drop them and prefill a third of the prompt.
        system += "\n\n# Tools\n" + "\n".join(json.dumps(t["function"]) for t in tools)
        tools = []
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "The test in tests/test_cli.py fails. Find out why and fix it."}]
    return messages, tools


def ttft(base, messages, tools):
    import httpx
    import time
    body = {"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if tools:
        body["tools"] = tools
    sent = time.perf_counter()
    first, usage = None, None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=3600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if first is None and any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get(
                        "tool_calls") for c in chunk.get("choices") or []):
                    first = time.perf_counter() - sent
    total = time.perf_counter() - sent
    return {"ttft_s": first if first is not None else total, "prompt_tokens": (usage or {}).get("prompt_tokens")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=bsb.DEFAULT_MODEL)
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "target", "release", "shardlm"))
    ap.add_argument("--json")
    ap.add_argument("--chars", type=int, default=54_000,
                    help="characters of system prompt plus tool text (54K: about 20K SmolLM2 tokens)")
    a = ap.parse_args()
    llama = bsb.find_llama_server()
    messages, tools = agent_request(system_chars=a.chars * 28 // 76, tool_chars=a.chars * 48 // 76)
    logs = tempfile.mkdtemp(prefix="bench-agent-ttft.")
    print(f"server logs in {logs}")
    runs = {"shardlm": [], "llama-server": []}
    for r in range(a.rounds):
        for name in ("shardlm", "llama-server"):
            port = bsb.free_port()
            if name == "shardlm":
                argv = [a.shardlm, "serve", "--model", a.model, "--port", str(port), "--threads", str(a.threads),
                        "--context", "32768", "--rope-scaling", "yarn"]
            else:
                argv = [llama, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads),
                        "-tb", str(a.threads), "-np", "1", "-c", "32768", "--rope-scaling", "yarn",
                        "--rope-scale", "4", "--yarn-orig-ctx", "8192"]
            srv = bsb.Server(name, argv, port, os.path.join(logs, f"{name}-{r}.log"))
            try:
                res = ttft(srv.base, messages, tools)
            finally:
                srv.stop()
            print(f"round {r + 1}: {name}: TTFT {res['ttft_s']:.1f} s, {res['prompt_tokens']} prompt tokens",
                  flush=True)
            runs[name].append(res)
    med = {k: statistics.median(x["ttft_s"] for x in v) for k, v in runs.items()}
    print(f"\nmedian TTFT: shardlm {med['shardlm']:.1f} s, llama-server {med['llama-server']:.1f} s, "
          f"shardlm / llama-server {med['shardlm'] / med['llama-server']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "median_ttft_s": med}, f, indent=1)


if __name__ == "__main__":
    main()
