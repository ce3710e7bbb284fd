"""Anthropic Messages through the official SDK."""

import jsonschema
import pytest

from test_openai import WEATHER_SCHEMA

# This SDK version has no `temperature` argument; the server still reads it.
GREEDY = {"temperature": 0}
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA,
     "cache_control": {"type": "ephemeral"}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
]


@pytest.mark.smoke
def test_messages_non_stream(claude):
    r = claude.messages.create(model="claude-any", max_tokens=16, extra_body=GREEDY,
                               system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
                               messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.type == "message" and r.role == "assistant"
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert r.usage.input_tokens > 5


def test_stop_sequence_and_thinking_accepted(claude):
    r = claude.beta.messages.create(
        model="claude-opus-4", max_tokens=32000,
        thinking={"type": "enabled", "budget_tokens": 31999},
        betas=["interleaved-thinking-2025-05-14", "made-up-beta-2099"],
        metadata={"user_id": "u1"},
        messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6, 7, 8"}],
        stop_sequences=[","],
        extra_body={"context_management": {"edits": []}, "temperature": 1},
    )
    assert all(b.type != "thinking" for b in r.content)
    assert r.stop_reason in ("stop_sequence", "end_turn", "max_tokens")
    if r.stop_reason == "stop_sequence":
        assert r.stop_sequence == ","
        assert "," not in r.content[0].text


@pytest.mark.smoke
def test_stream_with_forced_tool_use(claude):
    kinds = []
    with claude.messages.stream(model="claude-x", max_tokens=80, extra_body=GREEDY, tools=TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather in Berlin?"}]) as stream:
        for event in stream:
            kinds.append(event.type if event.type != "content_block_delta" else event.delta.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json_delta" in kinds and "content_block_start" in kinds and "message_delta" in kinds
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER_SCHEMA)


def test_tool_result_round_trip(claude):
    first = claude.messages.create(model="c", max_tokens=80, extra_body=GREEDY, tools=TOOLS, tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "Weather in Oslo?"}])
    use = next(b for b in first.content if b.type == "tool_use")
    r = claude.messages.create(model="c", max_tokens=24, extra_body=GREEDY, tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": [{"type": "text", "text": "-3 C, snow"}]}]},
    ])
    assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens(claude):
    small = claude.messages.count_tokens(model="c", messages=[{"role": "user", "content": "hi"}])
    big = claude.messages.count_tokens(model="c", system="You are a helpful assistant.", tools=TOOLS,
                                       messages=[{"role": "user", "content": "hi"}])
    assert 0 < small.input_tokens < big.input_tokens


def test_structured_output_json_schema(claude):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}}, "required": ["answer"]}
    r = claude.messages.create(model="c", max_tokens=40, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}},
                               messages=[{"role": "user", "content": "Capital of Italy? Answer in JSON."}])
    import json
    jsonschema.validate(json.loads(r.content[0].text), schema)


def test_claude_code_shaped_request(server):
    """What Claude Code sends (2.1.x), scaled down to the test model's context:
    `?beta=true`, several anthropic-beta values, thinking with a large budget,
    max_tokens 32000 (clamped), cache_control, defer_loading, context_management."""
    import httpx

    from conftest import API_KEY

    tools = [{"name": f"Tool{i}", "description": "Does a thing. " * 5,
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                               "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}}
             for i in range(12)]
    tools[-1]["defer_loading"] = True
    tools[0]["cache_control"] = {"type": "ephemeral"}
    body = {
        "model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                                   {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
        "tools": tools, "metadata": {"user_id": "user_abc_account_x_session_y"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        # Not sent by Claude Code: keeps the tiny model from writing thousands of tokens.
        "temperature": 0, "stop_sequences": ["\n", "."],
    }
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,x-unknown-2099"}
    events = []
    with httpx.stream("POST", server.base + "/v1/messages?beta=true", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "error" not in events
