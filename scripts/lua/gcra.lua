-- GCRA (generic cell rate algorithm): a token bucket kept as one number.
-- The bucket holds burst units and refills at limit units per window, one
-- unit every T = window / limit microseconds. Its state is the theoretical
-- arrival time (TAT): the instant the bucket is full again, so that
-- TAT - now is what the bucket owes, in time. A hit of cost c fits when
--   max(TAT, now) + c * T - now <= burst * T
-- and a charge moves TAT to max(TAT, now) + c * T. A bucket with no key is
-- full. Constant memory whatever the rate: one string at KEY, the TAT in
-- microseconds since gcra_epoch (a decimal with a fraction, since T rarely
-- is whole), expiring when the bucket is full again.
local gcra = {}

-- gcra_epoch is 2024-01-01 UTC in microseconds. Offset from it, the TAT
-- keeps 1/64 of a microsecond in a double until mid-2028 (1/32 until 2033);
-- as Unix microseconds it would keep only 1/4.
local gcra_epoch = 1704067200000000

-- gcra_slack absorbs float rounding, in microseconds: a few ulps of the TAT
-- and a relative error of the bucket's size. It decides nothing else: a hit
-- that fits exactly (three hits of 1/3 s in a bucket of one second) fits.
local function gcra_slack(size)
  return 1 / 32 + size * 2 ^ -50
end

-- gcra_read returns the stored TAT of key (relative to gcra_epoch), or nil.
local function gcra_read(key)
  return tonumber(redis.call('GET', key))
end

local function gcra_write(key, tat, rnow)
  write_later(key, string.format('%.17g', tat), fmt(math.max(1, math.ceil((tat - rnow) / 1000))))
end

-- check: burst is the bucket's size in units (decide.lua's fifth value for
-- a GCRA hit). Times in st are relative to gcra_epoch.
function gcra.check(key, limit, window, cost, now, burst)
  local st = { interval = window / limit, burst = burst, rnow = now - gcra_epoch }
  local prior = seen[key] -- charged earlier in this call: TAT known
  local tat = prior and prior.tat or gcra_read(key)
  st.tat = math.max(tat or st.rnow, st.rnow)
  local size = burst * st.interval
  st.admit = st.tat - st.rnow + cost * st.interval <= size + gcra_slack(size)
  return st
end

-- commit moves the TAT by the cost and writes it, expiring when the bucket
-- is full again. The refund token is the charge in nanoseconds (refund.lua
-- gives back that much time, never past now), at most 2^62.
function gcra.commit(key, st, limit, window, cost, now)
  local charge = cost * st.interval
  st.tat = st.tat + charge
  gcra_write(key, st.tat, st.rnow)
  seen[key] = { tat = st.tat }
  st.token = math.min(math.floor(charge * 1000 + 0.5), 2 ^ 62)
end

-- result: remaining is the whole units the bucket holds now. The wait is,
-- for an admitted hit, until the bucket is full again; for a denied one,
-- until cost fits: exact to the microsecond, rounded up.
function gcra.result(key, st, limit, window, cost, now)
  local owed = st.tat - st.rnow
  local size = st.burst * st.interval
  local slack = gcra_slack(size)
  local remaining = math.floor((size - owed + slack) / st.interval)
  remaining = math.max(0, math.min(st.burst, remaining))
  if st.admit then
    if owed <= slack then
      return remaining, 0
    end
    return remaining, math.ceil(owed)
  end
  return remaining, math.max(1, math.ceil(owed + cost * st.interval - size - slack))
end

-- refund gives back amount microseconds of a charge on key, never past
-- now (a bucket is never fuller than full), and returns the microseconds
-- given back. rnow is now relative to gcra_epoch.
function gcra.refund(key, amount, rnow)
  local tat = gcra_read(key)
  if not tat or tat <= rnow then
    return 0
  end
  local back = math.min(amount, tat - rnow)
  if tat - back <= rnow then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.17g', tat - back), 'PX', fmt(math.max(1, math.ceil((tat - back - rnow) / 1000))))
  end
  return back
end

-- gcra.now is Redis TIME relative to gcra_epoch, for refund.lua.
function gcra.now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]) - gcra_epoch
end
