-- Sliding window log: a sorted set of admitted hits, scored by Redis TIME in
-- microseconds. A hit at score s counts while s > now - window, so the window
-- is exact: no boundary to straddle. Only admitted hits are recorded; a cost
-- of N records N members. Memory grows with the limit (one member per unit).
--
-- A debt (a recorded cost past the limit) is members like any other, and
-- leaves the window with them. One charge records at most limit members:
-- they share one score, and limit members at one score already fill every
-- window that holds them, so more would change no decision.

local sliding_window_log = {}

-- check removes the members that left the window, then counts the rest
-- (ZCARD, where ZCOUNT would walk a small set's members one by one). A denied
-- request leaves no trace in Redis: the removal takes out only what no window
-- counts any more, and writes nothing when nothing left. A key this call
-- already charged is known from seen: same clock and window, no other writer.
function sliding_window_log.check(key, limit, window, cost, now)
  local oldest = fmt_once(now - window) -- members scored at or below it have left
  local prior = seen[key]
  local used = prior and prior.used
  if not used then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', oldest)
    used = redis.call('ZCARD', key)
  end
  -- Every field named, commit's too: Lua then sizes the table once.
  return { oldest = oldest, used = used, admit = used + cost <= limit, prior = prior, token = 0, newest = false,
    last_own = false, last_ahead = false }
end

-- member_args returns the ZADD arguments of cost members scored s (commit).
local function member_args(s, base, cost)
  local args = {}
  for i = 1, cost do
    args[#args + 1] = s
    args[#args + 1] = (i == 1) and base or (base .. ':' .. i)
  end
  return args
end

-- commit records cost members (check took out those that left the
-- window), named "<score>" and "<score>:<i>", so that a refund can name
-- them. A single unit is added as its microsecond, NX: scripts run one after
-- another and each takes several microseconds, so the name is taken only if
-- Redis's clock stepped back onto a recorded microsecond (a failover to a
-- host with another clock). Otherwise (weighted hits, a key this call
-- already charged, a slice) the score is the first microsecond from TIME on
-- whose name is free among the charges of its kind (this call's, and
-- Redis's): a member of another kind, a slice's or a lease's recorded ahead,
-- never moves a charge's score, which would count it longer than its window.
--
-- A part's charge (part: its nonce; a request decided by more than one
-- call, on two stores or Cluster slots, whose other call may deny it) is
-- named "<score>p<nonce>" and "<score>p<nonce>:<i>", unique by its nonce
-- whatever its score (TIME, or after this call's last charge of the key): a
-- refund may take it as any charge's, and its give-back then finds nothing,
-- but never a later charge's members that took its freed name.
--
-- A slice (a service instance's lease of the limit for a hot key, used over
-- the ahead microseconds that follow) is recorded at now + ahead, the last
-- instant a unit of it can be used: every window holding a use of the slice
-- holds its members too, so the log stays exact. They count from now on
-- (check counts every member above now - window, future ones too), so a
-- slice costs its units for ahead longer than hits do. Its names, "A<score>"
-- and "A<score>:<i>", let a Reset tell them from a hit's (see reset.lua).
--
-- A lease (lease = { ttl, nonce }: a seat, or a reservation to settle) is
-- recorded at now + ttl - window, so that its members leave the window, and
-- the count, ttl after now: check takes an expired lease out with the other
-- members that left, at Redis TIME, with no sweep. Its members are named
-- "L<nonce>" and "L<nonce>:<i>" by the caller's random nonce, so that only
-- the holder of the lease id can name them to settle (see settle).
function sliding_window_log.commit(key, st, limit, window, cost, now, ahead, lease, part)
  cost = min(cost, limit)
  if cost <= 0 then
    return -- a recorded cost on a limit of 0: no member, which would count as a unit
  end
  local score, prior = now + (ahead or 0), st.prior
  local slice = not lease and (ahead or 0) > 0 -- named "A...": see below
  local added = false
  if lease then
    score = now + lease.ttl - window
    add_later(key, member_args(fmt(score), 'L' .. lease.nonce, cost))
  else
    local prefix = slice and 'A' or ''
    added = not (prior or cost > 1 or slice or part) and redis.call('ZADD', key, 'NX', fmt_once(score), fmt_once(score)) == 1
    if not added then
      local last = prior and (slice and prior.last_ahead or not slice and prior.last_own)
      if last and last >= score then
        score = last + 1 -- this call's are not written yet (add_later)
      end
      while not part and redis.call('ZSCORE', key, prefix .. fmt(score)) do
        score = score + 1
      end
      local s = fmt(score)
      local base = prefix .. s -- a slice's: see reset.lua
      if part then
        base = base .. 'p' .. part
      end
      add_later(key, member_args(s, base, cost)) -- written when the call ends, with the key's other charges
    end
  end
  -- The key lives until its newest member leaves the window (live_later);
  -- it is new when check found no member and this call had not charged it.
  local ms = ceil((score + window - now) / 1000)
  live_later(key, lease and max(1, ms) or ms, st.used == 0 and not prior)
  st.used = st.used + cost
  st.token = score -- names the members, for a refund
  local newest = prior and prior.newest
  st.newest = newest and max(newest, score) or added and score -- false: read it from Redis
  st.last_own = not (lease or slice) and score or prior and prior.last_own
  st.last_ahead = slice and score or prior and prior.last_ahead
  seen[key] = st -- its used, newest and last names are what a later check of key reads
end

-- refund removes up to units of the newest members still in the window
-- that a request's own charge added, named by their scores: none of a
-- slice or a lease ("A..." or "L...", see commit), which their give-back
-- or settlement takes by name (a live slice's are recorded ahead of now,
-- and an ended slice's unused members are the newest: a refund that took
-- them would leave the client's units counted). A charge's own may be ahead
-- of now too (charges at one Redis TIME are scored a microsecond apart);
-- members that left the window are not counted, so no other window's go back.
function sliding_window_log.refund(key, units, limit, window, now)
  flush_members(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
  local n, offset = units, 0
  while n > 0 do
    local page = redis.call('ZREVRANGEBYSCORE', key, '+inf', '-inf', 'LIMIT', offset, 1000) -- unpack's stack limit
    if #page == 0 then
      break
    end
    local gone = {}
    for _, m in ipairs(page) do
      if #gone < n and string.find(m, '^%d') then -- a charge's own, named by its score
        gone[#gone + 1] = m
      end
    end
    if #gone > 0 then
      redis.call('ZREM', key, unpack(gone))
    end
    n, offset = n - #gone, offset + #page - #gone
  end
  seen[key] = nil -- read again: the newest member may be gone
end

-- settle closes a lease (lease = { reserved, nonce }, the units it took
-- and the nonce that names them): its members go, whatever is left of them
-- (none once its TTL passed, or once settled), and cost, the actual cost,
-- is recorded at now in their place, even past the limit (already spent).
-- A nonce that names nothing frees nothing; an empty one names no lease.
function sliding_window_log.settle(key, lease, cost, limit, window, now)
  flush_members(key)
  if lease.nonce ~= '' then
    sliding_window_log.undo(key, 'L' .. lease.nonce, min(lease.reserved, limit))
  end
  seen[key] = nil -- read again: the newest member may be gone
  if cost > 0 then
    local st = sliding_window_log.check(key, limit, window, cost, now)
    sliding_window_log.commit(key, st, limit, window, cost, now, 0)
  end
end

-- undo removes the members a charge of cost added, which token (the
-- charge's score, or a base name: a slice's "A<score>", a lease's
-- "L<nonce>", a part's "<score>p<nonce>") names: for refund.lua
-- and settle. It returns how many it removed.
function sliding_window_log.undo(key, token, cost)
  local s = type(token) == 'string' and token or fmt(token)
  local removed = 0
  for first = 1, cost, 1000 do -- in bounded chunks: Lua's unpack has a stack limit
    local names = {}
    for j = first, min(first + 999, cost) do
      names[#names + 1] = (j == 1) and s or (s .. ':' .. j)
    end
    removed = removed + redis.call('ZREM', key, unpack(names))
  end
  return removed
end

-- result returns what is left and, in microseconds, the honest wait: for an
-- admitted hit, until the window is empty again; for a denied one, until
-- enough of the oldest members expire for cost to fit.
function sliding_window_log.result(key, st, limit, window, cost, now)
  local remaining = max(0, limit - st.used)
  if not st.newest or not st.admit then
    flush_members(key) -- read below
  end
  if st.admit then
    if st.used == 0 then
      return remaining, 0
    end
    local newest = st.newest -- known when this call recorded it
    if not newest then
      newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    end
    return remaining, max(0, newest + window - now)
  end
  -- The k-th oldest member inside the window must leave before cost fits.
  local k = st.used + cost - limit
  local entry = redis.call('ZRANGEBYSCORE', key, '(' .. st.oldest, '+inf',
    'WITHSCORES', 'LIMIT', fmt(k - 1), '1')
  if not entry[2] then
    return remaining, window
  end
  return remaining, max(1, tonumber(entry[2]) + window - now)
end
