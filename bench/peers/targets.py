"""The gateways measured, each started the way its users run it, in front of one mock.

Every target is a process (or, for LiteLLM, a process tree) that listens on a
loopback port and forwards Anthropic Messages requests to the same
`poolgate-mock-upstream`. The mock accepts only the 8 upstream keys
`peers-key-0` … `peers-key-7`, so a gateway that forwarded the client's own
key, or reached anything but the mock, would answer an error, and errors are
counted, never dropped.

What each gateway is told (the configuration its users would write):
- direct: no gateway; the client talks to the mock with `peers-key-0`.
- haproxy: HTTP mode, keep-alive and connection reuse, one backend (the mock);
  the client's key passes through. The plain-proxy reference: no JSON work.
- poolgate: 8 `[[accounts]]` with their own keys, the default chain.
- litellm: a `model_list` of 8 deployments of `anthropic/claude-sonnet-4-5`,
  `api_base` at the mock, one key each, the default router (simple-shuffle);
  clients call LiteLLM's Anthropic-format `/v1/messages` with the proxy's
  master key, which is what LiteLLM documents for fronting Claude Code.
- portkey: the open-source gateway; the client sends a `loadbalance` config
  over 8 `anthropic` targets (`custom_host` at the mock, one key each) in the
  `x-portkey-config` header to `/v1/messages`, as Portkey documents for
  self-hosted gateways without its control plane.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

KEYS = [f"peers-key-{i}" for i in range(8)]
MODEL = "claude-sonnet-4-5"
LITELLM_MASTER = "sk-peers-bench-master"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, seconds, what, path=None):
    """Until `port` accepts connections (and, with `path`, answers a GET of it with a 200)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
            if path:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5):
                    pass
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not listen on {port} within {seconds}s")


class Target:
    """One measured path: its URL, the headers its clients add, its process."""

    def __init__(self, name, url, proc=None, headers=None, client_key=KEYS[0], log=None):
        self.name = name
        self.url = url
        self.proc = proc
        self.headers = headers or {}
        self.client_key = client_key
        self.log = log

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log:
            self.log.close()


def spawn(cmd, work, name, env=None, cwd=None):
    log = open(os.path.join(work, f"{name}.log"), "w")
    full_env = dict(os.environ, **(env or {}))
    # A session of its own, so that stop() ends the gateway's workers with it.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True)
    return proc, log


def mock(bindir, work):
    port = free_port()
    cmd = [os.path.join(bindir, "poolgate-mock-upstream"), "--listen", f"127.0.0.1:{port}", "--utilization", "0.2"]
    for k in KEYS:
        cmd += ["--credential", k]
    proc, log = spawn(cmd, work, "mock")
    wait_port(port, proc, 30, "mock")
    return Target("direct", f"http://127.0.0.1:{port}", proc, log=log)


def haproxy(upstream, work):
    port = free_port()
    backend = upstream.removeprefix("http://")
    cfg = (
        "global\n  nbthread 2\n"
        "defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n"
        "  option http-keep-alive\n  http-reuse always\n"
        f"frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n"
        f"backend b\n  server s1 {backend}\n"
    )
    path = os.path.join(work, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(cfg)
    proc, log = spawn(["haproxy", "-f", path, "-db"], work, "haproxy")
    wait_port(port, proc, 30, "haproxy")
    return Target("haproxy", f"http://127.0.0.1:{port}", proc, log=log)


def poolgate(bindir, upstream, work):
    port = free_port()
    cfg = "[server]\ndecisions_kept = 200\n\n[gateway]\nqueue_max = 4096\n\n"
    env = {"POOLGATE_LOG": "warn"}
    for i, k in enumerate(KEYS):
        cfg += f'[[accounts]]\nid = "acct-{i}"\napi_key_env = "PEERS_KEY_{i}"\nbase_url = "{upstream}"\n\n'
        env[f"PEERS_KEY_{i}"] = k
    path = os.path.join(work, "poolgate.toml")
    with open(path, "w") as f:
        f.write(cfg)
    cmd = [os.path.join(bindir, "poolgate"), "serve", "--config", path, "--listen", f"127.0.0.1:{port}"]
    proc, log = spawn(cmd, work, "poolgate", env)
    wait_port(port, proc, 60, "poolgate")
    return Target("poolgate", f"http://127.0.0.1:{port}", proc, client_key="peers-client", log=log)


def litellm(venv, upstream, work, workers):
    port = free_port()
    lines = ["model_list:"]
    for i, k in enumerate(KEYS):
        lines += [
            f"  - model_name: {MODEL}",
            "    litellm_params:",
            f"      model: anthropic/{MODEL}",
            f"      api_base: {upstream}",
            f"      api_key: {k}",
            "    model_info:",
            f"      id: key-{i}",
        ]
    lines += [
        "router_settings:",
        "  routing_strategy: simple-shuffle",
        "litellm_settings:",
        "  telemetry: false",
        "general_settings:",
        f"  master_key: {LITELLM_MASTER}",
    ]
    path = os.path.join(work, "litellm.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "NO_DOCS": "True"}
    cmd = [os.path.join(venv, "bin", "litellm"), "--config", path, "--host", "127.0.0.1", "--port", str(port)]
    # gunicorn manages several workers; uvicorn's own multi-worker mode restarted
    # workers that were slow to import on a loaded machine, without end.
    cmd += ["--num_workers", str(workers), "--run_gunicorn"]
    proc, log = spawn(cmd, work, "litellm", env)
    wait_port(port, proc, 300, "litellm", "/health/liveliness")
    return Target("litellm", f"http://127.0.0.1:{port}", proc, client_key=LITELLM_MASTER, log=log)


def portkey_config(upstream):
    targets = [{"provider": "anthropic", "api_key": k, "custom_host": f"{upstream}/v1"} for k in KEYS]
    return json.dumps({"strategy": {"mode": "loadbalance"}, "targets": targets}, separators=(",", ":"))


def portkey(prefix, upstream, work):
    port = free_port()
    script = os.path.join(prefix, "node_modules", "@portkey-ai", "gateway", "build", "start-server.js")
    proc, log = spawn(["node", script, f"--port={port}", "--headless"], work, "portkey", {"NODE_ENV": "production"})
    wait_port(port, proc, 60, "portkey")
    headers = {"x-portkey-config": portkey_config(upstream)}
    return Target("portkey", f"http://127.0.0.1:{port}", proc, headers=headers, client_key="peers-client", log=log)


# The response header in which each gateway names the key (deployment, target,
# account) it chose: how the run sees that it spreads requests over the 8 keys.
CHOICE_HEADER = {
    "poolgate": "x-poolgate-account",
    "litellm": "x-litellm-model-id",
    "portkey": "x-portkey-last-used-option-index",
}


def spread(target, request_headers, body_json, session, n=24):
    """How many of `n` JSON requests, each of its own session, went to each key,
    by the gateway's own header. (One session stays on one account in poolgate,
    for the prompt cache: the measured load, one session, uses one account.)"""
    name = CHOICE_HEADER.get(target.name)
    if not name:
        return None
    counts = {}
    for i in range(n):
        own = f"{session[:-4]}{i:04d}"
        headers = {k: v.replace(session, own) for k, v in dict(request_headers, **target.headers).items()}
        headers["x-api-key"] = target.client_key
        body = body_json.replace(session, own).encode()
        req = urllib.request.Request(f"{target.url}/v1/messages", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
                key = r.headers.get(name, "(none)")
        except OSError as e:
            key = f"error: {e}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def check(target, request_headers, body_json, body_stream):
    """One JSON and one streamed request through `target`: the problems of each body kind, if any."""
    problems = {}
    for stream, body in ((False, body_json), (True, body_stream)):
        kind = "stream" if stream else "json"
        headers = dict(request_headers, **target.headers)
        headers["x-api-key"] = target.client_key
        headers.pop("accept-encoding", None)
        req = urllib.request.Request(f"{target.url}/v1/messages", data=body.encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            problems[kind] = f"HTTP {e.code}: {e.read()[:300]!r}"
            continue
        except OSError as e:
            problems[kind] = str(e)
            continue
        bad = validate(text, stream)
        if bad:
            problems[kind] = bad
    return problems


def validate(text, stream):
    if stream:
        missing = [e for e in ("event: message_start", "content_block_delta", "event: message_stop") if e not in text]
        if missing or "mock " not in text:
            return f"not a Messages SSE answer from the mock (missing {missing}): {text[:300]!r}"
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:300]!r}"
    ok = doc.get("type") == "message" and doc.get("role") == "assistant" and isinstance(doc.get("content"), list)
    said = "".join(c.get("text", "") for c in doc.get("content") or [] if isinstance(c, dict))
    if not ok or "mock upstream" not in said:
        return f"not a Messages answer from the mock: {text[:300]!r}"
    return None
