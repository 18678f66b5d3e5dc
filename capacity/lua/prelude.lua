-- prelude (capacity/lua/prelude.lua: put in place of a script's `-- #prelude` line when it is read)
if redis.replicate_commands then redis.replicate_commands() end  -- TIME is non-deterministic
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Only ever extend a key's TTL: other calls' leases in a lane may be longer than this one. Two ways, each
-- one command in its own common case (2 otherwise), both giving a key without a TTL one:
-- keep: for a write that usually moves the expiry later (an acquire). Needs Redis >= 7.0 (PEXPIRE's GT and
--   NX; docker-compose.yml runs 7.x): GT sets it when it is later; GT treats a key without a TTL as never
--   expiring, so NX then gives it one. A key whose TTL is already longer keeps it.
-- keep_if_shorter: for a write that usually finds a longer TTL (a worker's first renewal, after the API
--   acquired for the queue's longer lease): PTTL, and PEXPIRE only when it is shorter (PTTL is -1 for a
--   key without a TTL). A missing key stays missing either way.
local function keep(key, ms)
  if redis.call('PEXPIRE', key, ms, 'GT') == 0 then redis.call('PEXPIRE', key, ms, 'NX') end
end
local function keep_if_shorter(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
-- end prelude
