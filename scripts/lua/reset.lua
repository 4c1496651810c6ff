-- reset: deletes a counter, whatever its algorithm, so that its whole limit
-- is available again. Run on its own, not with decide.lua.
--
-- KEYS[1]  the counter's key: every algorithm keeps its state there
--
-- Reply: the number of keys deleted (0 for an empty counter).
return redis.call('DEL', KEYS[1])
