-- reset: empties a counter, whatever its algorithm, so that its whole limit
-- is available again, and its RLQS fleet's count of it alike, so that the
-- two still differ by what others took. Run on its own, not with decide.lua.
--
-- KEYS[1]  the counter's key: every algorithm keeps its state there
-- KEYS[2]  the fleet's count of it (its key .. FLEET_SUFFIX), when it
--          shares the counter's slot (not the reference's keys)
-- KEYS[3], KEYS[4]  for a counter or GCRA, its slices' records (record_slice)
--
-- A sliding log keeps the members of a live slice (a hot key's, or an RLQS
-- lease: "A<score>", recorded at its end, still ahead of Redis TIME): another
-- instance, or an Envoy, goes on spending its units without asking.
--
-- A counter's or GCRA's state becomes "0:0/<generation>" (prelude.lua's
-- generation: one more than the state's), which reads as empty, for as long
-- as the state would have lived: a give-back on its way of a charge made
-- before the Reset then finds another generation than its charge's, and
-- takes nothing of the charges made since. The reference's keys, a bare
-- count, become "0" with an expiry a millisecond later: their charges name
-- the key's life by its expiry (reference_fixed_window.lua), which a charge
-- before the Reset, even in its millisecond, then no longer finds.
--
-- Reply: the number of keys of the counter reset (0 for an empty one).
local function reset(key, records)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'zset' then
    -- Its slices' records go too, but for the first name free of them ("next").
    local fields, next = records and redis.call('HGETALL', records) or {}, 0
    for i = 1, #fields, 2 do -- a record's name is a number; next's value
      local name = tonumber(fields[i])
      if name then
        next = math.max(next, name + 1)
      elseif fields[i] == 'next' then
        next = math.max(next, tonumber(fields[i + 1]))
      end
    end
    if next > 0 then
      local ttl = redis.call('PTTL', records)
      redis.call('DEL', records)
      redis.call('HSET', records, 'next', string.format('%d', next))
      redis.call('PEXPIRE', records, ttl)
    end
    local v, ttl = kind == 'string' and redis.call('GET', key), redis.call('PTTL', key)
    if v and ttl > 0 and string.find(v, '^%d+$') then
      redis.call('SET', key, '0', 'PXAT', string.format('%d', redis.call('PEXPIRETIME', key) + 1))
      return v == '0' and 0 or 1
    end
    local gen = v and string.match(v, '^%d+:%d+:?%d*/?(%d*)$')
    if not gen or ttl <= 0 then
      return redis.call('DEL', key)
    elseif string.find(v, '^0:0/') then
      return 0 -- nothing charged since the last Reset
    end
    redis.call('SET', key, '0:0/' .. string.format('%d', (tonumber(gen) or 0) + 1), 'PX', ttl)
    return 1
  end
  local t = redis.call('TIME')
  local now = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  local ahead = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
  local ttl = redis.call('PTTL', key)
  local deleted = redis.call('DEL', key)
  local kept = 0
  for i = 1, #ahead, 2 do
    if string.sub(ahead[i], 1, 1) == 'A' then
      redis.call('ZADD', key, ahead[i + 1], ahead[i])
      kept = kept + 1
    end
  end
  if kept > 0 and ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
  end
  return deleted
end

local deleted = reset(KEYS[1], KEYS[3])
if KEYS[2] then
  reset(KEYS[2], KEYS[4])
end
return deleted
