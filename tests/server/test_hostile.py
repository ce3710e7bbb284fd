"""Hostile HTTP input: every probe gets a 4xx (or a closed connection) and the
server stays healthy afterwards."""

import socket
import time

import httpx
import pytest

from conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]


def raw(server, data, timeout=10):
    """Sends raw bytes on a fresh connection; returns the status line ('' if closed)."""
    host, port = server.base.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        try:
            return s.recv(4096).decode("latin-1").split("\r\n")[0]
        except (ConnectionResetError, socket.timeout):
            return ""


def post(server, body=None, content=None, path="/v1/chat/completions"):
    return httpx.post(server.base + path, headers=H, json=body if content is None else None,
                      content=content, timeout=60)


def healthy(server):
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("content", [
    b"\x00\xff\xfe garbage \x01\x02",
    b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"messages": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
], ids=["garbage", "invalid-utf8", "deep-array", "deep-object"])
def test_malformed_bodies_are_400(server, content):
    r = post(server, content=content)
    assert r.status_code == 400, r.text
    healthy(server)


@pytest.mark.parametrize("body", [
    {"messages": MSG, "max_tokens": -1},
    {"messages": MSG, "temperature": "NaN"},
    {"messages": MSG, "top_p": -3},
    {"messages": MSG, "n": 3},
    {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nowhere"}}}],
     "tool_choice": "required"},
    {"messages": MSG, "tools": "not a list"},
    {"messages": "not a list"},
    {"messages": []},
], ids=["negative-max-tokens", "nan-temperature", "bad-top-p", "n=3",
        "bad-tool-schema", "tools-not-list", "messages-not-list", "no-messages"])
def test_bad_fields_are_4xx(server, body):
    r = post(server, body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    healthy(server)


def test_huge_max_tokens_is_clamped_or_refused(server):
    # Clamped to the room left in the context (as llama-server does), never a 5xx.
    r = post(server, {"messages": MSG, "max_tokens": 10**12, "temperature": 0})
    assert r.status_code == 200 or 400 <= r.status_code < 500, r.text
    r = post(server, content=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}')
    assert 400 <= r.status_code < 500, r.text
    healthy(server)


def test_nan_literal_is_400(server):
    r = post(server, content=b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')
    assert r.status_code == 400
    healthy(server)


def test_declared_huge_body_is_413_at_once(server):
    t = time.time()
    line = raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 67108864\r\n\r\n{")
    assert line.startswith("HTTP/1.1 413") and time.time() - t < 5, line
    healthy(server)


def test_megabyte_header_is_refused(server):
    line = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    assert line == "" or line.split()[1].startswith("4"), line
    healthy(server)


def test_slowloris_connections_do_not_block_others(server):
    host, port = server.base.split("//")[1].split(":")
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")  # never finished
            socks.append(s)
        t = time.time()
        healthy(server)
        r = post(server, {"messages": MSG, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and time.time() - t < 30
    finally:
        for s in socks:
            s.close()
