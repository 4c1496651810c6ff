-- Sliding window counter: two epoch-aligned fixed-window counters, the
-- previous one weighted by how much of it the sliding window still covers:
--   estimate = previous * (window - elapsed) / window + current
-- Constant memory per key whatever the limit. Both counters are named
-- KEY:<window index>; KEY carries the hash tag, so they share a slot.
local sliding_window_counter = {}

function sliding_window_counter.estimate(st, elapsed)
  return st.prev * (st.window - elapsed) / st.window + st.curr
end

function sliding_window_counter.check(key, limit, window, cost, now)
  local idx = math.floor(now / window)
  local st = {
    token = idx,
    window = window,
    elapsed = now - idx * window,
    curr_key = key .. ':' .. fmt(idx),
  }
  st.prior = seen[key] -- charged earlier in this call: counts and TTL known
  if st.prior then
    st.prev, st.curr = st.prior.prev, st.prior.curr
  else
    local counts = redis.call('MGET', key .. ':' .. fmt(idx - 1), st.curr_key)
    st.prev = tonumber(counts[1]) or 0
    st.curr = tonumber(counts[2]) or 0
  end
  st.admit = sliding_window_counter.estimate(st, st.elapsed) + cost <= limit
  return st
end

function sliding_window_counter.commit(key, st, limit, window, cost, now)
  redis.call('INCRBY', st.curr_key, fmt(cost))
  -- The counter is read as "previous" through the whole next window.
  if not st.prior then
    redis.call('PEXPIRE', st.curr_key, fmt(math.ceil((2 * window - st.elapsed) / 1000)))
  end
  st.curr = st.curr + cost
  seen[key] = { prev = st.prev, curr = st.curr }
end

-- first_fit returns the first whole microsecond of elapsed time at which the
-- estimate plus cost fits. It starts just below the solved value and steps up
-- with the admission formula itself, so float rounding in the solution makes
-- the answer neither early nor late.
local function first_fit(st, limit, cost, solved)
  local e = math.max(solved - 2, 0)
  for _ = 1, 8 do
    if sliding_window_counter.estimate(st, e) + cost <= limit then
      break
    end
    e = e + 1
  end
  return e
end

function sliding_window_counter.result(key, st, limit, window, cost, now)
  local est = sliding_window_counter.estimate(st, st.elapsed)
  local remaining = math.max(0, math.floor(limit - est))
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
    local solved = math.ceil(window * (1 - (need - st.curr) / st.prev))
    return remaining, math.max(1, first_fit(st, limit, cost, solved) - st.elapsed)
  end
  -- Fits only in the next window, where this window's count is "previous".
  local next = { window = window, prev = st.curr, curr = 0 }
  local solved = math.ceil(window * (1 - need / st.curr))
  return remaining, window - st.elapsed + first_fit(next, limit, cost, solved)
end
