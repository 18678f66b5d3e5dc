-- UNCLAIM: give up a claim (a plain string key set with SET NX) only if this caller still holds it, and
-- optionally leave a pointer to the caller behind.
--
-- Data: a claim is a string key whose value is its holder's token (a call id), with an expiry. Claims say
-- that one request does a piece of work for everyone (the work of identical calls: workers.sharing). The
-- pointer is a string key with the same token: for a work that succeeded, which call's result answers
-- identical calls while it lives (its "warm result").
--
-- KEYS[1]  the claim's key
-- KEYS[2]  the pointer's key (optional)
-- ARGV[1]  token     the holder's token
-- ARGV[2]  pointer_ms  how long the pointer lives (with KEYS[2]); 0: no pointer
--
-- Returns 1 when the claim was this token's and is now gone, 0 when another holds it or nobody does (it
-- expired, or its holder gave it up already): a holder never removes a claim someone else took since. The
-- pointer is set either way (it says this token's work succeeded, whoever holds the claim now).

local token = ARGV[1]
local pointer_ms = tonumber(ARGV[2] or '0')
if #KEYS < 1 or #KEYS > 2 or #ARGV ~= #KEYS then
  return redis.error_reply('unclaim: expected KEYS claim [pointer] and ARGV token [pointer_ms]')
end

local removed = 0
if redis.call('GET', KEYS[1]) == token then
  removed = redis.call('DEL', KEYS[1])
end
if #KEYS >= 2 then
  if pointer_ms == nil or pointer_ms < 0 then
    return redis.error_reply('unclaim: pointer_ms must be a number >= 0')
  end
  if pointer_ms > 0 then
    redis.call('SET', KEYS[2], token, 'PX', math.floor(pointer_ms))
  end
end
return removed
