-- RELEASE: give back one call's leases, and measure how long they were held (and how long it ran).
--
-- Data: each lane is a sorted set of leases. member = lease token (the task id); score = the lease's
-- expiry in epoch ms by Redis's own clock (TIME). The hold-time hash keeps one mean per field (ms, an
-- exponentially weighted moving average) and its sample count in `<field>|n`.
--
-- KEYS[1..n]  the call's lane keys (sorted sets), all in one hash slot
-- KEYS[n+1]   the hold-time hash (acquire.lua reads it when a lane is full)
-- ARGV[1]     token        lease token (the task id)
-- ARGV[2]     acquired_ms  epoch ms by Redis's clock when the leases were taken (acquire's now_ms); 0 when
--                          unknown (a release sent late), and then nothing is measured
-- ARGV[3]     weight       the newest sample's weight in each mean, 0 < weight <= 1 (the first samples
--                          weigh 1/count, so a mean starts as the plain average)
-- ARGV[4]     run_field    the hash field of the call's queue run time; '' when it didn't run here
-- ARGV[5]     run_ms       how long the call ran, ms (with run_field)
-- ARGV[6..]   field_i      lane i's field in the hash, one per lane key, in KEYS order
--
-- Returns how many leases it removed (0..n). Only this token's leases go, expired or not, so releasing
-- twice is harmless and the second release returns 0 (and measures nothing again). A lane's hold is
-- measured only when its lease was removed here: now_ms - acquired_ms.

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

local lanes = #KEYS - 1
local holds_key = KEYS[#KEYS]
local token = ARGV[1]
local acquired_ms = tonumber(ARGV[2])
local weight = tonumber(ARGV[3])
local run_field = ARGV[4]
local run_ms = tonumber(ARGV[5])
if lanes < 0 or #ARGV ~= 5 + lanes or not acquired_ms or not weight or weight <= 0 or weight > 1
    or not run_ms then
  return redis.error_reply('release: expected KEYS lanes..., holds and ARGV token, acquired_ms, '
    .. '0 < weight <= 1, run_field, run_ms, one hold field per lane')
end

local function observe(field, sample_ms)
  local count = redis.call('HINCRBY', holds_key, field .. '|n', 1)
  local mean = tonumber(redis.call('HGET', holds_key, field))
  local w = math.max(weight, 1 / count)
  if mean then
    mean = mean + w * (sample_ms - mean)
  else
    mean = sample_ms
  end
  redis.call('HSET', holds_key, field, math.floor(mean + 0.5))
end

local removed = 0
for i = 1, lanes do
  local gone = redis.call('ZREM', KEYS[i], token)
  removed = removed + gone
  if gone == 1 and acquired_ms > 0 then
    observe(ARGV[5 + i], math.max(now_ms - acquired_ms, 0))
  end
end
if run_field ~= '' and run_ms >= 0 then
  observe(run_field, run_ms)
end
return removed
