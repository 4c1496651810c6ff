-- decide: a batch of requests, decided one after another in the order given,
-- each atomically (all or nothing), with one Redis TIME as the clock.
--
-- keys     the base keys of every hit of every request, request after
--          request (each key carries its hash tag)
-- args     per request: n, the number of its hits, negated to only check
--          (never charge); then per hit: code, limit, window in seconds,
--          cost, and for a GCRA hit a fifth value, burst (the bucket's size
--          in units). code = algorithm (1 log, 2 counter, 3 fixed, 4 gcra)
--          + 8 for a shadow hit + 16 for a cost that is recorded even when
--          it does not fit + 32 for a refund of cost units + 64 for a quota
--          hit (quota_mode)
--
-- A request is charged only when every enforced (non-shadow, non-quota) hit
-- fits and, when it has quota hits, at least one of them fits. A shadow hit,
-- or a quota hit, that does not fit is not charged, and a shadow hit never
-- denies its request. A recorded hit (a cost reported after the fact) is
-- charged whatever its request's fate, even past its limit: the debt then
-- denies later hits until the window has slid past it. A check (cost 0) asks
-- for one unit: it is denied while nothing remains.
--
-- Order within a request: its refunds first. A refund gives units back (see
-- each algorithm's refund), never denies, and is applied whatever its
-- request's fate, before the request's other hits are checked: a charge of
-- the same key, before or after the refund among the request's hits, is
-- decided and written from the state the refund left. Then every other hit
-- is checked, and only then are the charges applied. Requests later in the
-- batch see the refunds and charges of earlier ones, so a burst at one key
-- is decided in order, as if the requests had come one by one.
--
-- Reply: four integers per hit, in order: state (0 denied, 1 admitted and
-- not charged, 2 admitted and charged, 3 denied but charged: a recorded cost
-- that did not fit), remaining, microseconds until reset (see each
-- algorithm's result; for a recorded cost that did not fit and for a refund,
-- until one unit fits), and a refund token: what refund.lua needs to undo a
-- charge (the log's score, the counters' window index; 0 for GCRA, whose
-- refund takes the hit's limit and window instead).
local algorithms = { sliding_window_log, sliding_window_counter, fixed_window, gcra }

local function decide(keys, args)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  seen, unwritten, expiries, stored, formatted = {}, {}, {}, {}, {}
  -- denied[key] is the last denial of key in this batch: a later hit with the
  -- same limit and cost is denied again without asking Redis, until a charge
  -- of key changes its state.
  local denied = {}
  local reply, r = {}, 0
  -- num is tonumber for the arguments, which repeat (the limits, windows
  -- and costs of a few rules): each distinct string is parsed once a call.
  local numbers = {}
  local function num(s)
    return cached(numbers, tonumber, s)
  end
  -- Parse every request first, to read every string counter of the batch
  -- with one MGET (see prefetch); the log's sorted sets are read one by one.
  local requests, strings, listed = {}, {}, {}
  local k, a, nargs = 1, 1, #args
  while a <= nargs do
    local n = tonumber(args[a])
    a = a + 1
    local hits = {}
    for i = 1, math.abs(n) do
      local code = num(args[a])
      local key = keys[k]
      local cost = num(args[a + 3])
      local hit = {
        key = key,
        alg = algorithms[code % 8],
        limit = num(args[a + 1]),
        window = num(args[a + 2]) * 1000000,
        cost = cost,
        need = math.max(cost, 1),
        shadow = code % 16 >= 8,
        record = code % 32 >= 16,
        refund = code % 64 >= 32,
        quota = code >= 64,
      }
      if code % 8 == 4 then
        hit.burst = num(args[a + 4]) -- gcra's fifth value
        a = a + 1
      end
      if code % 8 ~= 1 and not listed[key] then
        listed[key] = true
        strings[#strings + 1] = key
      end
      hits[i] = hit
      a, k = a + 4, k + 1
    end
    requests[#requests + 1] = { charge = n > 0, hits = hits }
  end
  prefetch(strings)
  for _, request in ipairs(requests) do
    local charge, hits = request.charge, request.hits
    -- The request's refunds first: the checks below, and the charges they
    -- lead to, start from the state the refunds leave.
    for _, hit in ipairs(hits) do
      if hit.refund then
        hit.alg.refund(hit.key, hit.cost, hit.limit, hit.window, now)
        denied[hit.key] = nil
        hit.st = { admit = true }
      end
    end
    local quotas, quota_fits = false, false
    for _, hit in ipairs(hits) do
      if not hit.refund then
        local d = denied[hit.key]
        if d and d.limit == hit.limit and d.cost == hit.cost and d.burst == hit.burst and not hit.record then
          hit.again = d
          hit.st = { admit = false }
        else
          hit.st = hit.alg.check(hit.key, hit.limit, hit.window, hit.need, now, hit.burst)
        end
        if hit.quota then
          quotas = true
          quota_fits = quota_fits or hit.st.admit
        elseif not hit.st.admit and not hit.shadow then
          charge = false
        end
      end
    end
    if quotas and not quota_fits then
      charge = false
    end
    for _, hit in ipairs(hits) do
      local charged = not hit.refund and hit.cost > 0 and (hit.record or charge and hit.st.admit)
      local remaining, reset
      if hit.again then
        remaining, reset = hit.again.remaining, hit.again.reset
      elseif hit.refund or charged and not hit.st.admit then
        -- A refund (applied above), or a recorded cost past the limit: the
        -- state changed, so the answer is about the next unit.
        if not hit.refund then
          hit.alg.commit(hit.key, hit.st, hit.limit, hit.window, hit.cost, now)
          denied[hit.key] = nil
        end
        local st = hit.alg.check(hit.key, hit.limit, hit.window, 1, now, hit.burst)
        remaining, reset = hit.alg.result(hit.key, st, hit.limit, hit.window, 1, now)
      else
        if charged then
          hit.alg.commit(hit.key, hit.st, hit.limit, hit.window, hit.cost, now)
          denied[hit.key] = nil
        end
        remaining, reset = hit.alg.result(hit.key, hit.st, hit.limit, hit.window, hit.need, now)
        if not hit.st.admit then
          denied[hit.key] = { limit = hit.limit, cost = hit.cost, burst = hit.burst, remaining = remaining, reset = reset }
        end
      end
      local state = hit.st.admit and 1 or 0
      if charged then
        state = hit.st.admit and 2 or 3
      end
      reply[r + 1] = state
      reply[r + 2] = math.floor(remaining)
      reply[r + 3] = math.floor(reset)
      reply[r + 4] = charged and hit.st.token or 0
      r = r + 4
    end
  end
  write_all()
  return reply
end
