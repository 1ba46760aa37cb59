// {{name}}: a poolgate ranker. It sends each request to the least busy account
// (fewest requests in flight); accounts that cannot serve now go last.
//
// Build and test: poolgate plugin build .   (→ dist/{{name}}.wasm once the fixtures pass)
// WIT in JavaScript: records are objects with camelCase fields, enums are
// strings, u64 is a BigInt, a returned value is `ok` and a thrown one is `err`.

export const ranker = {
  configure(config, pool) {
    for (const key of Object.keys(JSON.parse(config || '{}'))) {
      throw `unknown option \`${key}\``;
    }
  },

  rank(req, candidates, windows) {
    const order = candidates.map((_, i) => i);
    // Array.prototype.sort is stable: ties keep the previous stage's order.
    order.sort((a, b) => {
      const ua = candidates[a].usable ? 0 : 1;
      const ub = candidates[b].usable ? 0 : 1;
      return ua - ub || candidates[a].inFlight - candidates[b].inFlight;
    });
    return { order, reason: '{{reason}}', detail: undefined };
  },

  observe(req, account, ended) {},
};
