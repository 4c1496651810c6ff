-- Fixed window: envoyproxy/ratelimit's epoch-aligned counter, KEY:<window
-- index>, for users who want exactly its windows. Unlike the reference, a
-- denied hit is not counted, so hammering a limit does not extend a lockout.
local fixed_window = {}

function fixed_window.check(key, limit, window, cost, now)
  local idx = math.floor(now / window)
  local st = { token = idx, elapsed = now - idx * window, curr_key = key .. ':' .. fmt(idx) }
  st.prior = seen[key] -- charged earlier in this call: count and TTL known
  st.used = st.prior and st.prior.used or tonumber(redis.call('GET', st.curr_key) or 0)
  st.admit = st.used + cost <= limit
  return st
end

function fixed_window.commit(key, st, limit, window, cost, now)
  redis.call('INCRBY', st.curr_key, fmt(cost))
  if not st.prior then
    redis.call('PEXPIRE', st.curr_key, fmt(math.ceil((window - st.elapsed) / 1000)))
  end
  st.used = st.used + cost
  seen[key] = { used = st.used }
end

-- result: the counter resets when the window ends; an empty one is whole now.
function fixed_window.result(key, st, limit, window, cost, now)
  if st.used == 0 then
    return limit, 0
  end
  return math.max(0, limit - st.used), window - st.elapsed
end
