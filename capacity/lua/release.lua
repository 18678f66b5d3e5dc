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
--                          unknown (a release sent late), and then no hold is measured
-- ARGV[3]     within_limit '1' when the call took its leases within every lane's limit (admitted); '0' when
--                          shadow mode let it past a full lane, and then no hold is measured: its hold is
--                          mostly its wait behind the other calls over the limit, which a refused caller
--                          never waits for (Retry-After is computed from these holds). Its run is measured.
-- ARGV[4]     weight       the newest sample's weight in each mean, 0 < weight <= 1 (the first samples
--                          weigh 1/count, so a mean starts as the plain average)
-- ARGV[5]     run_field    the hash field of the call's queue run time; '' when it didn't run here
-- ARGV[6]     run_ms       how long the call ran, ms (with run_field)
-- ARGV[7..]   field_i      lane i's field in the hash, one per lane key, in KEYS order
--
-- Returns how many leases it removed (0..n). Only this token's leases go, expired or not, so releasing
-- twice is harmless and the second release returns 0 (and measures nothing again). A lane's hold is
-- measured only when its lease was removed here and the call was within the limit: now_ms - acquired_ms.
-- Every mean it updates is read with one HMGET and written with one HSET.

-- #prelude

local lanes = #KEYS - 1
local holds_key = KEYS[#KEYS]
local token = ARGV[1]
local acquired_ms = tonumber(ARGV[2])
local within_limit = ARGV[3]
local weight = tonumber(ARGV[4])
local run_field = ARGV[5]
local run_ms = tonumber(ARGV[6])
if lanes < 0 or #ARGV ~= 6 + lanes or not acquired_ms or (within_limit ~= '1' and within_limit ~= '0')
    or not weight or weight <= 0 or weight > 1 or not run_ms then
  return redis.error_reply('release: expected KEYS lanes..., holds and ARGV token, acquired_ms, '
    .. "within_limit '1' or '0', 0 < weight <= 1, run_field, run_ms, one hold field per lane")
end
local measure_holds = acquired_ms > 0 and within_limit == '1'

-- The samples to fold into the means, in order: each measured lane's hold, then the run.
local fields, samples = {}, {}
local removed = 0
for i = 1, lanes do
  local gone = redis.call('ZREM', KEYS[i], token)
  removed = removed + gone
  if gone == 1 and measure_holds then
    fields[#fields + 1], samples[#samples + 1] = ARGV[6 + i], math.max(now_ms - acquired_ms, 0)
  end
end
if run_field ~= '' and run_ms >= 0 then
  fields[#fields + 1], samples[#samples + 1] = run_field, run_ms
end
if #fields == 0 then
  return removed
end

-- One HMGET reads every mean and its count, one HSET writes them back (a field named twice takes its
-- samples one after the other, as separate releases would).
local names, seen = {}, {}
for _, name in ipairs(fields) do
  if not seen[name] then
    seen[name] = true
    names[#names + 1] = name
    names[#names + 1] = name .. '|n'
  end
end
local stored = redis.call('HMGET', holds_key, unpack(names))
local means, counts = {}, {}
for j = 1, #names, 2 do
  means[names[j]] = tonumber(stored[j])
  counts[names[j]] = tonumber(stored[j + 1]) or 0
end
for k, name in ipairs(fields) do
  local count = counts[name] + 1
  local mean = means[name]
  local w = math.max(weight, 1 / count)
  if mean then
    mean = math.floor(mean + w * (samples[k] - mean) + 0.5)
  else
    mean = math.floor(samples[k] + 0.5)
  end
  means[name], counts[name] = mean, count
end
local update = {}
for j = 1, #names, 2 do
  local name = names[j]
  update[2 * j - 1], update[2 * j] = name, means[name]
  update[2 * j + 1], update[2 * j + 2] = names[j + 1], counts[name]
end
redis.call('HSET', holds_key, unpack(update))
return removed
