-- reset: deletes a counter, whatever its algorithm, so that its whole limit
-- is available again. Run on its own, not with decide.lua.
--
-- KEYS[1]  base key (it carries the hash tag)
-- ARGV[1]  window in microseconds
--
-- The log is the sorted set at KEYS[1]; the counter and fixed windows keep
-- KEYS[1]:<window index>, and the counter reads the previous window's too.
-- The index is computed from Redis TIME as the algorithms compute it.
--
-- Reply: the number of keys deleted.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local idx = math.floor(now / tonumber(ARGV[1]))
local key = KEYS[1]
return redis.call('DEL', key, key .. ':' .. fmt(idx), key .. ':' .. fmt(idx - 1))
