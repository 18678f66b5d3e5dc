-- ACQUIRE: take a lease for one call in every lane it needs, or in none.
--
-- Data: each lane is a sorted set of leases. member = lease token (the task id); score = the lease's
-- expiry in epoch ms by Redis's own clock (TIME), so API hosts' clocks never matter. A lease whose
-- score is <= now has expired.
--
-- KEYS[1..n]  the call's lane keys (sorted sets), all in one hash slot
-- KEYS[n+1]   the expired-lease counter (a plain integer key): every lease this script prunes expired
--             without a release (its worker died or stopped renewing), which ops alert on
-- KEYS[n+2]   the hold-time hash (release.lua keeps it): field -> mean ms a lease of that lane is held
-- ARGV[1]     token         lease token (the task id)
-- ARGV[2]     lease_ms      lease length, ms
-- ARGV[3]     force         '1' takes the leases even when a lane is full; '0' takes none then
-- ARGV[4]     not_after_ms  epoch ms; later than this the caller has stopped waiting, so take nothing
-- ARGV[5..]   limit_i       calls in flight allowed in lane i, one per lane key, in KEYS order
-- ARGV[5+n..] field_i       lane i's field in the hold-time hash, one per lane key, in KEYS order
--
-- Returns {-1, now_ms} when Redis runs the script after not_after_ms (it sat in a buffer while Redis hung,
-- or the caller's clock is behind Redis's: now_ms lets it tell which);
-- else {taken (1 or 0), now_ms, count_1, ..., count_n}: now_ms is Redis's clock (epoch ms) when the
-- leases were taken, which release.lua measures the hold from; each count is the lane's unexpired leases
-- before this call, not counting a lease this token already holds, so acquiring again with the same
-- token (a redelivered task) is idempotent. Lane i is full when count_i >= limit_i. When a lane is full,
-- hold_1, ..., hold_n follow: each lane's mean hold in ms, or -1 when none was measured yet (what a
-- refusal's Retry-After is computed from, read here so a refusal costs no second round trip).
--
-- Per lane it prunes, puts this call's lease in (ZADD NX: a lease this token holds already stays as it is)
-- and counts the lane (ZCARD, less this call's lease); a refusal takes back the leases it put in, so a
-- refused call leaves every lane as it found it. Needs Redis >= 7.0 (the prelude's `keep`).

-- #prelude

local lanes = #KEYS - 2
local expired_key = KEYS[#KEYS - 1]
local holds_key = KEYS[#KEYS]
local token = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local force = ARGV[3] == '1'
local not_after_ms = tonumber(ARGV[4])
if lanes < 1 or #ARGV ~= 4 + 2 * lanes or not lease_ms or lease_ms <= 0 or not not_after_ms then
  return redis.error_reply('acquire: expected KEYS lanes..., counter, holds and ARGV token, lease_ms > 0, '
    .. 'force, not_after_ms, one limit and one hold field per lane')
end

if now_ms > not_after_ms then
  return {-1, now_ms}
end

local result = {0, now_ms}
local full = false
local pruned = 0
local added = {}
for i = 1, lanes do
  local key = KEYS[i]
  pruned = pruned + redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  -- This call's lease goes in first (NX: a lease this token already holds is left as it is), so one ZCARD
  -- counts the lane with it in: the count before this call, its own lease not counted, is one less.
  added[i] = redis.call('ZADD', key, 'NX', now_ms + lease_ms, token)
  local count = redis.call('ZCARD', key) - 1
  result[i + 2] = count
  if count >= tonumber(ARGV[4 + i]) then
    full = true
  end
end
if pruned > 0 then
  redis.call('INCRBY', expired_key, pruned)
end

if force or not full then
  result[1] = 1
  for i = 1, lanes do
    local key = KEYS[i]
    if added[i] == 0 then
      redis.call('ZADD', key, now_ms + lease_ms, token)  -- its own lease (a redelivery): moved, as taken now
    end
    if added[i] == 1 and result[i + 2] == 0 then
      redis.call('PEXPIRE', key, 2 * lease_ms)  -- the ZADD made the key: it has no TTL yet
    else
      keep(key, 2 * lease_ms)
    end
  end
else
  for i = 1, lanes do
    if added[i] == 1 then
      redis.call('ZREM', KEYS[i], token)  -- refused: nothing of this call stays (an emptied key goes)
    end
  end
end
if full then
  local holds = redis.call('HMGET', holds_key, unpack(ARGV, 5 + lanes, 4 + 2 * lanes))
  for i = 1, lanes do
    result[2 + lanes + i] = tonumber(holds[i]) or -1
  end
end
return result
