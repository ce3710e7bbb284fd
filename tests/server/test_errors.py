"""Auth, and the 400s: each names the field, in the route's dialect."""

import anthropic
import httpx
import openai
import pytest

from conftest import API_KEY, BODY_LIMIT

H = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.smoke
def test_missing_or_wrong_key_is_refused(server):
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx.post(server.base + "/v1/chat/completions", json={"messages": MSG})
    assert r.status_code == 401
    bad_claude = anthropic.Anthropic(base_url=server.base, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_claude.messages.create(model="c", max_tokens=4, messages=MSG)
    ok = httpx.get(server.base + "/v1/models", headers={"x-api-key": API_KEY})
    assert ok.status_code == 200
    assert httpx.get(server.base + "/health").status_code == 200


def post(server, path, body, raw=None):
    return httpx.post(server.base + path, headers=H, content=raw if raw is not None else None,
                      json=None if raw is not None else body, timeout=60)


def test_invalid_json(server):
    r = post(server, "/v1/chat/completions", None, raw=b'{"messages": [')
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
    r = post(server, "/v1/messages", None, raw=b"{nope")
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_wrong_type_names_the_field(server):
    r = post(server, "/v1/chat/completions", {"messages": MSG, "max_tokens": "ten"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    r = post(server, "/v1/messages", {"messages": MSG, "max_tokens": 4, "temperature": "hot"})
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]


def test_max_tokens_not_positive(oai, claude):
    for n in (0, -5):
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model="m", messages=MSG, max_tokens=n)
        assert e.value.body["param"] == "max_tokens"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="c", max_tokens=0, messages=MSG)
    assert "max_tokens" in str(e.value)


def test_prompt_longer_than_context(oai, claude):
    long = "hello " * 9000  # SmolLM2's context is 8192 tokens
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": long}], max_tokens=4)
    assert "context" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="c", max_tokens=4, messages=[{"role": "user", "content": long}])


def test_body_too_large(server):
    big = {"messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}]}
    r = post(server, "/v1/chat/completions", big)
    assert r.status_code == 413 and "larger" in r.json()["error"]["message"]


def test_declared_body_too_large_is_refused_before_the_body(server):
    # Declares 64 MiB and sends a few bytes: 413 at once, not a wait for the rest.
    import socket
    host, port = server.base.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 67108864\r\n\r\n{")
        head = s.recv(4096).decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head


def test_n_other_than_one_is_refused(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=MSG, max_tokens=4, n=3)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="m", prompt="hi", max_tokens=4, n=2)
    r = oai.chat.completions.create(model="m", messages=MSG, max_tokens=2, n=1, temperature=0)
    assert len(r.choices) == 1


def test_server_still_serves_after_bad_requests(oai):
    r = oai.chat.completions.create(model="m", messages=MSG, max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
