"""One load phase against one target: wrk drives it, /proc counts the gateway's CPU.

The client is `wrk` with a Lua script (written here, one per target and body
kind) that POSTs the same Messages body with Claude Code's headers to every
target, and checks every answer: a 200 whose body holds the mark of a Messages
answer (`"type":"message"` for JSON, `message_stop` for a stream) is good,
anything else is bad, and both are printed with wrk's own socket errors.

CPU is utime+stime of the target's whole process tree (the process and every
descendant, all threads included) read from /proc before and after the phase,
divided by the requests that phase completed. LiteLLM's workers and Node's
threads are so counted; a process that exits within the phase is not.
"""

import json
import os
import re
import subprocess

TICK = os.sysconf("SC_CLK_TCK")

LUA = r"""
wrk.method = "POST"
wrk.body = [==[%(body)s]==]
%(headers)s
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) good = 0; bad = 0 end
function response(status, headers, body)
  if status == 200 and body ~= nil and string.find(body, %(mark)s, 1, true) then
    good = good + 1
  else
    bad = bad + 1
  end
end
function done(summary, latency, requests)
  local g, b = 0, 0
  for _, t in ipairs(threads) do g = g + t:get("good"); b = b + t:get("bad") end
  local e = summary.errors
  io.write(string.format(
    'PEERS {"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,"mean_us":%%f,' ..
    '"good":%%d,"bad":%%d,"connect":%%d,"read":%%d,"write":%%d,"timeout":%%d,"status":%%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    g, b, e.connect, e.read, e.write, e.timeout, e.status))
end
"""


def lua_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_script(path, body, headers, stream):
    lines = [f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()]
    mark = "message_stop" if stream else '"type":"message"'
    with open(path, "w") as f:
        f.write(LUA % {"body": body, "headers": "\n".join(lines), "mark": lua_string(mark)})


def tree_pids(root):
    """`root` and all its descendants, from the ppid field of /proc/*/stat."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                after = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(after[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_cpu(root):
    """utime+stime of `root`'s process tree, in seconds, by pid."""
    cpu = {}
    for p in tree_pids(root):
        try:
            with open(f"/proc/{p}/stat") as f:
                after = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[p] = (int(after[11]) + int(after[12])) / TICK
    return cpu


def cpu_delta(before, after):
    """CPU spent between two `tree_cpu` readings (processes new since `before` count from zero)."""
    return sum(v - before.get(p, 0.0) for p, v in after.items())


def wrk(url, script, conns, seconds):
    threads = 1 if conns == 1 else 2
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "30s", "-s", script, f"{url}/v1/messages"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    m = re.search(r"^PEERS (\{.*\})$", out.stdout, re.M)
    if not m:
        raise RuntimeError(f"wrk gave no figures ({out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}")
    return json.loads(m.group(1))


def phase(target, script, conns, seconds):
    """One wrk run at `conns` connections, with the target tree's CPU over it."""
    before = tree_cpu(target.pid) if target.pid else {}
    r = wrk(target.url, script, conns, seconds)
    after = tree_cpu(target.pid) if target.pid else {}
    cpu = cpu_delta(before, after)
    served = max(r["requests"], 1)
    r["cpu_s"] = cpu
    r["cpu_us_per_req"] = cpu / served * 1e6
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["errors"] = r["bad"] + r["connect"] + r["read"] + r["write"] + r["timeout"]
    return r


def scrape_stages(url):
    """Sums and counts of poolgate's stage and chain histograms, from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    pat = re.compile(r'^poolgate_(stage|chain)_duration_seconds_(sum|count)(?:\{stage="([^"]+)"\})? (\S+)$', re.M)
    for kind, field, stage, value in pat.findall(text):
        name = stage if kind == "stage" else "(whole chain)"
        out.setdefault(name, {})[field] = float(value)
    buckets = re.compile(r'^poolgate_(stage|chain)_duration_seconds_bucket\{le="([^"]+)"(?:,stage="([^"]+)")?\} (\S+)$', re.M)
    for kind, le, stage, value in buckets.findall(text):
        name = stage if kind == "stage" else "(whole chain)"
        out.setdefault(name, {}).setdefault("buckets", {})[float(le)] = float(value)
    return out


def stage_means(before, after):
    """Mean microseconds per ranking of each stage between two scrapes."""
    means = {}
    for name, a in after.items():
        b = before.get(name, {})
        n = a.get("count", 0) - b.get("count", 0)
        if n > 0:
            bb = b.get("buckets", {})
            cum = sorted((le, v - bb.get(le, 0.0)) for le, v in a.get("buckets", {}).items())
            p50 = next((le * 1e6 for le, v in cum if v >= n / 2), None)
            means[name] = {"count": n, "mean_us": (a.get("sum", 0) - b.get("sum", 0)) / n * 1e6, "p50_le_us": p50}
    return means
