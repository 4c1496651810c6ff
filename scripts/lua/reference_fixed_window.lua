-- Reference fixed window: envoyproxy/ratelimit's own counters, so that its
-- replicas and these share them during a rolling swap of the image. The
-- key is the reference's (built by the Go side, see limiter.KeyBuilder): it
-- ends with its window's start in Unix seconds, from the replica's clock,
-- so each window has a key of its own, and the value is the reference's
-- plain integer count, which it increments with INCRBY. Unlike the
-- reference, a denied hit is not counted (its
-- STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT as if true), as fixed_window.
--
-- A charge is one SET of the new count per call: with an expiry of a whole
-- window when the key is new (the reference's expiry without its jitter;
-- the key's window, named by the clock of a replica that is using it, ends
-- sooner), else keeping the one it has (the reference's replicas renew it
-- on every hit).
local reference_fixed_window = {}

function reference_fixed_window.check(key, limit, window, cost, now)
  -- Every field named in the constructor: Lua then sizes the table once.
  local st = { token = 0, prior = seen[key], used = 0, keep = false, admit = false }
  if st.prior then
    -- charged earlier in this call, count known
    st.used, st.keep = st.prior.used, st.prior.keep
  else
    local v = get(key)
    -- A value that is not a count (nothing the reference or this code
    -- writes) counts as empty.
    st.used, st.keep = max(0, tonumber(v) or 0), v ~= nil
  end
  st.admit = st.used + cost <= limit
  return st
end

function reference_fixed_window.commit(key, st, limit, window, cost, now)
  st.used = min(st.used + cost, max_count)
  local ttl = not st.keep and fmt_ttl(ceil(window / 1000)) or nil
  write_later(key, fmt(st.used), ttl)
  seen[key] = st -- what a later check of key in this call reads
end

-- refund takes up to units back from the key's count, never below zero.
function reference_fixed_window.refund(key, units, limit, window, now)
  local st = reference_fixed_window.check(key, limit, window, 0, now)
  local back = min(st.used, units)
  if back > 0 then
    reference_fixed_window.commit(key, st, limit, window, -back, now)
  end
end

-- undo takes a charge of cost back from the key the charge went to (its
-- window is in the key, so the token says nothing more), for refund.lua,
-- never below zero. It returns how many units it took back.
function reference_fixed_window.undo(key, token, cost)
  local curr = max(0, tonumber(redis.call('GET', key)) or 0)
  local back = min(curr, cost)
  if back > 0 then
    redis.call('SET', key, fmt(curr - back), 'KEEPTTL')
  end
  return back
end

-- result: the counter resets when the window ends, by Redis's clock (the
-- reference reads its own, which also named the key: they agree as far as
-- the clocks do); an empty one is whole now.
function reference_fixed_window.result(key, st, limit, window, cost, now)
  if st.used == 0 then
    return limit, 0
  end
  return max(0, limit - st.used), window - now % window
end
