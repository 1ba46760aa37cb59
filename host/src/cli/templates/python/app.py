"""{{name}}: a poolgate ranker. It sends each request to the least busy account
(fewest requests in flight); accounts that cannot serve now go last.

Build: ./build.sh      Test: poolgate plugin test target/{{name}}.wasm fixtures
`wit_world` is generated from wit/policy.wit at build time; for editor hints run
`componentize-py -d wit -w policy bindings .` once (and do not commit the output).
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import Ranking


def _explained(method):
    """An unexpected exception becomes `Err("<type>: <message> at <where>")`:
    poolgate records it as the stage's cause (`error`) instead of an opaque
    trap. `Err` raised on purpose passes through unchanged. (The traceback is
    walked by hand: `traceback.format_exc` reads source files, which a
    sandboxed plugin cannot.)"""

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
            raise Err(f"{type(e).__name__}: {e} at {' < '.join(reversed(frames[-4:]))}")

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

    def observe(self, req, account, ended):
        pass
