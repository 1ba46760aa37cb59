"""The official OpenAI Python SDK against poolgate's /v1/chat/completions.

Usage: openai_client.py <gateway base URL>. Prints one JSON line per check;
exits non-zero on the first failure.
"""

import json
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused-client-key", max_retries=0)
MODEL = "claude-sonnet-4-5"
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def ok(check, **facts):
    print(json.dumps({"check": check, **facts}), flush=True)


r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=64)
assert r.object == "chat.completion", r
assert r.choices[0].message.role == "assistant" and r.choices[0].message.content, r
assert r.choices[0].finish_reason == "stop", r
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 0, r.usage
ok("create", text=r.choices[0].message.content)

text, finish, usage = "", None, None
stream = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "hello"}], stream=True, stream_options={"include_usage": True}
)
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert text and finish == "stop" and usage and usage.completion_tokens > 0, (text, finish, usage)
ok("stream", text=text)

r = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "weather in Paris?"}],
    tools=TOOLS,
    tool_choice="required",
)
call = r.choices[0].message.tool_calls[0]
assert r.choices[0].finish_reason == "tool_calls", r
assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict), call
ok("tools", id=call.id)

# The tool's result goes back as a `tool` message: a second turn.
r2 = client.chat.completions.create(
    model=MODEL,
    messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ],
    tools=TOOLS,
)
assert r2.choices[0].message.content, r2
ok("tool_result")

args, name, finish = "", None, None
stream = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, tool_choice="required", stream=True
)
for chunk in stream:
    for c in chunk.choices:
        for t in c.delta.tool_calls or []:
            name = t.function.name or name
            args += t.function.arguments or ""
        finish = c.finish_reason or finish
assert name == "get_weather" and isinstance(json.loads(args), dict) and finish == "tool_calls", (name, args, finish)
ok("tool_stream", args=args)

try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2)
    raise AssertionError("n=2 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.body and "n" in str(e.body.get("message", "")), e.body
    ok("refusal")
