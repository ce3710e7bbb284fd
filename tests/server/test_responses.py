"""The Responses API as Codex CLI uses it."""

import json

import jsonschema
import pytest

from test_openai import WEATHER_SCHEMA

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Current weather", "parameters": WEATHER_SCHEMA,
     "strict": False},
    {"type": "web_search"},
    {"type": "namespace", "name": "mcp", "tools": []},
]
CODEX_EXTRAS = {"prompt_cache_key": "abc", "include": ["reasoning.encrypted_content"]}


@pytest.mark.smoke
def test_responses_function_tool(oai):
    r = oai.responses.create(model="gpt-5-codex", instructions="You call tools.", input="Weather in Madrid?",
                             tools=TOOLS, tool_choice="required", max_output_tokens=80, store=False,
                             reasoning={"effort": "medium"}, parallel_tool_calls=False, extra_body=CODEX_EXTRAS)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_SCHEMA)
    follow = oai.responses.create(model="m", max_output_tokens=20, tools=TOOLS, store=False, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Madrid?"}]},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "25 C, sunny"},
    ], tool_choice="none")
    assert follow.output_text


def test_responses_stream_ends_with_completed(oai):
    events = list(oai.responses.create(model="m", input="Say hello.", max_output_tokens=10, temperature=0,
                                       stream=True, store=False, extra_body=CODEX_EXTRAS))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_stream_function_call(oai):
    events = list(oai.responses.create(model="m", input="Weather in Lima?", tools=TOOLS, tool_choice="required",
                                       max_output_tokens=80, temperature=0, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done
    jsonschema.validate(json.loads(done[0].arguments), WEATHER_SCHEMA)
    assert events[-1].type == "response.completed"
