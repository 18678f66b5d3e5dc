-- RATE: count one request in its caller's sliding window, only while the window has room.
--
-- Data: a window is a sorted set of the requests counted in it. member = the request's token (unique per
-- request); score = when it was counted, epoch ms by Redis's own clock (TIME), so API hosts' clocks never
-- matter. A request counts while its score is > now - window_ms; older ones are pruned here.
--
-- KEYS[1]     the window's key (capacity.keys.rate_key: one per caller and rate scope)
-- ARGV[1]     token      the request's token, unique per request
-- ARGV[2]     limit      requests allowed in any window, a whole number >= 0
-- ARGV[3]     window_ms  the window's length, ms > 0
--
-- Returns {admitted (1 or 0), counted, reset_ms}: counted is the requests in the window now (this one
-- included when admitted); reset_ms is the ms until the oldest of them leaves the window (window_ms when
-- none is counted). A refused request writes nothing, so refusals never use up the window. Check and
-- count are one script: concurrent requests can't both take the last place. The key expires window_ms
-- after its newest request.

-- #prelude

local token = ARGV[1]
local limit = tonumber(ARGV[2])
local window_ms = tonumber(ARGV[3])
if #KEYS ~= 1 or #ARGV ~= 3 or not limit or limit < 0 or not window_ms or window_ms <= 0 then
  return redis.error_reply('rate: expected KEYS window and ARGV token, limit >= 0, window_ms > 0')
end
local window = KEYS[1]

redis.call('ZREMRANGEBYSCORE', window, '-inf', now_ms - window_ms)
local counted = redis.call('ZCARD', window)
local admitted = 0
if counted < limit then
  redis.call('ZADD', window, now_ms, token)
  -- The newest request leaves the window last: the key lives exactly as long as it counts.
  redis.call('PEXPIRE', window, window_ms)
  counted = counted + 1
  admitted = 1
end
local reset_ms = window_ms
local oldest = redis.call('ZRANGE', window, 0, 0, 'WITHSCORES')
if oldest[2] then
  reset_ms = tonumber(oldest[2]) + window_ms - now_ms
end
return {admitted, counted, reset_ms}
