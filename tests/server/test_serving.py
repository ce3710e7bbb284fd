"""The serving engine: prefix cache, batching, cancellation and KV pressure.

Written against the batching engine (paged KV cache, prefix cache, continuous
batching): the prefix-cache and KV-block assertions fail on the serial worker,
which caches nothing and reports no KV blocks.
"""

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}
GREEDY = {"temperature": 0}
# Also on the tests that start a second server: they run once, on the single process.
HEAVY = pytest.mark.skipif(os.environ.get("SHARDLM_SKIP_HEAVY") == "1", reason="SHARDLM_SKIP_HEAVY")
# SmolLM2-135M: 30 layers × (K and V) × 3 KV heads × 64 × 2 bytes (f16).
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2

WORDS = ("alpha beta gamma delta omega river stone lamp cloud north south copper violet engine "
         "garden window signal parcel ledger harbor").split()


def code_file(salt, lines):
    """Varied numbered lines of a made-up Python file (about 36 tokens a line), so
    tokens do not repeat in a pattern a cache or tokenizer could shortcut."""
    rng = random.Random(salt)
    out = []
    for i in range(1, lines + 1):
        a, b, c = rng.sample(WORDS, 3)
        out.append(f"{i:04d}    {a}_{i} = compute_{b}(items[{rng.randrange(1000)}], "
                   f"factor={rng.random():.3f})  # {c} step {rng.randrange(100)}")
    return "\n".join(out)


def system_prompt(salt):
    return f"{salt} You are a careful code reviewer. Answer briefly and refer to line numbers."


def conversation(salt, lines=54):
    """System prompt + one long user turn: about 2,000 prompt tokens at 54 lines."""
    return [{"role": "system", "content": system_prompt(salt)},
            {"role": "user", "content": "Here is a file:\n\n" + code_file(salt, lines) + "\n\nWhat does line 3 do?"}]


def salt():
    return f"Session-{random.randrange(16**8):08x}."


def chat(oai, messages, max_tokens=16, **kw):
    return oai.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, **GREEDY, **kw)


def block_size(server):
    """Tokens per KV block as the server reports it (32 before the paged cache reports one)."""
    return int(server.metrics().get("shardlm_kv_block_size_tokens", 0)) or 32


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# --- prefix cache -------------------------------------------------------------


def test_prefix_cache_second_turn_openai(oai):
    messages = conversation(salt())
    first = chat(oai, messages)
    assert 1500 <= first.usage.prompt_tokens <= 2500, first.usage
    reply = first.choices[0].message.content
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And line 5?"}]
    second = chat(oai, messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.95 * first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
    assert cached < second.usage.prompt_tokens
    # The streamed usage reports the same cache hit (the whole second prompt is cached by now).
    chunks = list(chat(oai, messages, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens == second.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0.95 * second.usage.prompt_tokens
    # And the Responses API, rendering the same conversation, reports it as input_tokens_details.
    resp = oai.responses.create(model="m", instructions=messages[0]["content"], input=messages[1:],
                                max_output_tokens=16, temperature=0)
    assert resp.usage.input_tokens == second.usage.prompt_tokens
    assert resp.usage.input_tokens_details.cached_tokens >= 0.95 * resp.usage.input_tokens


def test_prefix_cache_second_turn_anthropic(claude):
    s = salt()
    # Half the OpenAI test's size: the same path, half the cold prefill time.
    user = conversation(s, lines=27)[1]["content"]
    first = claude.messages.create(model="c", max_tokens=16, system=system_prompt(s), extra_body=GREEDY,
                                   messages=[{"role": "user", "content": user}])
    first_total = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": first.content[0].text},
                {"role": "user", "content": "And line 5?"}]
    second = claude.messages.create(model="c", max_tokens=16, system=system_prompt(s), extra_body=GREEDY,
                                    messages=messages)
    u = second.usage
    # Anthropic's convention: the prompt is input_tokens + cache_read_input_tokens (no cache writes here).
    total = claude.messages.count_tokens(model="c", system=system_prompt(s), messages=messages).input_tokens
    assert u.input_tokens + u.cache_read_input_tokens + (u.cache_creation_input_tokens or 0) == total
    assert u.cache_read_input_tokens >= 0.95 * first_total, (u, first_total)
    # Streamed: message_delta carries the final split, which the SDK folds into the message.
    with claude.messages.stream(model="c", max_tokens=16, system=system_prompt(s), extra_body=GREEDY,
                                messages=messages) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == total
    assert final.usage.cache_read_input_tokens >= 0.95 * total


def test_changed_head_is_not_served_from_cache(oai, server):
    """A prompt that differs in its first words shares no block with the cached one,
    and the cached rerun of the first prompt gives the cold run's text."""
    s = salt()
    x = conversation(s, lines=15)
    y = [{"role": "system", "content": "Different" + system_prompt(s)}, x[1]]
    cold = chat(oai, x, max_tokens=24)
    variant = chat(oai, y, max_tokens=24)
    assert variant.usage.prompt_tokens_details.cached_tokens <= 32, variant.usage
    rerun = chat(oai, x, max_tokens=24)
    assert rerun.usage.prompt_tokens_details.cached_tokens >= cold.usage.prompt_tokens - 2 * block_size(server)
    assert rerun.choices[0].message.content == cold.choices[0].message.content


# --- equality under caching and batching ---------------------------------------


def test_cached_rerun_equals_cold_run(oai, server):
    messages = conversation(salt(), lines=12)
    cold = chat(oai, messages, max_tokens=32)
    warm = chat(oai, messages, max_tokens=32)
    assert cold.usage.prompt_tokens == warm.usage.prompt_tokens
    assert warm.usage.prompt_tokens_details.cached_tokens >= cold.usage.prompt_tokens - 2 * block_size(server)
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert warm.choices[0].finish_reason == cold.choices[0].finish_reason


def test_alone_equals_batched_with_seven_others(oai):
    target = [{"role": "user", "content": "List three uses of copper, one per line."}]
    alone = chat(oai, target, max_tokens=32).choices[0].message.content
    started = threading.Event()

    def other(i):
        stream = oai.chat.completions.create(
            model="m", max_tokens=48, stream=True, **GREEDY,
            messages=[{"role": "user", "content": f"Write a short story about a {WORDS[i]} and the number {i}."}])
        text = ""
        for c in stream:
            if c.choices and c.choices[0].delta.content:
                text += c.choices[0].delta.content
                started.set()
        return text

    with ThreadPoolExecutor(7) as pool:
        others = [pool.submit(other, i) for i in range(7)]
        # Sent once the others generate, so the engine runs it in a batch with them.
        assert started.wait(60)
        batched = chat(oai, target, max_tokens=32).choices[0].message.content
        assert all(f.result() for f in others)
    assert batched == alone


# --- concurrency and cancellation ------------------------------------------------


@HEAVY
def test_16_streaming_clients_x_10_varied_requests(oai, server):
    before = server.metrics()["shardlm_requests_total"]

    def client(i):
        results = []
        for j in range(10):
            stream = oai.chat.completions.create(
                model="m", max_tokens=8, stream=True, **GREEDY,
                messages=[{"role": "user", "content": f"Write a haiku about the number {i * 10 + j}."}])
            text, finish = "", None
            for c in stream:
                if c.choices:
                    text += c.choices[0].delta.content or ""
                    finish = c.choices[0].finish_reason or finish
            results.append((text, finish))
        return results

    with ThreadPoolExecutor(16) as pool:
        results = [r for rs in pool.map(client, range(16)) for r in rs]
    assert len(results) == 160
    assert all(text for text, _ in results), [r for r in results if not r[0]]
    assert all(finish in ("stop", "length") for _, finish in results)
    m = wait_for(lambda: (m := server.metrics())["shardlm_active_requests"] == 0 and m, what="idle")
    assert m["shardlm_requests_total"] - before == 160


def test_disconnect_frees_kv_blocks(server):
    # Idle: no request, and no finished reply being re-warmed for the prefix cache.
    wait_for(lambda: (m := server.metrics())["shardlm_active_requests"] == 0 and m["shardlm_kv_blocks_used"] == 0,
             what="idle")
    before = server.metrics()
    # ignore_eos: the request must still be running when its 4th chunk arrives
    # (on a fast machine SmolLM2 may otherwise end its answer by then).
    body = {"model": "m", "max_tokens": 4000, "stream": True, "ignore_eos": True, **GREEDY,
            "messages": [{"role": "user", "content": "Count from 1 to 10000, comma separated."}]}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, headers=H, timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen >= 4:
                # Measured while the stream is open (leaving the loop may close it).
                during = server.metrics()
                break
    assert during["shardlm_active_requests"] >= 1
    assert during["shardlm_kv_blocks_used"] > before["shardlm_kv_blocks_used"]
    wait_for(lambda: (m := server.metrics())["shardlm_kv_blocks_used"] == before["shardlm_kv_blocks_used"]
             and m["shardlm_requests_cancelled_total"] > before["shardlm_requests_cancelled_total"],
             timeout=30, what="the cancelled request's KV blocks to be released")


# --- admission and KV pressure -----------------------------------------------------


@HEAVY
def test_429_carries_retry_after_through_both_sdks(spawn_server):
    srv = spawn_server("--max-concurrency", "1")
    # ignore_eos: the first request must hold its slot while the SDKs ask.
    body = {"model": "m", "max_tokens": 2000, "stream": True, "ignore_eos": True, **GREEDY,
            "messages": [{"role": "user", "content": "Count from 1 to 10000, comma separated."}]}
    ask = [{"role": "user", "content": "Hi."}]
    with httpx.stream("POST", srv.base + "/v1/chat/completions", json=body, headers=H, timeout=60) as r:
        assert r.status_code == 200
        # Kept referenced: a dropped line iterator closes the stream, which cancels the request.
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        oai = openai.OpenAI(base_url=srv.base + "/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError) as e:
            oai.chat.completions.create(model="m", messages=ask, max_tokens=2)
        assert e.value.response.headers.get("retry-after") == "1"
        claude = anthropic.Anthropic(base_url=srv.base, api_key=API_KEY, max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as e:
            claude.messages.create(model="c", messages=ask, max_tokens=2)
        assert e.value.response.headers.get("retry-after") == "1"
        assert e.value.body["error"]["type"] == "rate_limit_error"



@HEAVY
def test_kv_pressure_succeeds_or_429_with_retry_after(spawn_server):
    # Requests of about 100 prompt + 32 output tokens; the pool holds two of them
    # (and one full 256-token context, in case the engine requires that).
    pool_tokens = 288
    srv = spawn_server("--kv-cache-bytes", str(pool_tokens * KV_BYTES_PER_TOKEN), "--max-concurrency", "4",
                       "--context", "256")
    barrier = threading.Barrier(12)

    def one(i):
        body = {"model": "m", "max_tokens": 32, "stream": i % 2 == 1, **GREEDY,
                "messages": [{"role": "user", "content": f"Request {i}. " + code_file(f"p{i}", 3)
                              + "\nExplain the second line."}]}
        barrier.wait()
        with httpx.stream("POST", srv.base + "/v1/chat/completions", json=body, headers=H, timeout=120) as r:
            raw = r.read().decode()
            return r.status_code, r.headers.get("retry-after"), raw

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    ok = [raw for code, _, raw in results if code == 200]
    limited = [(code, ra) for code, ra, _ in results if code == 429]
    assert len(ok) + len(limited) == 12, [(c, raw[:200]) for c, _, raw in results if c not in (200, 429)]
    assert ok and limited, [c for c, _, _ in results]
    assert all(ra is not None and ra.isdigit() and int(ra) >= 1 for _, ra in limited), limited
    for raw in ok:
        assert '"error"' not in raw, raw[:500]
        assert '"content"' in raw
    assert httpx.get(srv.base + "/health", timeout=10).status_code == 200
    # Nothing leaked: a request still fits once the burst is over, and no block stays referenced.
    wait_for(lambda: srv.metrics()["shardlm_active_requests"] == 0, what="idle")
    r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=120,
                   json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi."}]})
    assert r.status_code == 200, r.text
    # (A finished reply may be re-warming for the prefix cache a moment longer.)
    wait_for(lambda: srv.metrics()["shardlm_kv_blocks_used"] == 0, timeout=30, what="every block released")


@pytest.mark.smoke
def test_serve_matches_run(server, oai):
    """One engine (issue 27): serve's greedy text for a prompt is `shardlm run`'s,
    on whatever split SHARDLM_SERVE_ARGS gives (one process, pipeline 2 with its
    micro-batches and overlapping prompt chunks, tensor 2). The prompt spans
    three prefill steps of 512 tokens."""
    import json
    import shlex
    import subprocess
    from conftest import ROOT
    prompt = "Here is a file:\n\n" + code_file("serve-matches-run", 45) + "\n\nLine 7 does"
    got = oai.completions.create(model="m", prompt=prompt, max_tokens=24, extra_body={"ignore_eos": True},
                                 **GREEDY)
    assert got.usage.prompt_tokens > 1024, got.usage
    binary = os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "target", "release", "shardlm"))
    serve_args = shlex.split(os.environ.get("SHARDLM_SERVE_ARGS", ""))
    out = subprocess.run([binary, "run", "--prompt", prompt, "--max-tokens", "24", "--ignore-eos", "--json",
                          *serve_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    ran = json.loads(out.stdout)
    assert len(ran["output_ids"]) == 24
    assert got.choices[0].text == ran["text"]


def test_speculation_per_request_keeps_greedy_text(server, oai):
    """Speculative decoding (issue 28) chosen per request with the `draft`
    extension field: the greedy text is the one without it, /metrics counts
    the drafted and accepted tokens, and a bad value is a 400 naming the field."""
    lines = code_file("speculate", 12)
    prompt = f"Here is a file:\n\n{lines}\n\nThe same file again:\n\n" + lines.split("\n")[0]
    before = server.metrics()
    texts = {}
    for draft in ("none", "ngram"):
        got = oai.completions.create(model="m", prompt=prompt, max_tokens=64, **GREEDY,
                                     extra_body={"ignore_eos": True, "draft": draft, "draft_max": 8})
        texts[draft] = got.choices[0].text
    assert texts["ngram"] == texts["none"]
    after = server.metrics()
    drafted = after["shardlm_spec_draft_tokens_total"] - before.get("shardlm_spec_draft_tokens_total", 0)
    accepted = after["shardlm_spec_accepted_tokens_total"] - before.get("shardlm_spec_accepted_tokens_total", 0)
    assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
    assert 0 < after["shardlm_spec_acceptance_rate"] <= 1
    r = httpx.post(server.base + "/v1/chat/completions", headers=H, timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "draft_max": 99})
    assert r.status_code == 400 and r.json()["error"]["param"] == "draft_max", r.text


def test_a_draft_model_serves_concurrent_streams_with_greedy_text(spawn_server):
    """`serve --draft-model` (issue 28): one drafter serves several streams
    at once (a slot of draft KV each) and every greedy text is the one
    without speculation; /metrics counts its drafted and accepted tokens."""
    # The default model drafting for itself, at every step (no cost pauses).
    os.environ["SHARDLM_DRAFT_COST"] = "0"
    try:
        srv = spawn_server("--draft-model", "smollm2-135m", "--max-batch", "4")
    finally:
        del os.environ["SHARDLM_DRAFT_COST"]
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
    prompts = [f"Here is a file:\n\n{code_file(f'dm{i}', 8)}\n\nThe same file again:\n\n" for i in range(3)]

    def complete(prompt, draft):
        got = client.completions.create(model="m", prompt=prompt, max_tokens=48, **GREEDY,
                                        extra_body={"ignore_eos": True, "draft": draft})
        return got.choices[0].text

    want = [complete(p, "none") for p in prompts]
    before = srv.metrics()
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda p: complete(p, "model"), prompts))
    assert got == want
    after = srv.metrics()
    drafted = after["shardlm_spec_draft_tokens_total"] - before.get("shardlm_spec_draft_tokens_total", 0)
    accepted = after["shardlm_spec_accepted_tokens_total"] - before.get("shardlm_spec_accepted_tokens_total", 0)
    # The same weights: nearly every draft token is the target's pick.
    assert drafted > 0 and accepted >= 0.8 * drafted, (drafted, accepted)
