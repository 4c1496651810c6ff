-- Reference fixed window: envoyproxy/ratelimit's own counters, so that its
-- replicas and these share them during a rolling swap of the image. The key
-- is the reference's (built by the Go side, see limiter.KeyBuilder), ending
-- with its window's start in Unix seconds by the replica's clock, so each
-- window has a key of its own; the value is the reference's plain integer
-- count, which it increments with INCRBY. As in fixed_window, a denied hit
-- is not counted (the reference's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on).
--
-- A charge is one SET of the new count per call: with an expiry of a whole
-- window when the key is new (the reference's expiry without its jitter;
-- the key's window, named by the clock of a replica that is using it, ends
-- sooner), else keeping the one it has (the reference's replicas renew it
-- on every hit).
--
-- The count is a bare integer, with no room for a Reset's generation: a
-- charge's token is its key's expiry instead (Unix ms; 0 for a key someone
-- made persistent), which names this life of the key. A Reset gives the key
-- another expiry (reset.lua), so a charge made before it finds, at its
-- give-back, a key of another life, and takes nothing charged since. (A
-- reference replica renews the expiry on every hit: beside one, a give-back
-- takes nothing, as the reference never gives back.) Reading an existing
-- key's expiry, a PEXPIRETIME per key per call, is paid only by a charge
-- that may be given back (part, which the Go side marks).
local reference_fixed_window = {}

function reference_fixed_window.check(key, limit, window, cost, now)
  -- Every field named in the constructor: Lua then sizes the table once.
  local st = { token = 0, prior = seen[key], used = 0, keep = false, admit = false }
  if st.prior then -- charged earlier in this call: count and life known
    st.used, st.keep, st.token = st.prior.used, st.prior.keep, st.prior.token
  else
    local v = get(key)
    -- A value that is not a count (nothing the reference or this code
    -- writes) counts as empty.
    st.used, st.keep = max(0, tonumber(v) or 0), v ~= nil
  end
  st.admit = st.used + cost <= limit
  return st
end

function reference_fixed_window.commit(key, st, limit, window, cost, now, ahead, lease, part)
  st.used = min(st.used + cost, max_count)
  if st.keep then
    if st.token == 0 and part then
      st.token = max(0, redis.call('PEXPIRETIME', key)) -- -1: persistent
    end
    write_later(key, fmt(st.used))
  else
    st.token = floor(now / 1000) + ceil(window / 1000)
    write_later_at(key, fmt(st.used), fmt_once(st.token))
  end
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
-- window is in the key), for refund.lua, never below zero, nor from a key of
-- another life than the token names (see above). It returns what it took.
function reference_fixed_window.undo(key, token, cost)
  if token ~= 0 and redis.call('PEXPIRETIME', key) ~= token then
    return 0
  end
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
