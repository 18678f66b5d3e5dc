-- prelude (capacity/lua/prelude.lua: put in place of a script's `-- #prelude` line when it is read)
if redis.replicate_commands then redis.replicate_commands() end  -- TIME is non-deterministic
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Only ever extend a key's TTL: other calls' leases in a lane may be longer than this one. Needs Redis
-- >= 7.0 (PEXPIRE's GT and NX; docker-compose.yml runs 7.x): GT sets it in one command when it moves the
-- expiry later (the common case); GT treats a key without a TTL as never expiring, so NX then gives it one.
-- A key whose TTL is already longer keeps it (and a missing key stays missing).
local function keep(key, ms)
  if redis.call('PEXPIRE', key, ms, 'GT') == 0 then redis.call('PEXPIRE', key, ms, 'NX') end
end
-- end prelude
