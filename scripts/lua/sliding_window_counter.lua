-- Sliding window counter: two epoch-aligned fixed-window counters, the
-- previous one weighted by how much of it the sliding window still covers:
--   estimate = previous * (window - elapsed) / window + current
-- Constant memory per key whatever the limit: both counts live in one string
-- at KEY, "<window index>:<count>:<previous window's count>" (parse_windows),
-- one key named and touched per call, read with the call's other counters
-- (prefetch) and written by one SET per call that charges it: with its
-- expiry (the next window's end) when the window's count is new, else kept.
--
-- A debt (a recorded cost past the limit) is part of this window's count:
-- it weighs fully to the window's end, then, as the previous count, less and
-- less as the sliding window leaves it behind.
local sliding_window_counter = { windowed = true } -- its slices' records are counted by window (held_by_slices)
local sliding_window_counter_states = new_pool()

function sliding_window_counter.estimate(st, elapsed)
  return st.prev * (st.window - elapsed) / st.window + st.curr
end

function sliding_window_counter.check(key, limit, window, cost, now)
  local idx = floor(now / window)
  local elapsed = now - idx * window
  local token, curr, prev, keep, gen = idx, 0, 0, false, 0
  local prior = seen[key] -- charged earlier in this call: counts known
  if prior then
    token, curr, prev, keep, gen = prior.token, prior.curr, prior.prev, prior.keep, prior.gen
  else
    local stored, c, p
    stored, c, p, gen = parse_windows(get(key))
    if stored and stored >= idx then
      -- This window, or a later one after Redis's clock stepped back (a
      -- failover): its counts stand, and a charge keeps its index and expiry.
      token, curr, prev, keep = stored, c, p, true
    elseif stored == idx - 1 then
      prev = c -- this window's count is new (0)
    end
  end
  local st = take(sliding_window_counter_states) -- every field set here
  st.token, st.window, st.elapsed, st.prev, st.curr, st.keep, st.gen = token, window, elapsed, prev, curr, keep, gen
  -- The estimate written out (see estimate): this runs for every hit.
  st.admit = prev * (window - elapsed) / window + curr + cost <= limit
  return st
end

function sliding_window_counter.commit(key, st, limit, window, cost, now)
  st.curr = min(st.curr + cost, max_count)
  -- This window's count is read as "previous" through the whole next window.
  write_later(key, string.format('%d:%d:%d', st.token, st.curr, st.prev) .. generation(st.gen),
    not st.keep and fmt_ttl(ceil((2 * window - st.elapsed) / 1000)) or nil)
  seen[key] = st -- what a later check of key in this call reads
end

-- refund takes up to units back from this window's count, never the units
-- its slices and RLQS leases hold (held_by_slices): only what the store
-- admitted itself; nor from the previous window's: units charged there are
-- not its to give.
function sliding_window_counter.refund(key, units, limit, window, now)
  local st = sliding_window_counter.check(key, limit, window, 0, now)
  local back = st.curr > 0 and min(st.curr - held_by_slices(key, st.token), units) or 0
  if back > 0 then
    sliding_window_counter.commit(key, st, limit, window, -back, now)
  end
end

-- undo takes a charge of cost back from the window token names, for
-- refund.lua: from the current count, or the previous one once that window
-- has passed, never the units that window's slices hold (a slice's own
-- unused units are no longer among them: see slice_record); a count of any
-- other window or generation (gen, nil for a slice's record) is not the
-- charge's. It returns what it took.
function sliding_window_counter.undo(key, token, cost, limit, window, now, gen)
  local stored, curr, prev, g = parse_windows(redis.call('GET', key))
  local back = 0
  if gen and gen ~= g then
    return 0
  elseif stored == token then
    back = max(0, min(curr - held_by_slices(key, token), cost))
    curr = curr - back
  elseif stored == token + 1 then
    back = max(0, min(prev - held_by_slices(key, token), cost))
    prev = prev - back
  end
  if back > 0 then
    redis.call('SET', key, fmt(stored) .. ':' .. fmt(curr) .. ':' .. fmt(prev) .. generation(g), 'KEEPTTL')
  end
  return back
end

-- records_from is the oldest window whose slices' records are read again:
-- the previous one's, by an undo of a charge made there.
function sliding_window_counter.records_from(st)
  return st.token - 1
end

-- first_fit returns the first whole microsecond of elapsed time at which the
-- estimate plus cost fits, stepping up from just below the solved value with
-- the admission formula itself: float rounding makes it neither early nor late.
local function first_fit(st, limit, cost, solved)
  local e = max(solved - 2, 0)
  for _ = 1, 8 do
    if sliding_window_counter.estimate(st, e) + cost <= limit then
      break
    end
    e = e + 1
  end
  return e
end

function sliding_window_counter.result(key, st, limit, window, cost, now)
  local est = st.prev * (window - st.elapsed) / window + st.curr -- estimate, written out
  local remaining = max(0, floor(limit - est))
  if st.admit then
    -- Until both counters have aged out of the sliding window.
    if st.curr > 0 then
      return remaining, 2 * window - st.elapsed
    elseif st.prev > 0 then
      return remaining, window - st.elapsed
    end
    return remaining, 0
  end
  local need = limit - cost
  if st.curr <= need then
    -- Fits later in this window, as the previous counter's weight falls.
    local solved = ceil(window * (1 - (need - st.curr) / st.prev))
    return remaining, max(1, first_fit(st, limit, cost, solved) - st.elapsed)
  end
  -- Fits only in the next window, where this window's count is "previous".
  local next = { window = window, prev = st.curr, curr = 0 }
  local solved = ceil(window * (1 - need / st.curr))
  return remaining, window - st.elapsed + first_fit(next, limit, cost, solved)
end
