#!/usr/bin/env python3
"""Claude Code status line for a key behind poolgate: what the key used today
and what is left of its budgets, and the quota of the pool it draws on, from
the gateway's GET /v1/usage.

Install (Python 3, standard library only):

    cp docs/statusline/poolgate-statusline.py ~/.claude/ && chmod +x ~/.claude/poolgate-statusline.py

and in ~/.claude/settings.json:

    {"statusLine": {"type": "command", "command": "~/.claude/poolgate-statusline.py"}}

It reads the gateway and the key from the environment Claude Code runs with:
ANTHROPIC_BASE_URL, and ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN. Claude Code
passes the session's JSON on stdin; only the model's name is used. Prints one
line, e.g.:

    Sonnet 4.5 · poolgate alice · today 1.2M tok $3.41 · day $1.59 left · pool 5h 40% 7d 27%
"""

import json
import os
import sys
import urllib.request


def short(n):
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def line(session, usage):
    parts = []
    model = (session.get("model") or {}).get("display_name")
    if model:
        parts.append(model)
    parts.append(f"poolgate {usage.get('key', '?')}")
    today = next((u for u in usage.get("usage", []) if u.get("period") == "day"), None)
    if today:
        parts.append(f"today {short(today['tokens'])} tok ${today['cost_usd']:.2f}")
    for b in usage.get("budgets", []):
        left = f"${b['remaining']:.2f}" if b["unit"] == "usd" else f"{short(b['remaining'])} tok"
        parts.append(f"{b['period']} {left} left")
    pool = usage.get("pool") or {}
    windows = [w for w in pool.get("windows", []) if w.get("window") in ("5h", "7d")]
    if windows:
        used = " ".join(f"{w['window']} {w['utilization'] * 100:.0f}%" for w in windows)
        warn = "" if pool.get("status") in (None, "allowed") else f" {pool['status']}"
        parts.append(f"pool{warn} {used}")
    return " · ".join(parts)


def main():
    try:
        session = json.load(sys.stdin)
    except ValueError:
        session = {}
    base = os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:8787").rstrip("/")
    key = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN") or ""
    request = urllib.request.Request(f"{base}/v1/usage", headers={"x-api-key": key})
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            usage = json.load(r)
    except Exception as e:  # the status line must never fail Claude Code
        print(f"poolgate: no usage ({getattr(e, 'code', None) or type(e).__name__})")
        return
    print(line(session, usage))


if __name__ == "__main__":
    main()
