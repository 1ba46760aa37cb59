//! The Lua scripts the Redis backend runs: each one compare-and-write, atomic
//! in Redis whatever other replicas do.

/// Sets a plugin entry unless Redis holds one written later.
/// KEYS[1] entry; ARGV: value record, its write time, expiry (ms, absolute), TTL if none.
pub(super) const SET_IF_NEWER: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, d = pcall(cjson.decode, cur)
  if ok and type(d) == 'table' and tonumber(d.w) and tonumber(d.w) > tonumber(ARGV[2]) then return 0 end
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
end
return 1
"#;

/// Deletes a plugin entry unless it was written after the delete.
pub(super) const DEL_IF_OLDER: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, d = pcall(cjson.decode, cur)
if ok and type(d) == 'table' and tonumber(d.w) and tonumber(d.w) > tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// Takes an in-flight lease if fewer than the limit are live. Time is
/// Redis's own, so replicas' clocks do not matter.
/// KEYS[1] lease set; ARGV: member, limit, TTL.
pub(super) const LEASE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[3]))
  return 1
end
return 0
"#;

/// Extends the leases this replica holds — and puts them back if Redis lost
/// them (a restart). KEYS[1] lease set; ARGV: TTL, members…
pub(super) const RENEW: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[1]))
return 1
"#;

/// Lets a lock go if it is still this holder's. KEYS[1] lock; ARGV[1] token.
pub(super) const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// The scripts run one at a time (plugin writes go in pipelines, as `EVAL`).
pub(super) struct Scripts {
    pub(super) lease: redis::Script,
    pub(super) renew: redis::Script,
    pub(super) unlock: redis::Script,
}
