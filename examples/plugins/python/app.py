"""reset-soonest, in Python: prefer the accounts whose 5h window resets soonest,
skip any whose 5h utilization is above `max_utilization`.

Built into a component with componentize-py (see build.sh); the classes and
functions imported from `wit_world` are generated from wit/policy.wit at build
time. The same policy is written in Rust, JavaScript and C next to this
directory, and all four pass ../fixtures.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import (
    Outcome_RateLimited,
    Ranking,
    WindowKind,
)

# Options and their defaults; any other key is refused by name.
DEFAULTS = {"max_utilization": 0.9, "sort": True, "rate_limit_penalty_ms": 0}
NO_RESET = 2**64  # accounts without a known 5h reset go after every known one


def _options(config: str) -> dict:
    try:
        given = json.loads(config or "{}")
    except ValueError as e:
        raise Err(f"config is not valid JSON: {e}")
    if not isinstance(given, dict):
        raise Err("config must be a table")
    for key in given:
        if key not in DEFAULTS:
            raise Err(f"unknown option `{key}` (expected one of max_utilization, sort, rate_limit_penalty_ms)")
    opts = {**DEFAULTS, **given}
    mu = opts["max_utilization"]
    # bool is an int in Python: refuse `true` where a number is meant.
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0.0 <= mu <= 1.0:
        raise Err("option `max_utilization` must be a number from 0 to 1")
    if not isinstance(opts["sort"], bool):
        raise Err("option `sort` must be true or false")
    pen = opts["rate_limit_penalty_ms"]
    if isinstance(pen, bool) or not isinstance(pen, int) or pen < 0:
        raise Err("option `rate_limit_penalty_ms` must be a whole number of ms, 0 or more")
    opts["max_utilization"] = float(mu)
    return opts


# What configure decided, for the life of the component instance. componentize-py
# creates a fresh `Ranker` object for every call, so per-instance memory lives at
# module level, not on `self`; memory that must outlive the instance (a hot swap,
# a trapped instance) goes through host.state_*.
_opts = dict(DEFAULTS)
_ids: list = []


def _explained(method):
    """An unexpected exception becomes `Err("<type>: <message> at <where>")`:
    poolgate records it as the stage's cause (`error`) instead of an opaque
    trap. `Err` raised on purpose passes through unchanged. `observe` has no
    error to return, so the same line is logged at error level before the
    exception ends the call: poolgate puts it in the recorded cause. (The
    traceback is walked by hand: `traceback.format_exc` reads source files,
    which a sandboxed plugin cannot.)"""

    def wrapped(*args):
        try:
            return method(*args)
        except Err:
            raise
        except Exception as e:
            frames, tb = [], e.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                frames.append(f"{code.co_name} ({code.co_filename}:{tb.tb_lineno})")
                tb = tb.tb_next
            why = f"{type(e).__name__}: {e} at {' < '.join(reversed(frames[-4:]))}"
            if method.__name__ == "observe":
                host.log(host.Level.ERROR, why)
            raise Err(why)

    return wrapped


class Ranker(exports.Ranker):
    """The exported `ranker` interface."""

    @_explained
    def configure(self, config, pool):
        global _ids
        _opts.update(_options(config))
        _ids = [a.id for a in pool]
        host.log(host.Level.DEBUG, f"reset-soonest (python) configured for {len(pool)} accounts")

    @_explained
    def rank(self, req, candidates, windows):
        # One pass over the flat window list: account pool index -> its 5h window.
        five_hour = {}
        for w in windows:
            if w.kind == WindowKind.FIVE_HOUR and w.account not in five_hour:
                five_hour[w.account] = w

        keep, skipped = [], []
        for pos, c in enumerate(candidates):
            w = five_hour.get(c.id)
            hot = w is not None and w.utilization > _opts["max_utilization"]
            limited = _opts["rate_limit_penalty_ms"] > 0 and host.state_get("429:" + _ids[c.id]) is not None
            (skipped if hot or limited else keep).append(pos)

        if not keep:
            return Ranking(list(range(len(candidates))), "", "every candidate is over the limit; order left as is")

        def key(pos):
            c = candidates[pos]
            w = five_hour.get(c.id)
            reset = w.resets_at_ms if w is not None and w.resets_at_ms is not None else NO_RESET
            return (not c.usable, reset)

        if _opts["sort"]:
            keep.sort(key=key)  # stable: ties keep the input order
        detail = "skipped: " + ", ".join(_ids[candidates[p].id] for p in skipped) if skipped else None
        return Ranking(keep, "reset_soonest" if _opts["sort"] else "", detail)

    @_explained
    def observe(self, req, account, ended):
        # `observe` returns nothing to put an `Err` in: an exception here is
        # logged, then a trap, recorded as an `observe` failure of the stage
        # with the logged line.
        if _opts["rate_limit_penalty_ms"] > 0 and isinstance(ended, Outcome_RateLimited) and account < len(_ids):
            host.state_set("429:" + _ids[account], "1", _opts["rate_limit_penalty_ms"])
