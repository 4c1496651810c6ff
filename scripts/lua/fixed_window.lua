-- Fixed window: envoyproxy/ratelimit's epoch-aligned counter, for users who
-- want exactly its windows. Unlike the reference, a denied hit is not
-- counted, so hammering a limit does not extend a lockout.
--
-- The counter is the string "<window index>:<count>" at KEY itself: the one
-- key a call names is the one it touches, which Redis Cluster needs to
-- route it right while a slot migrates, and one SET records the charges of
-- a call: with its expiry (the window's end) when the window's count is
-- new, else keeping it. A value of another window counts as empty.
--
-- A window aligned to the calendar (a month, a week from Monday, in a time
-- zone) comes as its edges, which the Go side computes around its own clock
-- (this Lua has no time zones); the window is the one holding Redis TIME, so
-- instances whose clocks differ agree. Its index is its start in Unix seconds.
local fixed_window = { windowed = true } -- its slices' records are counted by window (held_by_slices)
local fixed_window_states = new_pool()

-- span returns the index, start and length of the window holding now.
-- With edges, far off the Go side's clock (by more than a window), the
-- nearest window stands: its expiry and reset are still its own end.
local function span(window, now)
  if type(window) == 'number' then
    local idx = floor(now / window)
    return idx, idx * window, window
  end
  local i = 1
  while i < #window - 1 and now >= window[i + 1] do
    i = i + 1
  end
  return window[i] / 1000000, window[i], window[i + 1] - window[i]
end

function fixed_window.check(key, limit, window, cost, now)
  local idx, start, length = span(window, now)
  local token, used, keep, gen = idx, 0, false, 0
  local prior = seen[key] -- charged earlier in this call: count known
  if prior then
    token, used, keep, gen = prior.token, prior.used, prior.keep, prior.gen
  else
    local stored, count, _
    stored, count, _, gen = parse_windows(get(key))
    if stored and stored >= idx then
      -- This window, or a later one after Redis's clock stepped back (a
      -- failover): its count stands, and a charge keeps its index and expiry.
      token, used, keep = stored, count, true
    end
  end
  local st = take(fixed_window_states) -- every field set here
  st.token, st.elapsed, st.length, st.used, st.keep, st.gen = token, now - start, length, used, keep, gen
  st.admit = used + cost <= limit
  return st
end

function fixed_window.commit(key, st, limit, window, cost, now)
  st.used = min(st.used + cost, max_count)
  write_later(key, string.format('%d:%d', st.token, st.used) .. generation(st.gen),
    not st.keep and fmt_ttl(max(1, ceil((st.length - st.elapsed) / 1000))) or nil)
  seen[key] = st -- what a later check of key in this call reads
end

-- refund takes up to units back from this window's count, never the units
-- its slices and RLQS leases hold (held_by_slices): only what the store
-- admitted itself; a count of another window is not this window's to give.
function fixed_window.refund(key, units, limit, window, now)
  local st = fixed_window.check(key, limit, window, 0, now)
  local back = st.used > 0 and min(st.used - held_by_slices(key, st.token), units) or 0
  if back > 0 then
    fixed_window.commit(key, st, limit, window, -back, now)
  end
end

-- undo takes a charge of cost back from the window token names, for
-- refund.lua, never the units its slices hold (a slice's own unused units
-- are no longer among them: see slice_record); a count of another window
-- or generation (gen, nil for a slice's record) is not the charge's. It
-- returns what it took.
function fixed_window.undo(key, token, cost, limit, window, now, gen)
  local stored, curr, _, g = parse_windows(redis.call('GET', key))
  if stored ~= token or gen and gen ~= g then
    return 0
  end
  local back = max(0, min(curr - held_by_slices(key, token), cost))
  if back > 0 then
    redis.call('SET', key, fmt(stored) .. ':' .. fmt(curr - back) .. generation(g), 'KEEPTTL')
  end
  return back
end

-- records_from is the oldest window whose slices' records are read again.
function fixed_window.records_from(st)
  return st.token
end

-- result: the counter resets when the window ends; an empty one is whole now.
function fixed_window.result(key, st, limit, window, cost, now)
  if st.used == 0 then
    return limit, 0
  end
  return max(0, limit - st.used), max(0, st.length - st.elapsed)
end
