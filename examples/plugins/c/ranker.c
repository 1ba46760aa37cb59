// reset-soonest, in C: prefer the accounts whose 5h window resets soonest, skip
// any whose 5h utilization is above `max_utilization`.
//
// `policy.h` is generated from wit/policy.wit at build time (build.sh). The C
// bindings' ownership rules: the guest owns every argument it receives and must
// free it; what it returns (the ranking, an error string) must be allocated with
// malloc, and the generated glue frees it after the host has read it. The same
// policy is written in Rust, Python and JavaScript next to this directory, and
// all four pass ../fixtures.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

typedef exports_poolgate_policy_ranker_list_account_info_t pool_list_t;
typedef exports_poolgate_policy_ranker_list_account_t account_list_t;
typedef exports_poolgate_policy_ranker_list_quota_window_t window_list_t;
typedef poolgate_policy_types_account_t account_t;
typedef poolgate_policy_types_quota_window_t window_t;

// Options, and what configure keeps for the instance's life.
static double max_utilization = 0.9;
static bool sort_by_reset = true;
static uint64_t penalty_ms = 0;
static pool_list_t pool;          // owned: the account ids, for detail and state keys
static int32_t *five_hour = NULL; // per pool index: its 5h window in this call, or -1

// ---- a tiny reader for the flat JSON object the host hands to configure ----

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
  return p;
}

static bool set_err(policy_string_t *err, const char *msg) {
  policy_string_dup(err, msg);
  return false;
}

// Reads one option value at *p into the named option. Keys are plain ASCII.
static bool read_option(const char *key, size_t key_len, const char **p, policy_string_t *err) {
  char msg[200];
  const char *v = skip_ws(*p);
  char *end = NULL;
#define IS(name) (key_len == strlen(name) && memcmp(key, name, key_len) == 0)
  if (IS("max_utilization")) {
    double d = strtod(v, &end);
    if (end == v || d < 0.0 || d > 1.0) return set_err(err, "option `max_utilization` must be a number from 0 to 1");
    max_utilization = d;
  } else if (IS("sort")) {
    if (strncmp(v, "true", 4) == 0) { sort_by_reset = true; end = (char *)v + 4; }
    else if (strncmp(v, "false", 5) == 0) { sort_by_reset = false; end = (char *)v + 5; }
    else return set_err(err, "option `sort` must be true or false");
  } else if (IS("rate_limit_penalty_ms")) {
    if (*v < '0' || *v > '9') return set_err(err, "option `rate_limit_penalty_ms` must be a whole number of ms, 0 or more");
    unsigned long long n = strtoull(v, &end, 10);
    if (*end == '.' || *end == 'e' || *end == 'E')
      return set_err(err, "option `rate_limit_penalty_ms` must be a whole number of ms, 0 or more");
    penalty_ms = n;
  } else {
    snprintf(msg, sizeof msg, "unknown option `%.*s` (expected one of max_utilization, sort, rate_limit_penalty_ms)",
             (int)key_len, key);
    return set_err(err, msg);
  }
#undef IS
  *p = end;
  return true;
}

static bool parse_options(const char *json, policy_string_t *err) {
  const char *p = skip_ws(json);
  if (*p == '\0') return true; // no config at all: defaults
  if (*p != '{') return set_err(err, "config must be a table");
  p = skip_ws(p + 1);
  while (*p != '}') {
    if (*p != '"') return set_err(err, "config is not valid JSON: expected an option name");
    const char *key = ++p;
    while (*p && *p != '"') p++;
    if (*p != '"') return set_err(err, "config is not valid JSON: unterminated string");
    size_t key_len = (size_t)(p - key);
    p = skip_ws(p + 1);
    if (*p != ':') return set_err(err, "config is not valid JSON: expected `:`");
    p++;
    if (!read_option(key, key_len, &p, err)) return false;
    p = skip_ws(p);
    if (*p == ',') p = skip_ws(p + 1);
    else if (*p != '}') return set_err(err, "config is not valid JSON: expected `,` or `}`");
  }
  return true;
}

// ---- the exported ranker ----

bool exports_poolgate_policy_ranker_configure(policy_string_t *config, pool_list_t *new_pool, policy_string_t *err) {
  // The config string is not NUL-terminated; copy it before parsing.
  char *json = malloc(config->len + 1);
  memcpy(json, config->ptr, config->len);
  json[config->len] = '\0';
  policy_string_free(config);
  max_utilization = 0.9;
  sort_by_reset = true;
  penalty_ms = 0;
  bool ok = parse_options(json, err);
  free(json);
  if (!ok) {
    exports_poolgate_policy_ranker_list_account_info_free(new_pool);
    return false;
  }
  exports_poolgate_policy_ranker_list_account_info_free(&pool);
  pool = *new_pool; // keep the ids: ownership moves to this instance
  free(five_hour);
  five_hour = malloc((pool.len + 1) * sizeof *five_hour);

  char msg[96];
  snprintf(msg, sizeof msg, "reset-soonest (c) configured for %zu accounts", pool.len);
  policy_string_t m;
  policy_string_set(&m, msg);
  poolgate_policy_host_log(POOLGATE_POLICY_HOST_LEVEL_DEBUG, &m);
  return true;
}

// The state key of account `index`: "429:<id>".
static void penalty_key(uint32_t index, policy_string_t *key) {
  policy_string_t id = pool.ptr[index].id;
  key->len = 4 + id.len;
  key->ptr = malloc(key->len);
  memcpy(key->ptr, "429:", 4);
  memcpy(key->ptr + 4, id.ptr, id.len);
}

static bool rate_limited_recently(uint32_t index) {
  if (penalty_ms == 0 || index >= pool.len) return false;
  policy_string_t key, value;
  penalty_key(index, &key);
  bool found = poolgate_policy_host_state_get(&key, &value);
  policy_string_free(&key);
  if (found) policy_string_free(&value);
  return found;
}

// What qsort compares: usable first, then the 5h reset, then input position
// (qsort is not stable; the position keeps ties in the previous stage's order).
typedef struct {
  uint32_t position;
  bool unusable;
  uint64_t reset;
} sort_key_t;

static int by_key(const void *a, const void *b) {
  const sort_key_t *x = a, *y = b;
  if (x->unusable != y->unusable) return x->unusable ? 1 : -1;
  if (x->reset != y->reset) return x->reset < y->reset ? -1 : 1;
  return x->position < y->position ? -1 : x->position > y->position;
}

// Appends `s` to the growing detail buffer.
static void append(char **buf, size_t *len, size_t *cap, const uint8_t *s, size_t n) {
  if (*len + n + 1 > *cap) {
    *cap = (*len + n + 1) * 2;
    *buf = realloc(*buf, *cap);
  }
  memcpy(*buf + *len, s, n);
  *len += n;
}

bool exports_poolgate_policy_ranker_rank(exports_poolgate_policy_ranker_request_t *req, account_list_t *candidates,
                                         window_list_t *windows, exports_poolgate_policy_ranker_ranking_t *ret,
                                         policy_string_t *err) {
  (void)err;
  size_t n = candidates->len;
  // One pass over the flat window list: pool index -> its 5h window.
  for (size_t i = 0; i < pool.len; i++) five_hour[i] = -1;
  for (size_t i = 0; i < windows->len; i++) {
    window_t *w = &windows->ptr[i];
    if (w->kind == POOLGATE_POLICY_TYPES_WINDOW_KIND_FIVE_HOUR && w->account < pool.len && five_hour[w->account] < 0)
      five_hour[w->account] = (int32_t)i;
  }

  sort_key_t *keep = malloc((n + 1) * sizeof *keep);
  size_t kept = 0;
  char *detail = NULL;
  size_t dlen = 0, dcap = 0;
  for (uint32_t pos = 0; pos < n; pos++) {
    account_t *c = &candidates->ptr[pos];
    window_t *w = c->id < pool.len && five_hour[c->id] >= 0 ? &windows->ptr[five_hour[c->id]] : NULL;
    bool hot = w && w->utilization > max_utilization;
    if (hot || rate_limited_recently(c->id)) {
      append(&detail, &dlen, &dcap, (const uint8_t *)(dlen ? ", " : "skipped: "), dlen ? 2 : 9);
      if (c->id < pool.len) append(&detail, &dlen, &dcap, pool.ptr[c->id].id.ptr, pool.ptr[c->id].id.len);
      continue;
    }
    keep[kept++] = (sort_key_t){
        .position = pos,
        .unusable = !c->usable,
        .reset = w && w->resets_at_ms.is_some ? w->resets_at_ms.val : UINT64_MAX,
    };
  }

  uint32_t *order;
  if (kept == 0) {
    // Every candidate is over the limit: hand the input on, claim nothing.
    order = malloc((n + 1) * sizeof *order);
    for (uint32_t i = 0; i < n; i++) order[i] = i;
    ret->order = (policy_list_u32_t){order, n};
    policy_string_set(&ret->reason, "");
    ret->detail.is_some = true;
    policy_string_dup(&ret->detail.val, "every candidate is over the limit; order left as is");
    free(detail);
  } else {
    if (sort_by_reset) qsort(keep, kept, sizeof *keep, by_key);
    order = malloc(kept * sizeof *order);
    for (size_t i = 0; i < kept; i++) order[i] = keep[i].position;
    ret->order = (policy_list_u32_t){order, kept};
    // Returned strings are freed by the glue: malloc them (an empty one is never freed).
    if (sort_by_reset) policy_string_dup(&ret->reason, "reset_soonest");
    else policy_string_set(&ret->reason, "");
    ret->detail.is_some = detail != NULL;
    if (detail) ret->detail.val = (policy_string_t){(uint8_t *)detail, dlen};
  }
  free(keep);
  exports_poolgate_policy_ranker_request_free(req);
  exports_poolgate_policy_ranker_list_account_free(candidates);
  exports_poolgate_policy_ranker_list_quota_window_free(windows);
  return true;
}

void exports_poolgate_policy_ranker_observe(exports_poolgate_policy_ranker_request_t *req, uint32_t account,
                                            exports_poolgate_policy_ranker_outcome_t *ended) {
  if (penalty_ms > 0 && ended->tag == POOLGATE_POLICY_TYPES_OUTCOME_RATE_LIMITED && account < pool.len) {
    policy_string_t key, one;
    penalty_key(account, &key);
    policy_string_set(&one, "1");
    uint64_t ttl = penalty_ms;
    poolgate_policy_host_state_set(&key, &one, &ttl);
    policy_string_free(&key);
  }
  exports_poolgate_policy_ranker_outcome_free(ended);
  exports_poolgate_policy_ranker_request_free(req);
}
