-- refund: undo charges that decide.lua made, for a request that turned out
-- denied by a hit on another Redis Cluster slot (all or nothing across slots).
--
-- KEYS[i]   base key of charged hit i; after them, the records of the
--           slices given back (decide.lua's record_slice)
-- ARGV      per hit, five numbers in order: its algorithm's ID (ALG_*), the
--           refund token decide.lua returned (for the log's lease, slice or
--           part of a request, its members' base name instead: "L<nonce>",
--           "A<score>", "<score>p<nonce>"; for a slice of a counter or GCRA,
--           the negative name of its record, see slice_record), its cost,
--           limit, and window in seconds
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

-- slice_record takes the record of a counter's or GCRA's slice that token
-- names (decide.lua's record_slice): the charge's token and the units to
-- give back, at most what it recorded; none when the record is gone (a
-- failover lost the lease, a Reset deleted it, or it was given back).
local function slice_record(key, token, cost)
  local h, name = key .. ':slices', fmt(-token)
  local rec = redis.call('HGET', h, name)
  if not rec then
    return 0, 0
  end
  redis.call('HDEL', h, name)
  local charge, units = string.match(rec, '^(%d+):(%d+)$')
  return tonumber(charge), min(cost, tonumber(units) or 0)
end

local refunded = 0
local now -- Redis TIME, read once, and only when an algorithm asks
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end
-- KEYS holds the records of the slices given back after the charges' keys.
for i = 1, #ARGV / 5 do
  local key, a = KEYS[i], 5 * (i - 1)
  local alg = algorithms[tonumber(ARGV[a + 1])]
  if not alg then
    error('refund: unknown algorithm ' .. tostring(ARGV[a + 1]))
  end
  -- A token is a number, or the log's base name of its members (see above).
  local token, cost, limit = tonumber(ARGV[a + 2]) or ARGV[a + 2], tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if type(token) == 'number' and token < 0 then
    token, cost = slice_record(key, token, cost)
  end
  if cost > 0 then
    refunded = refunded + alg.undo(key, token, cost, limit, tonumber(ARGV[a + 5]) * 1000000, clock)
  end
end
write_all() -- GCRA's refunds
return refunded
