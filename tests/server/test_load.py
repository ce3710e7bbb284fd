"""Concurrency, cancellation, SSE keep-alive and metrics."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = [{"role": "user", "content": "Name a color."}]


def wait_idle(server, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m["shardlm_active_requests"] == 0 and m["shardlm_queue_depth"] == 0:
            return m
        time.sleep(0.1)
    raise AssertionError(f"server not idle: {server.metrics()}")


@pytest.mark.skipif(os.environ.get("SHARDLM_SKIP_HEAVY") == "1", reason="SHARDLM_SKIP_HEAVY")
def test_16_streaming_clients_x_10_requests(oai, server):
    ref = oai.chat.completions.create(model="m", messages=PROMPT, max_tokens=4, temperature=0).choices[0].message.content
    before = server.metrics()["shardlm_requests_total"]

    def client(i):
        texts = []
        for _ in range(10):
            stream = oai.chat.completions.create(model="m", messages=PROMPT, max_tokens=4, temperature=0, stream=True)
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        return texts

    with ThreadPoolExecutor(16) as pool:
        results = [t for texts in pool.map(client, range(16)) for t in texts]
    assert len(results) == 160
    assert all(t == ref for t in results), set(results)
    m = wait_idle(server)
    assert m["shardlm_requests_total"] - before == 160


def test_disconnect_cancels_and_active_returns_to_zero(server):
    before = server.metrics()["shardlm_requests_cancelled_total"]
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 3000, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, headers=H, timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                seen += 1
            if seen >= 3:
                # Measured while the stream is open (leaving the loop may close it).
                active = server.metrics()["shardlm_active_requests"]
                break
        assert active >= 1
    m = wait_idle(server)
    assert m["shardlm_requests_cancelled_total"] == before + 1


def test_keep_alive_comments_during_long_prefill(server):
    long = "The quick brown fox jumps over the lazy dog. " * 100  # about 1000 tokens
    body = {"model": "m", "messages": [{"role": "user", "content": long}], "max_tokens": 2, "stream": True}
    comments_before_content = 0
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, headers=H, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(":"):
                comments_before_content += 1
            elif line.startswith("data:") and '"content":""' not in line.replace(" ", ""):
                break
    assert comments_before_content >= 1


@pytest.mark.smoke
def test_metrics_and_health(server, oai):
    oai.chat.completions.create(model="m", messages=PROMPT, max_tokens=3, temperature=0)
    text = httpx.get(server.base + "/metrics").text
    for name in ["shardlm_requests_total", "shardlm_generation_tokens_total", "shardlm_queue_depth",
                 "shardlm_active_requests", "shardlm_time_to_first_token_seconds_bucket",
                 "shardlm_inter_token_latency_seconds_bucket", "shardlm_kv_blocks_used",
                 "shardlm_prefix_cache_hits_total"]:
        assert name in text, name
    assert server.metrics()["shardlm_time_to_first_token_seconds_count"] >= 1
    h = httpx.get(server.base + "/health").json()
    assert h["status"] == "ready" and all(r["state"] == "ready" for r in h["ranks"])
