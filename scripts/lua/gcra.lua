-- GCRA (generic cell rate algorithm): a token bucket kept as one instant.
-- The bucket holds burst units and refills at limit units per window, one
-- unit every T = window / limit. Its state is the theoretical arrival time
-- (TAT), when the bucket is full again: TAT - now is what it owes, in time.
-- A hit of cost c fits when max(TAT, now) + c * T - now <= burst * T, and a
-- charge moves TAT to max(TAT, now) + c * T. A bucket with no key is full:
-- one string at KEY whatever the rate, expiring when full again.
--
-- T is rarely a whole number of microseconds (3 per second), and a float
-- TAT would drift by a rounding at every charge, so every instant and length
-- here is exact: whole microseconds plus a remainder in units of 1/limit
-- microsecond, the TAT stored as "<whole>:<remainder>" (Unix microseconds).
-- Decisions and waits are an exact bucket's, to the microsecond, for costs
-- up to 2^32 and buckets that refill within 100 years (config.MaxWindow).
local gcra = {}

-- gcra_max_debt bounds how far ahead of now a TAT goes, in microseconds:
-- 100 years (config.MaxWindow), so that its expiry fits SET PX and now plus
-- it stays exact below 2^53.
local gcra_max_debt = 100 * 365 * 24 * 3600 * 1000000

-- gcra_mulmod returns a * b mod m, for a, b, m below 2^32: split so that no
-- product passes 2^53, where doubles stop being exact.
local function gcra_mulmod(a, b, m)
  local bh = floor(b / 65536)
  local bl = b - bh * 65536
  return fmod(fmod(a * bh, m) * 65536 + a * bl, m)
end

-- gcra_times returns n * T as whole microseconds and a remainder in 1/limit
-- of a microsecond; rule holds T as rule.wq + rule.wr / rule.limit.
local function gcra_times(rule, n)
  local r = gcra_mulmod(fmod(n, rule.limit), rule.wr, rule.limit)
  -- n * wr - r is a multiple of limit: the float quotient is within 2^-20
  -- of it, and rounding finds it.
  local q = floor((n * rule.wr - r) / rule.limit + 0.5)
  return n * rule.wq + q, r
end

-- gcra_add returns (aw, af) + (bw, bf), the remainder below limit.
local function gcra_add(limit, aw, af, bw, bf)
  local w, f = aw + bw, af + bf
  if f >= limit then
    return w + 1, f - limit
  end
  return w, f
end

-- gcra_sub returns (aw, af) - (bw, bf), the remainder borrowed up.
local function gcra_sub(limit, aw, af, bw, bf)
  local w, f = aw - bw, af - bf
  if f < 0 then
    return w - 1, f + limit
  end
  return w, f
end

-- gcra_up rounds (w, f) up to whole microseconds.
local function gcra_up(w, f)
  return f > 0 and w + 1 or w
end

-- gcra_state reads key's TAT for a bucket of limit, as max(TAT, now), and
-- its generation (prelude.lua's generation). A remainder written under
-- another limit (a reload changed it) rounds up.
local function gcra_state(key, limit, now)
  local w, f, gen
  local prior = seen[key] -- charged earlier in this call: TAT known
  if prior then
    w, f, gen = prior.w, prior.f, prior.gen
  else
    local v = get(key)
    if v then
      w, f, gen = string.match(v, '^(%d+):(%d+)/?(%d*)$')
      w, f, gen = tonumber(w), tonumber(f), tonumber(gen)
      if f and f >= limit then
        w, f = w + 1, 0
      end
    end
  end
  if not w or w < now then
    return now, 0, gen or 0
  end
  return w, f, gen or 0
end

-- gcra_write writes key's TAT (w, f) with the call's other writes
-- (write_all), expiring when the bucket is full again; a key that saw a
-- Reset no sooner than it would have: its generation must outlive every
-- charge made before the Reset that is still ahead of now (reset.lua).
local function gcra_write(key, w, f, gen, now)
  local ttl = max(1, ceil(gcra_up(w - now, f) / 1000))
  if gen > 0 then
    ttl = max(ttl, redis.call('PTTL', key))
  end
  write_later(key, fmt(w) .. ':' .. fmt(f) .. generation(gen), fmt(ttl))
end

-- gcra_setup fills rule with T split as whole microseconds and remainder.
local function gcra_setup(rule, limit, window)
  rule.limit = limit
  rule.wq = floor(window / limit)
  rule.wr = window - rule.wq * limit
  if rule.wr < 0 then -- the float quotient rounded up
    rule.wq, rule.wr = rule.wq - 1, rule.wr + limit
  elseif rule.wr >= limit then
    rule.wq, rule.wr = rule.wq + 1, rule.wr - limit
  end
  return rule
end

-- gcra_rule returns T and the bucket's time for limit, window and burst.
-- The hits of a batch mostly share a rule, so the last one is kept: they
-- depend on nothing else, so it holds across calls. (A table keyed by the
-- numbers would do more, but the embedded store's Lua fills a table's array
-- up to any whole-number key below 2^26, such as a window in microseconds.)
local last_rule
local function gcra_rule(limit, window, burst)
  local rule = last_rule
  if not rule or rule.limit ~= limit or rule.window ~= window or rule.burst ~= burst then
    rule = gcra_setup({ limit = limit, window = window, burst = burst, wq = 0, wr = 0, bw = 0, bf = 0 }, limit, window)
    rule.bw, rule.bf = gcra_times(rule, burst)
    last_rule = rule
  end
  return rule
end

-- check: burst is the bucket's size in units (decide.lua's burst field).
function gcra.check(key, limit, window, cost, now, burst)
  if limit <= 0 or burst <= 0 then
    -- No rate or no bucket (a limit override of 0): only a check fits.
    return { admit = cost <= 0, none = true, token = 0 }
  end
  local rule = gcra_rule(limit, window, burst)
  -- Every field named in the constructor: Lua then sizes the table once.
  -- units: what the bucket lacks in whole units, while known without
  -- arithmetic (a full bucket lacks none, and after a charge of c, c).
  local st = { rule = rule, w = 0, f = 0, gen = 0, cw = rule.wq, cf = rule.wr, units = false, admit = false, token = 0 }
  st.w, st.f, st.gen = gcra_state(key, limit, now)
  if st.w == now and st.f == 0 then
    st.units = 0
  end
  if cost ~= 1 then
    st.cw, st.cf = gcra_times(rule, cost)
  end
  -- Owed after the hit beyond the bucket's size: it fits at or below zero.
  local ow, of = gcra_add(limit, st.w - now, st.f, st.cw, st.cf)
  ow, of = gcra_sub(limit, ow, of, rule.bw, rule.bf)
  st.admit = ow < 0 or (ow == 0 and of == 0)
  return st
end

-- commit moves the TAT by the cost and writes it (gcra_write). Its token is
-- the TAT it leaves, rounded up to the microsecond: the end of the charge's
-- time, so that undo gives back only what of it is still ahead of now.
function gcra.commit(key, st, limit, window, cost, now)
  if st.none then
    return
  end
  st.w, st.f = gcra_add(limit, st.w, st.f, st.cw, st.cf)
  st.units = st.units and st.units + cost
  if st.w - now >= gcra_max_debt then
    -- A recorded cost on a slow rate (2^32 units at one a month) would owe
    -- past any TTL Redis takes, and past exact doubles: the debt stops at
    -- 100 years, which denies as long as anyone waits.
    st.w, st.f, st.units = now + gcra_max_debt, 0, false
  end
  gcra_write(key, st.w, st.f, st.gen, now)
  seen[key] = st -- its w and f are what a later check of key in this call reads
  st.token = gcra_up(st.w, st.f)
end

-- gcra_owed_units returns how many whole units the bucket lacks: the least
-- k with k * T >= owed, owed being (ow, of) past now.
local function gcra_owed_units(rule, ow, of)
  if ow == 0 and of == 0 then
    return 0
  end
  local q = (ow + of / rule.limit) / (rule.wq + rule.wr / rule.limit)
  local k = ceil(q)
  -- q is owed / T in floats, a few roundings of 2^-53 each from the exact
  -- quotient: below 2^32, less than 1e-6 off. Unless it lies that close to
  -- a whole number, its ceiling is the exact one.
  if q > 0 and q < 4294967296 and k - q > 1e-4 and k - q < 1 - 1e-4 then
    return k
  end
  k = max(1, k)
  for _ = 1, 4 do -- the float guess is at most a unit off: settle it exactly
    local kw, kf = gcra_times(rule, k)
    if kw < ow or (kw == ow and kf < of) then
      k = k + 1
    elseif k == 1 then
      break
    else
      local pw, pf = gcra_times(rule, k - 1)
      if pw > ow or (pw == ow and pf >= of) then
        k = k - 1
      else
        break
      end
    end
  end
  return k
end

-- result: remaining is the whole units the bucket holds now. The wait is,
-- for an admitted hit, until the bucket is full again; for a denied one,
-- until cost fits: exact, rounded up to the microsecond.
function gcra.result(key, st, limit, window, cost, now)
  if st.none then
    return 0, st.admit and 0 or window
  end
  local rule = st.rule
  local remaining = max(0, rule.burst - (st.units or gcra_owed_units(rule, st.w - now, st.f)))
  if st.admit then
    return remaining, gcra_up(st.w - now, st.f)
  end
  -- From the TAT as it is now (a commit may have moved it since check).
  local ow, of = gcra_add(limit, st.w - now, st.f, st.cw, st.cf)
  return remaining, max(1, gcra_up(gcra_sub(limit, ow, of, rule.bw, rule.bf)))
end

-- gcra_give_back moves key's TAT back by (cw, cf), cost units' time or less,
-- never past now (a bucket is never fuller than full), and returns the
-- whole units given back. Its write waits for write_all, as a charge's.
local function gcra_give_back(key, rule, cost, cw, cf, limit, now)
  if cw == 0 and cf == 0 then
    return 0 -- (a part of a unit's time goes back: a charge of one unit undone a moment after)
  end
  local w, f, gen = gcra_state(key, limit, now)
  if w == now and f == 0 then
    return 0 -- full
  end
  local nw, nf = gcra_sub(limit, w, f, cw, cf)
  if nw < now or (nw == now and nf == 0) then
    -- Full again: no key (but for its generation), and no write of this
    -- call's to come back.
    if gen > 0 then
      gcra_write(key, now, 0, gen, now)
    else
      redis.call('DEL', key)
      unwritten[key] = nil
    end
    seen[key] = { w = now, f = 0, gen = gen }
    return max(0, cost - gcra_owed_units(rule, gcra_sub(limit, cw, cf, w - now, f))) -- what had refilled stays
  end
  -- Known to the call's later hits of key (seen), as a charge is.
  gcra_write(key, nw, nf, gen, now)
  seen[key] = { w = nw, f = nf, gen = gen }
  return cost
end

-- gcra_at_most returns cost units' time (cw, cf), and cost, cut to at most
-- (mw, mf): that time, and the whole units it holds (which a reply counts:
-- the part of a unit's time it also holds goes back with them).
local function gcra_at_most(rule, limit, cost, cw, cf, mw, mf)
  if mw > cw or (mw == cw and mf >= cf) then
    return cost, cw, cf
  end
  cost = gcra_owed_units(rule, mw, mf)
  local kw, kf = gcra_times(rule, cost)
  if kw > mw or (kw == mw and kf > mf) then
    cost = cost - 1 -- whole units only
  end
  return cost, mw, mf
end

-- gcra_above_slices cuts cost units' time (cw, cf) to what key's TAT holds
-- above now and every live hot key's slice recorded beside it (record_slice):
-- a slice spends its units up to the TAT its lease left (the record's token;
-- without one, its units' time from now), so time taken from under it would
-- be charged again while the slice still spends it. For a client's
-- refund (leases), an RLQS lease's units' time too, up to its TAT: its
-- Envoy spends them at any time while the time ahead is theirs, whoever's
-- refilled units the client names; what lies under them, the clients'
-- unrefilled units, may go back. (An undo names its own charge's time.)
-- It returns the cut cost and time (zeros: none above).
local function gcra_above_slices(key, rule, limit, now, cost, cw, cf, leases)
  local w, f = gcra_state(key, limit, now)
  local records, top, leased, leased_top = redis.call('HGETALL', key .. ':slices'), now, 0, now
  for i = 2, #records, 2 do
    local token, units, bucket = string.match(records[i], '^(%d+):(%d+)(:?%a*)$')
    if units then
      local time = gcra_up(gcra_times(rule, tonumber(units)))
      token = tonumber(token) > 0 and tonumber(token) or now + time
      if bucket == '' then
        top = max(top, token)
      elseif leases and token > now then
        leased, leased_top = leased + min(time, token - now), max(leased_top, token)
      end
    end
  end
  top = max(top, min(leased_top, now + leased))
  local fw, ff = gcra_sub(limit, w, f, top, 0)
  if fw < 0 or (fw == 0 and ff == 0) then
    return 0, 0, 0
  end
  return gcra_at_most(rule, limit, cost, cw, cf, fw, ff)
end

-- records_from is the oldest TAT of a slice's or lease's record read
-- again: one that ended in the past holds no time.
function gcra.records_from(st, now)
  return now
end

-- refund gives back cost units' time on key (Envoy's is_negative_hits),
-- never past now (a client's units whose time has refilled are no longer
-- the bucket's to give) nor from under a live slice's or RLQS lease's time
-- (its units would be spent twice), and returns the whole units given back.
function gcra.refund(key, cost, limit, window, now)
  if limit <= 0 then
    return 0 -- no rate: nothing was charged (see check)
  end
  local rule = gcra_setup({}, limit, window)
  local cw, cf = gcra_times(rule, cost)
  cost, cw, cf = gcra_above_slices(key, rule, limit, now, cost, cw, cf, true)
  return gcra_give_back(key, rule, cost, cw, cf, limit, now)
end

-- undo gives back a charge of cost, for refund.lua: only the part of its
-- time still ahead of now, up to its token (the TAT it left, commit): the
-- rest has refilled, and giving it back would give the bucket's later
-- charges' time instead; and, as refund, never from under a live slice;
-- nothing for a charge of another generation (gen, nil for a slice's
-- record: a Reset since). A token of 0 (a charge written before tokens named
-- its end) gives back as refund does.
function gcra.undo(key, token, cost, limit, window, now, gen)
  if limit <= 0 or type(token) ~= 'number' or token <= 0 then
    return gcra.refund(key, cost, limit, window, now)
  end
  local ahead = token - now
  if ahead <= 0 or gen and gen ~= select(3, gcra_state(key, limit, now)) then
    return 0
  end
  local rule = gcra_setup({}, limit, window)
  local cw, cf = gcra_times(rule, cost)
  cost, cw, cf = gcra_above_slices(key, rule, limit, now, gcra_at_most(rule, limit, cost, cw, cf, ahead, 0))
  return gcra_give_back(key, rule, cost, cw, cf, limit, now)
end
