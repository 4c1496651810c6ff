-- undo_charges(keys, args), the one way back: it undoes charges decide made,
-- by the tokens decide returned, for a request denied across Cluster slots
-- or stores, a quota over, a slice or a lease given back. It ends the
-- function library; Refund runs it as a script.
--
-- keys[i]   base key of charged hit i; after them, the records of the
--           slices given back (decide.lua's record_slice)
-- args      per hit, five numbers in order: its algorithm's ID (ALG_*), the
--           refund token decide.lua returned (for the log's lease, slice or
--           part of a request, its members' base name instead: "L<nonce>",
--           "A<score>", "<score>p<nonce>"; for a slice of a counter or GCRA,
--           the negative name of its record, see slice_record; for another
--           charge of theirs, "<token>/<generation>" when its generation
--           was not 0, see prelude.lua's generation), its cost,
--           limit, and window in seconds
--
-- Each algorithm's undo takes back the charge alone: the log its members,
-- a counter the cost from the window it went to and no other (the sliding
-- counter's may be "previous" since), GCRA its time from the TAT, never past
-- now (what has refilled since the charge is not given twice).
-- Reply: the number of units refunded (for GCRA, the whole units of the
-- time given back).

-- slice_record takes the record of a counter's or GCRA's slice that token
-- names (decide.lua's record_slice): the charge's token and the units to
-- give back, at most what it recorded; none when the record is gone (a
-- failover lost the lease, a Reset deleted it, or it was given back). A
-- window counter's (windowed) slice then no longer holds those units in its
-- window (held_by_slices): what it spent stays held, as a log's members do.
local function slice_record(key, token, cost, windowed)
  local h, name = key .. ':slices', fmt(-token)
  local rec = redis.call('HGET', h, name)
  if not rec then
    return 0, 0
  end
  redis.call('HDEL', h, name)
  local charge, units = string.match(rec, '^(%d+):(%d+)')
  charge, units = tonumber(charge), min(cost, tonumber(units) or 0)
  if windowed and units > 0 then
    redis.call('HINCRBY', h, 'units:' .. fmt(charge), -units)
  end
  return charge, units
end

local function undo_charges(keys, args)
  begin_call()
  local refunded, t = 0, redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  for i = 1, #args / 5 do
    local key, a = keys[i], 5 * (i - 1)
    local alg = algorithms[tonumber(args[a + 1])]
    if not alg then
      error('refund: unknown algorithm ' .. tostring(args[a + 1]))
    end
    -- A token is a number, or the log's base name of its members (see above).
    local token, cost, limit = tonumber(args[a + 2]) or args[a + 2], tonumber(args[a + 3]), tonumber(args[a + 4])
    local t, gen = string.match(args[a + 2], '^(%d+)/(%d+)$')
    if t then
      token, gen = tonumber(t), tonumber(gen)
    elseif type(token) == 'number' and token < 0 then
      token, cost = slice_record(key, token, cost, alg.windowed) -- a slice's record: no Reset since
    else
      gen = 0
    end
    if cost > 0 then
      refunded = refunded + alg.undo(key, token, cost, limit, tonumber(args[a + 5]) * 1000000, now, gen)
    end
  end
  write_all() -- GCRA's refunds
  return refunded
end
