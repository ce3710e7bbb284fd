"""A server that outlives its ranks: `serve --ranks 2`, pipeline and tensor.

kill -9 (or SIGSTOP) of rank 1 while a stream is in flight: the server stays up, /health
says degraded (503, naming the rank) until the launcher has restarted rank 1
and rank 0 has re-formed the cluster, the interrupted stream continues with
text identical to an uninterrupted greedy run, and new requests succeed. A
rank lost while the server is idle is replaced too.

These tests start their own two-rank servers, so they run once (not again
for each SHARDLM_SERVE_ARGS pass of scripts/test.sh).
"""

import json
import os
import signal
import threading
import time

import httpx
import pytest

from conftest import API_KEY, start_server, stop_server

pytestmark = pytest.mark.skipif(bool(os.environ.get("SHARDLM_SERVE_ARGS")),
                                reason="starts its own --ranks 2 servers; runs in the single-process pass")

H = {"Authorization": f"Bearer {API_KEY}"}
BODY = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 120, "temperature": 0, "stream": True, "ignore_eos": True}


def rank_pid(srv, rank):
    """The pid of `rank` among the launcher's children (it reads their SHARDLM_RANK)."""
    for _ in range(100):
        for child in open(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read().split():
            try:
                env = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if f"SHARDLM_RANK={rank}".encode() in env:
                return int(child)
        time.sleep(0.1)
    raise AssertionError(f"no rank {rank} under the launcher {srv.proc.pid}")


def stream_text(srv, kill_after=None, on_kill=None):
    """Streams BODY; with `kill_after`, calls `on_kill` after that many text deltas."""
    text, deltas = "", 0
    with httpx.stream("POST", srv.base + "/v1/chat/completions", json=BODY, headers=H, timeout=180) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for c in event.get("choices", []):
                piece = c["delta"].get("content")
                if piece:
                    text += piece
                    deltas += 1
                    if deltas == kill_after:
                        on_kill()
    return text


def health(srv):
    r = httpx.get(srv.base + "/health", timeout=5)
    return r.status_code, r.json()


def wait_ready(srv, limit=30):
    deadline = time.time() + limit
    while time.time() < deadline:
        code, h = health(srv)
        if code == 200:
            return h
        time.sleep(0.1)
    raise AssertionError(f"not ready {limit} s after the kill: {h}")


def wait_reformed(srv, limit=30):
    """Waits until the cluster was re-formed at least once and is ready."""
    deadline = time.time() + limit
    while time.time() < deadline:
        h = health(srv)[1]
        if h["cluster_reforms"] >= 1 and h["status"] == "ready":
            return h
        time.sleep(0.1)
    raise AssertionError(f"not re-formed {limit} s after the kill: {h}")


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_kill_rank_1_during_a_stream(strategy):
    srv = start_server("--ranks", "2", "--strategy", strategy)
    try:
        expected = stream_text(srv)
        seen = []

        def kill():
            os.kill(rank_pid(srv, 1), 9)

            def watch():  # /health while the cluster re-forms
                for _ in range(200):
                    code, h = health(srv)
                    if code != 200:
                        seen.append((code, h))
                        return
                    time.sleep(0.02)
            threading.Thread(target=watch, daemon=True).start()

        got = stream_text(srv, kill_after=15, on_kill=kill)
        assert got == expected
        killed_at = time.time()
        h = wait_ready(srv)
        assert seen, "the server never reported itself degraded"
        code, h_deg = seen[0]
        assert code == 503 and h_deg["status"] == "degraded", h_deg
        assert "rank 1" in h_deg["reason"] or "peer 1" in h_deg["reason"], h_deg
        assert h["rank_losses"] >= 1 and h["cluster_reforms"] >= 1, h
        m = srv.metrics()
        assert m["shardlm_rank_losses_total"] >= 1 and m["shardlm_degraded"] == 0
        # A new request succeeds within 30 s of the kill.
        r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and time.time() - killed_at < 30
        assert srv.proc.poll() is None
    finally:
        stop_server(srv)


def test_rank_lost_while_idle_is_replaced():
    srv = start_server("--ranks", "2", "--strategy", "pipeline")
    try:
        old = rank_pid(srv, 1)
        os.kill(old, 9)
        wait_reformed(srv)
        assert rank_pid(srv, 1) != old
        r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200
    finally:
        stop_server(srv)


def stopped_mid_stream(srv):
    """SIGSTOP of rank 1 after 15 deltas: the stream continues with the text of
    an uninterrupted greedy run, /health says degraded meanwhile and ready
    within 30 s, and a new request succeeds; returns rank 1's old pid."""
    expected = stream_text(srv)
    old = rank_pid(srv, 1)
    seen = []
    stopped_at = []

    def stop():
        os.kill(old, signal.SIGSTOP)
        stopped_at.append(time.time())

        def watch():
            for _ in range(1500):
                code, h = health(srv)
                if code != 200:
                    seen.append((code, h))
                    return
                time.sleep(0.02)
        threading.Thread(target=watch, daemon=True).start()

    got = stream_text(srv, kill_after=15, on_kill=stop)
    assert got == expected
    wait_ready(srv)
    assert seen and seen[0][0] == 503 and seen[0][1]["status"] == "degraded", seen
    assert "rank 1" in seen[0][1]["reason"] or "peer 1" in seen[0][1]["reason"], seen
    r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and time.time() - stopped_at[0] < 30
    assert rank_pid(srv, 1) != old
    assert srv.proc.poll() is None
    return old


def log_text(srv):
    srv.log.flush()
    with open(srv.log.name) as f:
        return f.read()


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_a_stopped_rank_is_replaced_and_the_stream_continues(strategy):
    """SIGSTOP of rank 1 mid-stream (shared memory): the supervisor kills it
    after 5 s stopped and restarts it, rank 0 re-forms, and the stream
    continues with the text of an uninterrupted greedy run."""
    srv = start_server("--ranks", "2", "--strategy", strategy)
    try:
        stopped_mid_stream(srv)
        assert "has been stopped (SIGSTOP)" in log_text(srv)
    finally:
        stop_server(srv)


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_a_hung_rank_is_found_by_its_heartbeat(strategy, monkeypatch):
    """Over TCP, rank 0 notices a stopped rank by its silent heartbeats
    (SHARDLM_HANG_TIMEOUT_MS, 1.5 s here) before the supervisor's 5 s look at
    its state, and asks the supervisor to kill it; the stream continues."""
    monkeypatch.setenv("SHARDLM_HANG_TIMEOUT_MS", "1500")
    srv = start_server("--ranks", "2", "--strategy", strategy, "--backend", "tcp")
    try:
        stopped_mid_stream(srv)
        log = log_text(srv)
        assert "is hung: no heartbeat" in log, log[-3000:]
        assert "reports rank 1" in log and "has been stopped (SIGSTOP)" not in log, log[-3000:]
    finally:
        stop_server(srv)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_rank_stopped_while_idle_is_replaced(backend, monkeypatch):
    """SIGSTOP of rank 1 while the server is idle: the probe of the idle
    server (tcp: the heartbeat; shm: the supervisor's look at its state) finds
    it, it is replaced, and the next request is answered."""
    monkeypatch.setenv("SHARDLM_HANG_TIMEOUT_MS", "1500")
    srv = start_server("--ranks", "2", "--strategy", "pipeline", "--backend", backend)
    old = None
    try:
        old = rank_pid(srv, 1)
        os.kill(old, signal.SIGSTOP)
        t0 = time.time()
        h = {}
        while time.time() - t0 < 30:
            h = health(srv)[1]
            if h["cluster_reforms"] >= 1 and h["status"] == "ready":
                break
            time.sleep(0.1)
        assert h["cluster_reforms"] >= 1 and h["status"] == "ready", h
        assert rank_pid(srv, 1) != old
        r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200 and time.time() - t0 < 30
    finally:
        if old is not None:
            try:
                os.kill(old, signal.SIGCONT)
            except ProcessLookupError:
                pass
        stop_server(srv)


def test_a_stopped_rank_ends_streams_with_an_error_not_a_hang():
    """With a --request-timeout shorter than the supervisor's 5 s grace for a
    stopped rank, a stream stalled by SIGSTOP of rank 1 ends with an error
    event in its API's format instead of hanging, a stream started meanwhile
    too; the stopped rank is then replaced and the server serves again."""
    srv = start_server("--ranks", "2", "--strategy", "pipeline", "--request-timeout", "2")
    pid = None
    try:
        pid = rank_pid(srv, 1)
        events = []
        t0 = None
        deltas = 0
        with httpx.stream("POST", srv.base + "/v1/chat/completions", json=BODY, headers=H, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    events.append(event)
                    continue
                for c in event.get("choices", []):
                    if c["delta"].get("content"):
                        deltas += 1
                        if deltas == 5:
                            os.kill(pid, signal.SIGSTOP)
                            t0 = time.time()
        assert t0 is not None, "the stream ended before the stop"
        assert events and "no progress" in events[0]["error"]["message"], events
        assert time.time() - t0 < 20
        # Started while the rank is stopped: an Anthropic stream gets its `error` event.
        body = {"model": "m", "max_tokens": 16, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", srv.base + "/v1/messages", json=body, headers={"x-api-key": API_KEY},
                          timeout=60) as r:
            lines = [line for line in r.iter_lines()]
        if "event: error" not in lines:
            # (Only if the replacement was already under way: then it completed.)
            assert "event: message_stop" in lines, lines
        assert srv.proc.poll() is None
        wait_ready(srv, 60)
        # (Within the 2 s limit once the re-formed cluster has caught up.)
        deadline = time.time() + 30
        while True:
            r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=60,
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
            if r.status_code == 200 or time.time() > deadline:
                break
            time.sleep(0.5)
        assert r.status_code == 200, r.text
        assert rank_pid(srv, 1) != pid
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        stop_server(srv)


def _stalled_requests(srv):
    """One request in each API's shape, sent at once; returns what each got."""
    out = {}
    msgs = [{"role": "user", "content": "hi"}]
    akey = {"x-api-key": API_KEY}

    def post(name, path, body, headers, stream):
        try:
            if stream:
                with httpx.stream("POST", srv.base + path, json=body, headers=headers, timeout=60) as r:
                    out[name] = (r.status_code, "\n".join(r.iter_lines()))
            else:
                r = httpx.post(srv.base + path, json=body, headers=headers, timeout=60)
                out[name] = (r.status_code, r.text)
        except httpx.HTTPError as e:
            out[name] = (0, repr(e))

    jobs = [
        ("chat", "/v1/chat/completions", {"messages": msgs, "max_tokens": 8}, H, False),
        ("chat_stream", "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "stream": True}, H, True),
        ("completions_stream", "/v1/completions", {"prompt": "hi", "max_tokens": 8, "stream": True}, H, True),
        ("responses_stream", "/v1/responses", {"input": "hi", "max_output_tokens": 16, "stream": True}, H, True),
        ("responses", "/v1/responses", {"input": "hi", "max_output_tokens": 16}, H, False),
        ("messages", "/v1/messages", {"model": "m", "max_tokens": 8, "messages": msgs}, akey, False),
    ]
    threads = [threading.Thread(target=post, args=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_a_stall_ends_each_api_with_its_own_error():
    """A request that gets no token for --request-timeout (rank 1 stopped;
    the supervisor replaces it only after 5 s) ends with an error in its API's
    format: OpenAI chat / completions streams `data: {"error": …}`, Responses
    `response.failed`, non-streamed ones 504 with the API's error body."""
    srv = start_server("--ranks", "2", "--strategy", "pipeline", "--request-timeout", "2")
    pid = rank_pid(srv, 1)
    try:
        os.kill(pid, signal.SIGSTOP)
        out = _stalled_requests(srv)
        for name in ("chat", "responses"):
            code, text = out[name]
            assert code == 504 and "--request-timeout" in json.loads(text)["error"]["message"], (name, out[name])
        code, text = out["messages"]
        body = json.loads(text)
        assert code == 504 and body["type"] == "error" and "--request-timeout" in body["error"]["message"], text
        for name in ("chat_stream", "completions_stream"):
            code, text = out[name]
            assert code == 200 and '"error"' in text and "--request-timeout" in text, (name, text)
            assert "data: [DONE]" not in text.split('"error"')[0], (name, text)
        code, text = out["responses_stream"]
        assert code == 200 and "response.failed" in text and "--request-timeout" in text, text
        wait_ready(srv, 60)
        assert srv.proc.poll() is None
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        stop_server(srv)


def test_new_requests_get_503_with_retry_after_once_degraded_past_the_bound(monkeypatch):
    """With --degraded-wait 0, a request that arrives while the cluster
    re-forms is refused at once: 503 with Retry-After, in its API's format."""
    monkeypatch.setenv("SHARDLM_HANG_TIMEOUT_MS", "1500")
    srv = start_server("--ranks", "2", "--strategy", "pipeline", "--backend", "tcp", "--degraded-wait", "0")
    pid = rank_pid(srv, 1)
    try:
        os.kill(pid, signal.SIGSTOP)
        deadline = time.time() + 20
        while health(srv)[0] == 200 and time.time() < deadline:
            time.sleep(0.01)
        msgs = [{"role": "user", "content": "hi"}]
        r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=30,
                       json={"messages": msgs, "max_tokens": 4})
        a = httpx.post(srv.base + "/v1/messages", headers={"x-api-key": API_KEY}, timeout=30,
                       json={"model": "m", "max_tokens": 4, "messages": msgs})
        assert r.status_code == 503 and r.headers.get("retry-after") == "5", r.text
        assert "degraded" in r.json()["error"]["message"], r.text
        # (The Anthropic request may come after the cluster is back.)
        if a.status_code == 503:
            assert a.json()["type"] == "error" and a.headers.get("retry-after") == "5", a.text
        else:
            assert a.status_code == 200, a.text
        wait_ready(srv)
        r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=30,
                       json={"messages": msgs, "max_tokens": 4})
        assert r.status_code == 200, r.text
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        stop_server(srv)


def test_a_draft_rank_drafts_and_is_replaced():
    """`serve --ranks 2 --draft-model M --draft-rank 1` (issue 28): rank 1 runs
    the draft model for rank 0, the greedy text is the one without drafts, and
    when rank 1 is killed the launcher restarts it with its draft model, the
    cluster re-forms, and drafting goes on."""
    # The default model drafting for itself, at every step (no cost pauses);
    # the launcher passes the variable to the rank it restarts too.
    os.environ["SHARDLM_DRAFT_COST"] = "0"
    try:
        srv = start_server("--ranks", "2", "--strategy", "pipeline", "--draft-model", "smollm2-135m",
                           "--draft-rank", "1")
    finally:
        del os.environ["SHARDLM_DRAFT_COST"]
    lines = "\n".join(f"def f{i}(x):\n    return x * {i % 4 + 2} + {i}" for i in range(6))
    body = {"messages": [{"role": "user", "content": f"Repeat this code exactly:\n{lines}"}],
            "max_tokens": 48, "temperature": 0, "ignore_eos": True}

    def complete(draft):
        r = httpx.post(srv.base + "/v1/chat/completions", headers=H, timeout=120, json={**body, "draft": draft})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    def drafted_while(draft):
        before = srv.metrics()
        text = complete(draft)
        after = srv.metrics()
        count = lambda m, k: m.get(f"shardlm_spec_{k}_tokens_total", 0)
        return text, count(after, "draft") - count(before, "draft"), count(after, "accepted") - count(before, "accepted")

    try:
        want = complete("none")
        got, drafted, accepted = drafted_while("model")
        assert got == want
        assert drafted > 0 and accepted >= 0.8 * drafted, (drafted, accepted)
        os.kill(rank_pid(srv, 1), 9)
        wait_reformed(srv)
        got, drafted, _ = drafted_while("model")
        assert got == want and drafted > 0, (got, drafted)
    finally:
        stop_server(srv)
