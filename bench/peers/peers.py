"""poolgate next to its peers on one fake upstream: what each gateway adds to a request.

`run.sh` installs the peers and builds poolgate, then runs this. It starts the
mock and every target, checks that each one answers a JSON and a streamed
request with a Messages answer from the mock, warms each up, and then measures
them interleaved: every round runs, for each target in turn (the order rotated
per round), JSON and streamed requests at concurrency 1 (latency) and at 32
(throughput, CPU). Each figure is the median of the rounds, so noise from the
shared machine falls on all targets alike. The table and plots are written by
`report.py`.
"""

import argparse
import json
import os
import statistics
import sys
import time

import measure
import report
import targets

ALL = ["direct", "haproxy", "poolgate", "litellm", "portkey"]


SESSION = "7f9c1a52-3b1e-4c1a-9d3e-5a8b2c7d9e01"


def claude_code_request(stream):
    """The body and headers Claude Code sends (as `bench/loadgen` sends them)."""
    session = SESSION
    user_id = json.dumps(
        {"device_id": "0123456789abcdef" * 4, "account_uuid": "", "session_id": session}, separators=(",", ":")
    )
    body = json.dumps(
        {
            "model": targets.MODEL,
            "max_tokens": 64,
            "stream": stream,
            "metadata": {"user_id": user_id},
            "messages": [{"role": "user", "content": "hello"}],
        },
        separators=(",", ":"),
    )
    headers = {
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "accept": "application/json",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
        "anthropic-dangerous-direct-browser-access": "true",
        "x-app": "cli",
        "user-agent": "claude-cli/2.0.14 (external, sdk-cli)",
        "x-claude-code-session-id": session,
        "x-stainless-arch": "x64",
        "x-stainless-lang": "js",
        "x-stainless-os": "Linux",
        "x-stainless-package-version": "0.60.0",
        "x-stainless-retry-count": "0",
        "x-stainless-runtime": "node",
        "x-stainless-runtime-version": "v22.19.0",
        "x-stainless-timeout": "600",
        "accept-language": "*",
        "sec-fetch-mode": "cors",
    }
    return body, headers


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", required=True, help="directory with poolgate and poolgate-mock-upstream")
    p.add_argument("--litellm-venv", required=True)
    p.add_argument("--portkey-prefix", required=True)
    p.add_argument("--versions", required=True, help="JSON file of the versions installed")
    p.add_argument("--out", default="target/peers")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per phase")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up per target and body kind")
    p.add_argument("--only", default=",".join(ALL), help="comma-separated targets (direct is always measured)")
    p.add_argument("--litellm-workers", type=int, default=os.cpu_count() or 1)
    return p.parse_args()


def start(names, args, work, out):
    """Start each target into `out` (so that what started is stopped even if a later one fails)."""
    up = out["direct"]
    for name in names:
        if name == "haproxy":
            out[name] = targets.haproxy(up.url, work)
        elif name == "poolgate":
            out[name] = targets.poolgate(args.bin, up.url, work)
        elif name == "litellm":
            out[name] = targets.litellm(args.litellm_venv, up.url, work, args.litellm_workers)
        elif name == "portkey":
            out[name] = targets.portkey(args.portkey_prefix, up.url, work)
        print(f"started {name} at {out[name].url}", file=sys.stderr, flush=True)


def scripts(tgts, work):
    """One wrk script per target and body kind: same body and headers, plus the target's own."""
    paths = {}
    for name, t in tgts.items():
        for kind, stream in (("json", False), ("stream", True)):
            body, headers = claude_code_request(stream)
            headers = dict(headers, **t.headers)
            headers["x-api-key"] = t.client_key
            path = os.path.join(work, f"{name}-{kind}.lua")
            measure.write_script(path, body, headers, stream)
            paths[(name, kind)] = path
    return paths


def measure_all(tgts, paths, args, failed):
    live = [n for n in tgts if len(failed.get(n, {})) < 2]
    ok = lambda n, k: k not in failed.get(n, {})  # noqa: E731
    for name in live:
        for kind in ("json", "stream"):
            if ok(name, kind):
                measure.wrk(tgts[name].url, paths[(name, kind)], 4, args.warmup)
    before = measure.scrape_stages(tgts["poolgate"].url) if "poolgate" in live else None
    runs = {(n, k, c): [] for n in live for k in ("json", "stream") for c in (1, 32) if ok(n, k)}
    loads = []
    for r in range(args.rounds):
        order = live[r % len(live) :] + live[: r % len(live)]
        loads.append(open("/proc/loadavg").read().split()[:3])
        for name in order:
            for kind in [k for k in ("json", "stream") if ok(name, k)]:
                for conns in (1, 32):
                    res = measure.phase(tgts[name], paths[(name, kind)], conns, args.seconds)
                    runs[(name, kind, conns)].append(res)
                    print(
                        f"round {r + 1} {name:9} {kind:6} c={conns:<2} {res['rps']:9.0f} req/s "
                        f"p50 {res['p50_us']:7.0f} us cpu {res['cpu_us_per_req']:7.0f} us/req errors {res['errors']}",
                        file=sys.stderr,
                        flush=True,
                    )
    stages = measure.stage_means(before, measure.scrape_stages(tgts["poolgate"].url)) if before else None
    return runs, stages, loads


def summarize(runs):
    """The median over rounds of each figure, and the sum of requests and errors."""
    out = {}
    for (name, kind, conns), rs in runs.items():
        d = out.setdefault(name, {}).setdefault(kind, {})
        med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
        d[f"c{conns}"] = {
            "p50_us": med("p50_us"),
            "p99_us": med("p99_us"),
            "rps": med("rps"),
            "cpu_us_per_req": med("cpu_us_per_req"),
            "requests": sum(r["requests"] for r in rs),
            "errors": sum(r["errors"] for r in rs),
            "rounds": rs,
        }
    return out


def main():
    args = parse_args()
    names = [n for n in ALL[1:] if n in args.only.split(",")]
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    up = targets.mock(args.bin, work)
    tgts = {"direct": up}
    failed = {}
    spreads = {}
    try:
        try:
            start(names, args, work, tgts)
        except RuntimeError as e:
            sys.exit(f"a target did not start: {e} (logs in {work})")
        body_json, headers = claude_code_request(False)
        body_stream, _ = claude_code_request(True)
        for name, t in tgts.items():
            problems = targets.check(t, headers, body_json, body_stream)
            spreads[name] = targets.spread(t, headers, body_json, SESSION)
            if spreads[name]:
                print(f"{name} spread 24 requests of 24 sessions over: {spreads[name]}", file=sys.stderr)
            for kind, problem in problems.items():
                failed.setdefault(name, {})[kind] = problem
                print(f"{name} {kind} FAILED the answer check: {problem}", file=sys.stderr)
        paths = scripts(tgts, work)
        t0 = time.time()
        runs, stages, loads = measure_all(tgts, paths, args, failed)
        loads.append(open("/proc/loadavg").read().split()[:3])
        result = {
            "versions": json.load(open(args.versions)),
            "seconds": args.seconds,
            "rounds": args.rounds,
            "litellm_workers": args.litellm_workers,
            "loadavg_per_round": loads,
            "wall_s": time.time() - t0,
            "failed": failed,
            "spread": spreads,
            "figures": summarize(runs),
            "poolgate_stages": stages,
        }
    finally:
        for t in tgts.values():
            t.stop()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = report.markdown(result)
    print(md)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    report.plots(result, args.out)
    # A peer that fails is reported in the table; the run fails only if the path
    # everything is compared to, or poolgate itself, did not answer.
    if failed.keys() & {"direct", "haproxy", "poolgate"}:
        sys.exit(2)


if __name__ == "__main__":
    main()
