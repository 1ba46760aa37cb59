"""{{name}}: a poolgate ranker. It sends each request to the least busy account
(fewest requests in flight); accounts that cannot serve now go last.

Build and test: poolgate plugin build .   (→ dist/{{name}}.wasm once the fixtures pass)
`wit_world` is generated from wit/policy.wit at build time; for editor hints run
`componentize-py -d wit -w policy bindings .` once (and do not commit the output).
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import Ranking


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
    @_explained
    def configure(self, config, pool):
        options = json.loads(config or "{}")
        for key in options:
            raise Err(f"unknown option `{key}`")

    @_explained
    def rank(self, req, candidates, windows):
        order = sorted(range(len(candidates)), key=lambda i: (not candidates[i].usable, candidates[i].in_flight))
        return Ranking(order, "{{reason}}", None)

    @_explained
    def observe(self, req, account, ended):
        pass
