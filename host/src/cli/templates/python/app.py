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


class Ranker(exports.Ranker):
    def configure(self, config, pool):
        options = json.loads(config or "{}")
        for key in options:
            raise Err(f"unknown option `{key}`")

    def rank(self, req, candidates, windows):
        order = sorted(range(len(candidates)), key=lambda i: (not candidates[i].usable, candidates[i].in_flight))
        return Ranking(order, "{{reason}}", None)

    def observe(self, req, account, ended):
        pass
