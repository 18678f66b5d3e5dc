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

-- #prelude

local counts = {}
for i = 1, #KEYS do
  counts[i] = redis.call('ZCOUNT', KEYS[i], '(' .. now_ms, '+inf')
end
return counts
