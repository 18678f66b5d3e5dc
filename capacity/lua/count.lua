-- COUNT: the unexpired leases in each lane, without changing anything.
--
-- Data: each lane is a sorted set of leases. member = lease token (the task id); score = the lease's
-- expiry in epoch ms by Redis's own clock (TIME). A lease whose score is <= now has expired.
--
-- KEYS[1..n]  lane keys (sorted sets), all in one hash slot
-- ARGV        none
--
-- Returns {count_1, ..., count_n}: ZCOUNT key (now_ms +inf, so leases that expired but weren't pruned yet
-- are not counted. It doesn't prune: a read for status pages must not write (or count expirations).

-- prelude (identical in every script that reads the clock)
if redis.replicate_commands then redis.replicate_commands() end  -- TIME is non-deterministic
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Only ever extend a lane's TTL: other calls' leases in it may be longer than this one.
-- PTTL is -1 for a key without a TTL and -2 for a missing key, so both get one.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
-- end prelude

local counts = {}
for i = 1, #KEYS do
  counts[i] = redis.call('ZCOUNT', KEYS[i], '(' .. now_ms, '+inf')
end
return counts
