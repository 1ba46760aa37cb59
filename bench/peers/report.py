"""The comparison as a markdown table and three SVG plots, from one run's results.

Every figure is put next to the direct path (the client on the mock) and next
to HAProxy measured in the same run: absolute times on this machine move with
its load, ratios within one interleaved run hold much better.
"""

import os


def fmt(x, digits=0):
    if x is None:
        return "—"
    if x != x:
        return "failed"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b <= 0:
        return "—"
    return f"{a / b:.2f}×" if a / b < 10 else f"{a / b:.0f}×"


def rows(result, kind):
    fig = result["figures"]
    d = fig.get("direct", {}).get(kind)
    h = fig.get("haproxy", {}).get(kind)
    h_add50 = h["c1"]["p50_us"] - d["c1"]["p50_us"] if h else None
    h_add99 = h["c1"]["p99_us"] - d["c1"]["p99_us"] if h else None
    out = []
    for name, kinds in fig.items():
        if kind not in kinds:
            why = result["failed"].get(name, {}).get(kind, "not measured")
            out.append(f"| {name} | FAILED: {str(why)[:160]} |" + " |" * 11)
            continue
        f = kinds[kind]
        c1, c32 = f["c1"], f["c32"]
        add50 = c1["p50_us"] - d["c1"]["p50_us"] if name != "direct" else None
        add99 = c1["p99_us"] - d["c1"]["p99_us"] if name != "direct" else None
        cpu = c32["cpu_us_per_req"]
        hcpu = h["c32"]["cpu_us_per_req"] if h else None
        errors = c1["errors"] + c32["errors"]
        served = c1["requests"] + c32["requests"]
        out.append(
            "| "
            + " | ".join(
                [
                    f"**{name}**" if name == "poolgate" else name,
                    fmt(c1["p50_us"]),
                    fmt(c1["p99_us"]),
                    fmt(add50),
                    fmt(add99),
                    ratio(add50, h_add50) if name not in ("direct", "haproxy") else "—",
                    fmt(c32["rps"]),
                    ratio(c32["rps"], d["c32"]["rps"]),
                    ratio(c32["rps"], h["c32"]["rps"]) if h else "—",
                    fmt(cpu) if name != "direct" else f"({fmt(cpu)} mock)",
                    ratio(cpu, hcpu) if name != "direct" else "—",
                    fmt(c1["cpu_us_per_req"]) if name != "direct" else "—",
                    f"{errors} / {served:,}",
                ]
            )
            + " |"
        )
    return out, (h_add50, h_add99)


HEAD = (
    "| target | p50 c=1 µs | p99 c=1 µs | added p50 µs | added p99 µs | added p50 × HAProxy's "
    "| req/s c=32 | × direct | × HAProxy | CPU µs/req c=32 | × HAProxy | CPU µs/req c=1 | errors / requests |\n"
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
)


def markdown(result):
    v = result["versions"]
    lines = [
        "## poolgate and its peers on one mock upstream",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        f"{result['rounds']} interleaved rounds of {result['seconds']:g} s per phase (median of rounds); "
        f"LiteLLM with {result['litellm_workers']} worker(s). Load average at each round's start: "
        + "; ".join(" ".join(x) for x in result["loadavg_per_round"][:-1])
        + f" (at the end: {' '.join(result['loadavg_per_round'][-1])}).",
        "",
        "Added latency is the target's minus the direct path's; it includes all the gateway's JSON "
        "work (body parsing, translation, routing). CPU is the gateway's whole process tree "
        "(utime+stime from /proc, all workers and threads) over the c=32 phase, per request served.",
        "",
    ]
    for kind, title in (("json", "JSON answer"), ("stream", "Streamed answer (SSE)")):
        body, _ = rows(result, kind)
        lines += [f"### {title}", "", HEAD, *body, ""]
    if result["failed"]:
        lines += ["### Answers that failed the check (that body kind not measured for that target)", ""]
        for name, problems in result["failed"].items():
            for kind, problem in problems.items():
                lines.append(f"- **{name}**, {kind}: {problem}")
        lines.append("")
    spreads = {k: v for k, v in result.get("spread", {}).items() if v}
    if spreads:
        lines += ["### Keys chosen (24 JSON requests of 24 sessions before the rounds, by each gateway's own header; "
            "the measured load is one session, which poolgate keeps on one account)", ""]
        for name, counts in spreads.items():
            lines.append(f"- {name}: {len(counts)} distinct — " + ", ".join(f"{k}: {n}" for k, n in counts.items()))
        lines.append("")
    stages = result.get("poolgate_stages")
    if stages:
        lines += [
            "### poolgate's chain, per stage (from its /metrics, over every ranking of the run)",
            "",
            "Wall time of each stage per ranking (one ranking per request), inside the added latency and CPU above.",
            "",
            "| stage | rankings | mean µs | p50 µs (≤ bucket bound) |",
            "|---|--:|--:|--:|",
        ]
        for name, s in sorted(stages.items(), key=lambda kv: kv[0] == "(whole chain)"):
            p50 = f"≤ {s['p50_le_us']:g}" if s.get("p50_le_us") is not None else "—"
            lines.append(f"| {name} | {s['count']:,.0f} | {s['mean_us']:.1f} | {p50} |")
        lines.append("")
    return "\n".join(lines)


def plots(result, out):
    """Three SVGs: CPU per request, added latency at c=1, throughput at c=32."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        # Text as text and no date or random ids: small SVGs that diff.
        matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "poolgate-peers"})
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots")
        return
    fig = result["figures"]
    names = [n for n in fig if n != "direct"]

    def val(n, k, c, key):
        return fig[n][k][c][key] if k in fig[n] else float("nan")

    kinds = (("json", "JSON"), ("stream", "stream (SSE)"))
    meta = f"{result['rounds']} rounds × {result['seconds']:g} s, loadavg {' '.join(result['loadavg_per_round'][0])}"

    def bars(ax, series, ylabel, title):
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series):
            xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(names))]
            rects = ax.bar(xs, [0 if v != v else v for v in vals], width, label=label)
            ax.bar_label(rects, labels=[fmt(v) for v in vals], fontsize=7, rotation=90, padding=2)
            for x, v in zip(xs, vals):
                if v != v:
                    ax.annotate("failed", (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 4),
                                textcoords="offset points", ha="center", fontsize=7, rotation=90, color="red")
        ax.set_xticks(range(len(names)), names)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.margins(y=0.3)

    def save(f, name):
        f.text(0.99, 0.01, meta, ha="right", fontsize=6, color="gray")
        f.tight_layout()
        f.savefig(os.path.join(out, name), metadata={"Date": None})
        plt.close(f)

    f, ax = plt.subplots(figsize=(7, 4))
    cpu = [(label, [val(n, k, "c32", "cpu_us_per_req") for n in names]) for k, label in kinds]
    bars(ax, cpu, "µs of CPU per request (log)", "Gateway CPU per request at c=32 (whole process tree)")
    save(f, "peers-cpu.svg")

    f, ax = plt.subplots(figsize=(7, 4))
    d = fig["direct"]
    # p50 only: at c=1 on a loaded 2-core machine the p99 of every path, the
    # direct one included, is a scheduler stall (see the table).
    lat = [(label, [val(n, k, "c1", "p50_us") - d[k]["c1"]["p50_us"] for n in names]) for k, label in kinds]
    bars(ax, lat, "µs added over direct, p50 (log)", "Latency added at c=1, p50 (target minus direct)")
    save(f, "peers-latency.svg")

    f, ax = plt.subplots(figsize=(7, 4))
    names = list(fig)
    thr = [(label, [val(n, k, "c32", "rps") for n in names]) for k, label in kinds]
    bars(ax, thr, "requests/s (log)", "Throughput at c=32 (2 shared cores, wrk on the same machine)")
    save(f, "peers-throughput.svg")
