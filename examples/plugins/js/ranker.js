// reset-soonest, in JavaScript: prefer the accounts whose 5h window resets
// soonest, skip any whose 5h utilization is above `max_utilization`.
//
// Built into a component with componentize-js (see build.mjs). The WIT maps to
// JavaScript as: records → objects with camelCase fields; enums → strings
// ('five-hour'); u64 → BigInt; option → value or undefined; a returned value is
// `ok`, a thrown one is `err`. The same policy is written in Rust, Python and C
// next to this directory, and all four pass ../fixtures.

import { log, stateGet, stateSet } from 'poolgate:policy/host@0.1.1';

const DEFAULTS = { max_utilization: 0.9, sort: true, rate_limit_penalty_ms: 0 };
const NO_RESET = 2n ** 64n; // accounts without a known 5h reset go last

// Module state lives as long as the component instance; durable memory goes
// through the host's state store (stateGet/stateSet).
let opts = DEFAULTS;
let ids = [];

function parseOptions(config) {
  let given;
  try {
    given = JSON.parse(config || '{}');
  } catch (e) {
    throw `config is not valid JSON: ${e.message}`;
  }
  if (given === null || typeof given !== 'object' || Array.isArray(given)) {
    throw 'config must be a table';
  }
  for (const key of Object.keys(given)) {
    if (!(key in DEFAULTS)) {
      throw `unknown option \`${key}\` (expected one of max_utilization, sort, rate_limit_penalty_ms)`;
    }
  }
  const o = { ...DEFAULTS, ...given };
  if (typeof o.max_utilization !== 'number' || !(o.max_utilization >= 0 && o.max_utilization <= 1)) {
    throw 'option `max_utilization` must be a number from 0 to 1';
  }
  if (typeof o.sort !== 'boolean') {
    throw 'option `sort` must be true or false';
  }
  const pen = o.rate_limit_penalty_ms;
  if (!Number.isSafeInteger(pen) || pen < 0) {
    throw 'option `rate_limit_penalty_ms` must be a whole number of ms, 0 or more';
  }
  return o;
}

export const ranker = {
  configure(config, pool) {
    opts = parseOptions(config);
    ids = pool.map((a) => a.id);
    log('debug', `reset-soonest (js) configured for ${pool.length} accounts`);
  },

  rank(req, candidates, windows) {
    // One pass over the flat window list: account pool index -> its 5h window.
    const fiveHour = new Map();
    for (const w of windows) {
      if (w.kind === 'five-hour' && !fiveHour.has(w.account)) fiveHour.set(w.account, w);
    }

    const keep = [];
    const skipped = [];
    candidates.forEach((c, pos) => {
      const w = fiveHour.get(c.id);
      const hot = w !== undefined && w.utilization > opts.max_utilization;
      const limited = opts.rate_limit_penalty_ms > 0 && stateGet(`429:${ids[c.id]}`) !== undefined;
      (hot || limited ? skipped : keep).push(pos);
    });

    if (keep.length === 0) {
      return {
        order: candidates.map((_, i) => i),
        reason: '',
        detail: 'every candidate is over the limit; order left as is',
      };
    }
    if (opts.sort) {
      const key = (pos) => {
        const w = fiveHour.get(candidates[pos].id);
        return w !== undefined && w.resetsAtMs !== undefined ? w.resetsAtMs : NO_RESET;
      };
      // Array.prototype.sort is stable: ties keep the previous stage's order.
      keep.sort((a, b) => {
        const ua = candidates[a].usable ? 0 : 1;
        const ub = candidates[b].usable ? 0 : 1;
        if (ua !== ub) return ua - ub;
        const ka = key(a);
        const kb = key(b);
        return ka < kb ? -1 : ka > kb ? 1 : 0;
      });
    }
    return {
      order: keep,
      reason: opts.sort ? 'reset_soonest' : '',
      detail: skipped.length ? `skipped: ${skipped.map((p) => ids[candidates[p].id]).join(', ')}` : undefined,
    };
  },

  observe(req, account, ended) {
    if (opts.rate_limit_penalty_ms > 0 && ended.tag === 'rate-limited' && account < ids.length) {
      stateSet(`429:${ids[account]}`, '1', BigInt(opts.rate_limit_penalty_ms));
    }
  },
};
