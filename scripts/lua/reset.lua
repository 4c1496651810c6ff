-- reset: deletes a counter, whatever its algorithm, so that its whole limit
-- is available again. Run on its own, not with decide.lua.
--
-- KEYS[1]  the counter's key: every algorithm keeps its state there
-- KEYS[2]  for a counter or GCRA, the records of its hot key's slices
--          (decide.lua's record_slice)
--
-- A sliding log keeps the members of a live slice of a hot key ("A<score>",
-- recorded at its period's end, still ahead of Redis TIME): another
-- instance goes on spending its units without asking.
--
-- Reply: the number of keys deleted (0 for an empty counter).
local key = KEYS[1]
if redis.call('TYPE', key).ok ~= 'zset' then
  -- A counter's or GCRA's slices' records go with it: a slice leased
  -- before gives nothing back to the new count (decide.lua's record_slice).
  if KEYS[2] then
    redis.call('DEL', KEYS[2])
  end
  return redis.call('DEL', key)
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
