-- refund: undo charges that decide.lua made, for a request that turned out
-- denied by a hit on another Redis Cluster slot (all or nothing across slots).
--
-- KEYS[i]   base key of charged hit i
-- ARGV      per hit, five numbers in order: its algorithm's ID (ALG_*), the
--           refund token decide.lua returned (for a lease, its members'
--           base name "L<nonce>" instead), its cost, limit, and window in
--           seconds
--
-- Each algorithm's undo takes the charge back: the log removes exactly the
-- members the charge added; the counters take the cost back from the window
-- the charge went to (for the sliding counter, that window may have become
-- "previous" since), never from another one; GCRA moves its TAT back by the
-- charge's time, never past now (what has refilled since the charge is not
-- given twice).
-- Reply: the number of units refunded (for GCRA, the whole units of the
-- time given back).
bind_math()
local refunded = 0
local now -- Redis TIME, read once, and only when an algorithm asks
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end
for i, key in ipairs(KEYS) do
  local a = 5 * (i - 1)
  local alg = algorithms[tonumber(ARGV[a + 1])]
  if not alg then
    error('refund: unknown algorithm ' .. tostring(ARGV[a + 1]))
  end
  -- A token is a number, or a lease's base name (the log's "L<nonce>").
  local token, cost, limit = tonumber(ARGV[a + 2]) or ARGV[a + 2], tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  refunded = refunded + alg.undo(key, token, cost, limit, tonumber(ARGV[a + 5]) * 1000000, clock)
end
write_all() -- GCRA's refunds
return refunded
