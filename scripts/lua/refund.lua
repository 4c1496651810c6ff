-- refund: undo charges that decide.lua made, for a request that turned out
-- denied by a hit on another Redis Cluster slot (all or nothing across slots).
--
-- KEYS[i]   base key of charged hit i
-- ARGV      per hit, in order: algorithm (1 log, 2 counter, 3 fixed,
--           4 gcra), the refund token decide.lua returned, cost; for a
--           GCRA hit two more, limit and window in seconds
--
-- The log removes exactly the members the charge added; the counters take
-- the cost back from the window the charge went to (for the sliding counter,
-- that window may have become "previous" since), never from another one;
-- GCRA moves its TAT back by the charge's time, never past now (what has
-- refilled since the charge is not given twice).
-- Reply: the number of units refunded (for GCRA, the whole units of the
-- time given back).
local refunded = 0
local now -- GCRA's clock, read once
local a = 1
for _, key in ipairs(KEYS) do
  local alg, token, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if alg == 4 then
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    refunded = refunded + gcra.refund(key, cost, tonumber(ARGV[a]), tonumber(ARGV[a + 1]) * 1000000, now)
    a = a + 2
  elseif alg == 1 then
    local s = fmt(token)
    local members = {}
    for j = 1, cost do
      members[#members + 1] = (j == 1) and s or (s .. ':' .. j)
      if #members >= 1000 then
        refunded = refunded + redis.call('ZREM', key, unpack(members))
        members = {}
      end
    end
    if #members > 0 then
      refunded = refunded + redis.call('ZREM', key, unpack(members))
    end
  else
    local stored, curr, prev = parse_windows(redis.call('GET', key))
    local back = 0
    if stored == token then
      back = math.min(curr, cost)
      curr = curr - back
    elseif alg == 2 and stored == token + 1 then
      back = math.min(prev, cost)
      prev = prev - back
    end
    if back > 0 then
      local value = fmt(stored) .. ':' .. fmt(curr)
      if alg == 2 then
        value = value .. ':' .. fmt(prev)
      end
      redis.call('SET', key, value, 'KEEPTTL')
    end
    refunded = refunded + back
  end
end
write_all() -- GCRA's refunds
return refunded
