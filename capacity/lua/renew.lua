-- RENEW: extend every lease of one call, or none of them.
--
-- Data: each lane is a sorted set of leases. member = lease token (the task id); score = the lease's
-- expiry in epoch ms by Redis's own clock (TIME). A lease whose score is <= now has expired.
--
-- KEYS[1..n]  the call's lane keys (sorted sets), all in one hash slot
-- ARGV[1]     token     lease token (the task id)
-- ARGV[2]     lease_ms  new lease length from now, ms
--
-- Returns held: how many of the keys hold an unexpired lease of this token. Only when held == n does it
-- move every lease to now + lease_ms. An expired lease is never revived and a missing key is never
-- re-created, so a call is never counted in only some of its lanes; the caller reads held < n as
-- "lease lost". Nothing is pruned here (acquire prunes and counts what expired).
-- A lane's TTL is kept with keep_if_shorter (the prelude's): a worker's first renewal mostly finds the
-- longer TTL the API's acquire gave the lane for the queue's lease, and then costs one PTTL.

-- #prelude

local token = ARGV[1]
local lease_ms = tonumber(ARGV[2])
if #KEYS < 1 or #ARGV ~= 2 or not lease_ms or lease_ms <= 0 then
  return redis.error_reply('renew: expected KEYS lanes... and ARGV token, lease_ms > 0')
end

local held = 0
for i = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[i], token)
  if score and tonumber(score) > now_ms then
    held = held + 1
  end
end
if held == #KEYS then
  for i = 1, #KEYS do
    redis.call('ZADD', KEYS[i], now_ms + lease_ms, token)
    keep_if_shorter(KEYS[i], 2 * lease_ms)
  end
end
return held
