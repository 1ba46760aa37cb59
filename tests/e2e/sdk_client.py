"""Drive a poolgate gateway with the official Anthropic Python SDK.

Usage: python3 sdk_client.py <gateway base url>

Runs a non-streaming call, a streaming call and a streamed tool call, checks
what the SDK parsed, and prints one JSON line per check. Exits non-zero on the
first failure. The gateway in front of the mock upstream is what is under test:
the SDK must not be able to tell it from Anthropic.
"""

import json
import sys

import anthropic


def main() -> int:
    base_url = sys.argv[1]
    client = anthropic.Anthropic(base_url=base_url, api_key="sdk-test-client", max_retries=0)

    msg = client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "hello"}],
    )
    assert msg.type == "message", msg
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text, msg
    assert msg.usage.output_tokens > 0, msg.usage
    print(json.dumps({"check": "create", "text": msg.content[0].text, "stop_reason": msg.stop_reason}))

    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "hello"}],
    )
    assert raw.headers.get("x-poolgate-account"), dict(raw.headers)
    print(json.dumps({"check": "headers", "account": raw.headers.get("x-poolgate-account")}))

    events = []
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "stream please"}],
    ) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
        text = "".join(b.text for b in final.content if b.type == "text")
    assert events[0] == "message_start" and events[-1] == "message_stop", events
    assert text, final
    print(json.dumps({"check": "stream", "events": len(events), "text": text}))

    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=128,
        tools=[{
            "name": "get_weather",
            "description": "Weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }],
        messages=[{"role": "user", "content": "weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    tools = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and tools, final
    assert isinstance(tools[0].input, dict), tools[0]
    print(json.dumps({"check": "tool_stream", "tool": tools[0].name, "input": tools[0].input}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
