"""A mixed run for the usage ledger, with the official SDKs, as one client key.

Usage: usage_mixed.py <gateway base URL> <client key> <rounds>. Each round sends,
with the Anthropic SDK, a JSON and a streamed Messages request (one with a
prompt-cache breakpoint) and a count_tokens request; and with the OpenAI SDK a
JSON and a streamed Chat Completions request. Prints one JSON line: what the
Anthropic answers said they used, by kind, and how many requests went out.
"""

import json
import sys

import anthropic
import openai

base, key, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
chat = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
MODEL = "claude-sonnet-4-5"
seen = {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
requests = 0


def add(usage):
    for k in seen:
        seen[k] += getattr(usage, k, 0) or 0


for i in range(rounds):
    cached = [{"type": "text", "text": f"You are terse. Round {i}. " * 20, "cache_control": {"type": "ephemeral"}}]
    r = claude.messages.create(
        model=MODEL, max_tokens=64, system=cached, messages=[{"role": "user", "content": f"hello {i}"}]
    )
    add(r.usage)
    with claude.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": f"stream {i} " * (i + 1)}]
    ) as s:
        add(s.get_final_message().usage)
    counted = claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "count me"}])
    assert counted.input_tokens > 0, counted
    c = chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"chat {i}"}], max_tokens=64)
    assert c.usage.completion_tokens > 0, c.usage
    for chunk in chat.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"chat stream {i}"}], stream=True
    ):
        pass
    requests += 5

print(json.dumps({"anthropic_seen": seen, "requests": requests}), flush=True)
