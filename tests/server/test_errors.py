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
    assert r.status_code == 400 and "larger" in r.json()["error"]["message"]


def test_server_still_serves_after_bad_requests(oai):
    r = oai.chat.completions.create(model="m", messages=MSG, max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
