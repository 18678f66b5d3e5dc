-- RELEASE: give back one call's leases.
--
-- Data: each lane is a sorted set of leases. member = lease token (the task id); score = the lease's
-- expiry in epoch ms by Redis's own clock (TIME).
--
-- KEYS[1..n]  the call's lane keys (sorted sets), all in one hash slot
-- ARGV[1]     token  lease token (the task id)
--
-- Returns how many leases it removed (0..n). Only this token's leases go, expired or not, so releasing
-- twice is harmless and the second release returns 0. It doesn't read the clock, so it has no prelude.

local token = ARGV[1]
if #ARGV ~= 1 then
  return redis.error_reply('release: expected ARGV token')
end

local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], token)
end
return removed
