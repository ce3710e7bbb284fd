"""OpenAI Chat Completions, Completions and models through the official SDK."""

import json

import jsonschema
import pytest

from conftest import MODEL

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER_SCHEMA},
}
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.smoke
def test_model_list(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]


@pytest.mark.smoke
def test_chat_non_stream(oai):
    r = oai.chat.completions.create(model="anything", messages=ASK, max_tokens=12, temperature=0)
    c = r.choices[0]
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 12
    # The template's default system prompt is shared with earlier requests, so
    # the prefix cache may serve the first blocks; never the whole prompt.
    assert 0 <= r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens
    assert r.model == MODEL


@pytest.mark.smoke
def test_chat_stream_matches_non_stream(oai):
    ref = oai.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0).choices[0].message.content
    chunks = list(oai.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_roles_parts_and_sampling_fields(oai):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in English."}]},
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}, {"type": "image_url", "image_url": {"url": "x"}}]},
    ]
    r = oai.chat.completions.create(model="m", messages=messages, max_completion_tokens=8, temperature=0.7,
                                    top_p=0.9, seed=7, stop=["\n\n"], extra_body={"unknown_field": {"a": 1}})
    assert r.choices[0].message.content is not None
    again = oai.chat.completions.create(model="m", messages=messages, max_completion_tokens=8, temperature=0.7,
                                        top_p=0.9, seed=7, stop=["\n\n"])
    assert again.choices[0].message.content == r.choices[0].message.content, "same seed, same text"


def test_max_tokens_is_clamped_to_the_context(oai):
    # Accepted (clamped to the room left), not refused. A stop string ends it
    # early: greedy decoding could otherwise run to the end of the context,
    # minutes on a loaded 2-core machine.
    r = oai.chat.completions.create(model="m", messages=ASK, max_tokens=10_000_000, temperature=0, stop=[","])
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens < 10_000_000


@pytest.mark.smoke
def test_forced_tool_call_round_trip(oai):
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    tools = [WEATHER_TOOL, {"type": "web_search_preview"}]
    r = oai.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=60, temperature=0,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER_SCHEMA)
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    final = oai.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=24, temperature=0,
                                        tool_choice="none")
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason in ("stop", "length")


def test_required_tool_call_streams_as_deltas(oai):
    stream = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                         tools=[WEATHER_TOOL], tool_choice="required", max_tokens=60,
                                         temperature=0, stream=True)
    text, calls, finish = "", {}, None
    for chunk in stream:
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert "<tool_call>" not in text
    assert finish == "tool_calls"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_SCHEMA)


def test_json_schema_response_validates(oai):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                               "age": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
              "required": ["name", "age", "tags"]}
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Describe a person as JSON."}],
                                    max_tokens=80, temperature=0,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_json_object_response(oai):
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Give me a JSON object."}],
                                    max_tokens=40, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.smoke
def test_completions(oai):
    r = oai.completions.create(model="m", prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.choices[0].text
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model="m", prompt="The capital of France is", max_tokens=5, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
