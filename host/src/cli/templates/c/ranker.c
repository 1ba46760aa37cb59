// {{name}}: a poolgate ranker. It sends each request to the least busy account
// (fewest requests in flight); accounts that cannot serve now go last.
//
// Build and test: poolgate plugin build .   (→ dist/{{name}}.wasm once the fixtures pass)
// policy.h is generated from wit/policy.wit by build.sh. Ownership: free every
// argument you receive; malloc everything you return (the glue frees it).

#include <stdlib.h>
#include <string.h>

#include "policy.h"

// Ends the call when the ranker cannot go on, saying why: poolgate records the
// message as the stage's cause (a trap, with this line and the function it
// happened in). From rank or configure, returning false with `err` set is
// kinder: the request is still served and the cause is an `error`.
static void fail(const char *why) {
  policy_string_t message;
  policy_string_dup(&message, why);
  poolgate_policy_host_log(POOLGATE_POLICY_HOST_LEVEL_ERROR, &message);
  abort();
}

bool exports_poolgate_policy_ranker_configure(policy_string_t *config,
                                              exports_poolgate_policy_ranker_list_account_info_t *pool,
                                              policy_string_t *err) {
  // No options: anything but an empty table is refused.
  bool empty = true;
  for (size_t i = 0; i < config->len; i++) {
    char ch = (char)config->ptr[i];
    if (ch != '{' && ch != '}' && ch != ' ' && ch != '\n') empty = false;
  }
  policy_string_free(config);
  exports_poolgate_policy_ranker_list_account_info_free(pool);
  if (!empty) policy_string_dup(err, "this ranker takes no options");
  return empty;
}

typedef struct {
  uint32_t position;
  bool unusable;
  uint32_t in_flight;
} sort_key_t;

static int by_key(const void *a, const void *b) {
  const sort_key_t *x = a, *y = b;
  if (x->unusable != y->unusable) return x->unusable ? 1 : -1;
  if (x->in_flight != y->in_flight) return x->in_flight < y->in_flight ? -1 : 1;
  return x->position < y->position ? -1 : 1; // qsort is not stable: keep input order
}

bool exports_poolgate_policy_ranker_rank(exports_poolgate_policy_ranker_request_t *req,
                                         exports_poolgate_policy_ranker_list_account_t *candidates,
                                         exports_poolgate_policy_ranker_list_quota_window_t *windows,
                                         exports_poolgate_policy_ranker_ranking_t *ret, policy_string_t *err) {
  (void)err;
  size_t n = candidates->len;
  sort_key_t *keys = malloc((n + 1) * sizeof *keys);
  for (uint32_t i = 0; i < n; i++)
    keys[i] = (sort_key_t){i, !candidates->ptr[i].usable, candidates->ptr[i].in_flight};
  qsort(keys, n, sizeof *keys, by_key);
  uint32_t *order = malloc((n + 1) * sizeof *order);
  for (size_t i = 0; i < n; i++) order[i] = keys[i].position;
  free(keys);
  ret->order = (policy_list_u32_t){order, n};
  policy_string_dup(&ret->reason, "{{reason}}");
  ret->detail.is_some = false;
  exports_poolgate_policy_ranker_request_free(req);
  exports_poolgate_policy_ranker_list_account_free(candidates);
  exports_poolgate_policy_ranker_list_quota_window_free(windows);
  return true;
}

void exports_poolgate_policy_ranker_observe(exports_poolgate_policy_ranker_request_t *req, uint32_t account,
                                            exports_poolgate_policy_ranker_outcome_t *ended) {
  (void)account;
  // Learn from outcomes here; call fail("why") if something is wrong.
  if (ended == NULL) fail("observe: no outcome");
  exports_poolgate_policy_ranker_outcome_free(ended);
  exports_poolgate_policy_ranker_request_free(req);
}
