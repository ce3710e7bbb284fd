#!/usr/bin/env python3
"""Soak: many concurrent streams against `shardlm serve --ranks 2` for a long
while, with rank 1 killed (kill -9) every few minutes. Not run in CI.

    scripts/soak.py [--minutes 10] [--streams 32] [--kill-every 120]
                    [--baseline-minutes M] [--strategy pipeline] [--backend auto]
                    [--max-tokens 64] [--bin target/release/shardlm] [--json OUT]

First a failure-free soak of --baseline-minutes (default: --minutes; 0 skips
it) measures the TTFT to compare with; then the soak with kills. Each of the
--streams clients sends greedy streamed chat requests (temperature 0,
`ignore_eos`, --max-tokens), one after the other, each bounded in time
(--request-limit s), over a fixed set of prompts whose uninterrupted greedy
texts are taken from single requests before the soak starts.

Reported (and checked, exit status 1 if one fails):
  - requests lost: 0 (an HTTP error, an error event, a stream that ended
    without its finish reason, or a client time-out) and each completed
    request's text identical to its prompt's uninterrupted greedy text;
  - rank 0's RSS drift from minute 2 to the end: at most 5%
    (median of the samples of the first and of the last 30 s of that span);
  - the p99 TTFT of requests that met no failure (their time did not overlap
    a kill and the re-forming that followed) within 1.5x that of the
    failure-free soak.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
KEY = "soak-key"
PROMPTS = [
    "Write a long story about a dragon.",
    "Explain how a steam engine works.",
    "List some facts about the moon.",
    "Describe a walk through a forest in autumn.",
    "What is the capital of France, and why is it famous?",
    "Tell me about the history of the bicycle.",
    "Write a poem about the sea.",
    "How do plants make their food?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def p99(xs):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


class Server:
    def __init__(self, a, tag):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(ROOT, "target", f"soak-{tag}-{self.port}.log")
        self.log = open(self.log_path, "w")
        args = [a.bin, "serve", "--ranks", "2", "--strategy", a.strategy, "--backend", a.backend,
                "--port", str(self.port), "--api-key", KEY, "--served-model-name", "soak",
                "--sse-keepalive-ms", "1000"]
        if a.model:
            args += ["--model", a.model]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"soak: shardlm serve exited with {self.proc.returncode} at start-up; see {self.log_path}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                sys.exit(f"soak: shardlm serve not healthy after 300 s; see {self.log_path}")
            time.sleep(0.3)

    def rank_pid(self, rank):
        """The launcher's child with SHARDLM_RANK=rank, or None."""
        try:
            kids = open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read().split()
        except OSError:
            return None
        for k in kids:
            try:
                env = open(f"/proc/{k}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if f"SHARDLM_RANK={rank}".encode() in env:
                return int(k)
        return None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def stream(base, prompt, a):
    """One greedy stream: (text, ttft s or None, error or None)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": a.max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    text, ttft, finish = "", None, None
    t0 = time.time()
    try:
        with httpx.stream("POST", base + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"},
                          timeout=httpx.Timeout(a.request_limit)) as r:
            if r.status_code != 200:
                return text, ttft, f"HTTP {r.status_code}: {r.read()[:200]!r}"
            for line in r.iter_lines():
                if time.time() - t0 > a.request_limit:
                    return text, ttft, f"no end within {a.request_limit} s"
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    return text, ttft, f"error event: {ev['error']}"
                for ch in ev.get("choices", []):
                    piece = ch.get("delta", {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = time.time() - t0
                        text += piece
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
    except (httpx.HTTPError, OSError, ValueError) as e:
        return text, ttft, f"{type(e).__name__}: {e}"
    if finish is None:
        return text, ttft, "the stream ended without a finish reason"
    return text, ttft, None


def references(base, a):
    refs = {}
    for p in PROMPTS:
        text, _, err = stream(base, p, a)
        if err:
            sys.exit(f"soak: reference request failed: {err}")
        refs[p] = text
    return refs


def soak(a, minutes, kills, tag):
    srv = Server(a, tag)
    try:
        refs = references(srv.base, a)
        results, lock = [], threading.Lock()
        kill_times, outages, rss = [], [], []
        stop = threading.Event()
        t_start = time.time()
        t_end = t_start + minutes * 60

        def client(i):
            n = i
            while time.time() < t_end:
                p = PROMPTS[n % len(PROMPTS)]
                n += a.streams
                s = time.time()
                text, ttft, err = stream(srv.base, p, a)
                with lock:
                    results.append({"start": s, "end": time.time(), "ttft": ttft, "err": err,
                                    "same": err is None and text == refs[p]})

        def monitor():
            down = None
            r0 = srv.rank_pid(0)
            next_rss = time.time()
            while not stop.is_set():
                try:
                    ok = httpx.get(srv.base + "/health", timeout=5).status_code == 200
                except httpx.HTTPError:
                    ok = False
                now = time.time()
                if not ok and down is None:
                    down = now
                if ok and down is not None:
                    outages.append((down, now))
                    down = None
                if now >= next_rss and r0:
                    try:
                        for line in open(f"/proc/{r0}/status"):
                            if line.startswith("VmRSS:"):
                                rss.append((now - t_start, int(line.split()[1]) * 1024))
                    except OSError:
                        pass
                    next_rss = now + 5
                time.sleep(0.25)
            if down is not None:
                outages.append((down, time.time()))

        def killer():
            k = 1
            while not stop.wait(max(0.0, t_start + k * a.kill_every - time.time())):
                if t_start + k * a.kill_every >= t_end:
                    return
                pid = srv.rank_pid(1)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    kill_times.append(time.time())
                    print(f"soak: {time.time() - t_start:6.0f} s: killed rank 1 (pid {pid})", flush=True)
                k += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.streams)]
        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        kt = threading.Thread(target=killer, daemon=True) if kills else None
        if kt:
            kt.start()
        for t in threads:
            t.start()
        last = time.time()
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            if time.time() - last >= 60:
                last = time.time()
                with lock:
                    done = len(results)
                print(f"soak: {last - t_start:6.0f} s: {done} requests done", flush=True)
        stop.set()
        mon.join()
        if kt:
            kt.join()
        alive = srv.proc.poll() is None
    finally:
        srv.stop()
    # A request met a failure if its time overlaps a kill and the re-forming
    # after it (until /health was ready again; at least 1 s after the kill).
    spans = [(k, max([e for d, e in outages if e >= k] or [k + 1.0])) for k in kill_times]
    spans += [(d, e) for d, e in outages]

    def met_failure(r):
        return any(r["start"] <= e and r["end"] >= s for s, e in spans)

    clean = [r for r in results if not met_failure(r)]
    hit = [r for r in results if met_failure(r)]
    window = [b for t, b in rss if t >= 120]
    rss_a = statistics.median([b for t, b in rss if 120 <= t < 150] or window[:1] or [0])
    rss_b = statistics.median([b for t, b in rss if t >= rss[-1][0] - 30] or [0]) if rss else 0
    return {
        "minutes": minutes,
        "streams": a.streams,
        "kills": len(kill_times),
        "server_alive": alive,
        "requests": len(results),
        "lost": [r["err"] for r in results if r["err"]],
        "different": sum(1 for r in results if r["err"] is None and not r["same"]),
        "different_after_failure": sum(1 for r in hit if r["err"] is None and not r["same"]),
        "met_failure": len(hit),
        "p99_ttft_clean": p99([r["ttft"] for r in clean if r["ttft"] is not None]),
        "p50_ttft_clean": statistics.median([r["ttft"] for r in clean if r["ttft"] is not None] or [float("nan")]),
        "rss_minute_2": rss_a,
        "rss_end": rss_b,
        "rss_drift": (rss_b - rss_a) / rss_a if rss_a else float("nan"),
        # The minute-2 window opens with the first kill, when the KV pool is
        # mapped afresh and not yet touched: the plateau in the 30 s before
        # each kill (and at the end) compares like with like.
        "rss_before_kills": [statistics.median([b for t, b in rss if k - 30 <= t + t_start < k] or [0])
                             for k in kill_times] + [rss_b],
        "rss_series": [(round(t), b) for t, b in rss],
        "outages_s": [round(e - d, 1) for d, e in outages],
        "log": srv.log_path,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--baseline-minutes", type=float, default=None,
                    help="length of the failure-free soak (default: --minutes; 0 skips it)")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--kill-every", type=float, default=120, help="seconds between kills of rank 1")
    ap.add_argument("--strategy", default="pipeline")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--request-limit", type=float, default=300, help="seconds a request may take")
    ap.add_argument("--bin", default=os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "target", "release", "shardlm")))
    ap.add_argument("--json", default=None, help="write the results here too")
    a = ap.parse_args()
    base_minutes = a.minutes if a.baseline_minutes is None else a.baseline_minutes
    out = {"command": " ".join(sys.argv), "load_before": os.getloadavg()}
    if base_minutes > 0:
        print(f"soak: failure-free soak, {base_minutes} min", flush=True)
        out["baseline"] = soak(a, base_minutes, False, "base")
    print(f"soak: soak with rank 1 killed every {a.kill_every:.0f} s, {a.minutes} min", flush=True)
    out["soak"] = soak(a, a.minutes, True, "kill")
    out["load_after"] = os.getloadavg()
    s = out["soak"]
    checks = {
        "0 requests lost": not s["lost"],
        "completed requests identical to their greedy text": s["different"] == 0,
        "server stayed up": s["server_alive"],
    }
    if a.minutes > 2.5:
        checks["rank 0 RSS drift <= 5% from minute 2"] = abs(s["rss_drift"]) <= 0.05
    if "baseline" in out:
        ratio = s["p99_ttft_clean"] / out["baseline"]["p99_ttft_clean"]
        out["p99_ttft_ratio"] = ratio
        checks["p99 TTFT (no failure met) <= 1.5x failure-free"] = ratio <= 1.5
    out["checks"] = checks
    print(json.dumps(out, indent=2, default=str))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    for name, ok in checks.items():
        print(f"soak: {'ok  ' if ok else 'FAIL'} {name}")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
