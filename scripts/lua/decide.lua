-- decide: a batch of requests, decided one after another in the order given,
-- each atomically (all or nothing), with one Redis TIME as the clock.
--
-- keys     the base keys of every hit of every request, request after
--          request (each key carries its hash tag); after them, the keys of
--          the slices' records the call writes (see record_slice)
-- args     per request: n, the number of its hits, negated to only check
--          (never charge); then one string per hit, its rule, positional:
--          "alg:<op><role>:limit:window:cost:burst:ahead:extra:nonce", the
--          fields after cost optional. alg is the algorithm's ID (ALG_*, its
--          index in algorithms); op a letter of OPS (algorithms.go's Ops:
--          what the hit asks, and how it is applied); role ROLE_ENFORCED,
--          ROLE_SHADOW, or ROLE_QUOTA or ROLE_QUOTA_OVER followed by its
--          quota group (a quota over: Go denied another of its hits). window
--          is in seconds, or, for a fixed window aligned to the calendar, the
--          Unix seconds of four window edges, comma-separated and ascending
--          (see fixed_window.lua's span). burst is a GCRA hit's bucket size in
--          units; ahead, a slice's (a hot key's, an RLQS lease's) milliseconds
--          of use: the log records its units that far ahead of now (see its
--          commit), the other algorithms record the lease beside their count
--          (record_slice). extra and nonce are a lease's TTL in milliseconds
--          and its nonce, or a settlement's units reserved and the nonce it
--          names (empty: no lease); see sliding_window_log.lua's commit and
--          settle; a nonce alone names a log charge made as a part of a
--          request, which its give-back may take back (commit)
--
-- A request is charged only when every enforced (non-shadow, non-quota) hit
-- fits and, when it has quota hits, at least one of its quotas fits: the
-- quota hits of one group (a descriptor's limits) are one quota, which fits
-- when each of them fits. This rule is the twin of Go's requestRule
-- (internal/limiter/outcome.go): the check loop below applies it,
-- atomically, where the charges depend on it; a change to one is a change
-- to the other, and TestRequestRuleTwins checks them against each other. A
-- shadow hit that does not fit is not charged, nor is any hit of a quota
-- that does not fit, and a shadow hit never denies its request. A recorded
-- hit (a cost reported after the fact) is charged whatever its request's
-- fate, even past its limit: the debt then denies later hits until the
-- window has slid past it. A check (cost 0) asks for one unit: it is denied
-- while nothing remains.
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
-- that did not fit; plus 4 times a charged counter's or GCRA's generation,
-- see prelude.lua's generation), remaining, microseconds until reset (see each
-- algorithm's result; for a recorded cost that did not fit and for a refund,
-- until one unit fits), and a refund token: what refund.lua needs to undo a
-- charge (the log's score, the counters' window index, GCRA's TAT after
-- the charge, which ends its time; for a slice of a counter or GCRA, its
-- record's name negated: see record_slice). A part's log members are named
-- by its score and the nonce the caller sent (see sliding_window_log.lua's
-- commit), which the caller keeps.

-- algorithms, generated before this file from algorithms.go, holds each
-- algorithm's table at its ID.

-- rules maps a hit's argument string to what it says, parsed once: the
-- hits of a batch mostly repeat the few rules of a config, and so do the
-- batches. A function library's locals outlive the call, so the table is
-- emptied when it grows past max_rules (costs vary with hits_addend).
local rules, nrules, max_rules = {}, 0, 1000

local function parse_rule(s)
  local alg, op, role, group, limit, window, cost, burst, ahead, extra, nonce =
    string.match(s, '^(%d+):(%l)(%l)(%d*):(%d+):([%d,]+):(%d+):?(%d*):?(%d*):?(%d*):?(%x*)$')
  local kind = OPS[op]
  cost = tonumber(cost)
  if not kind or not cost then
    error('decide: malformed hit argument ' .. s)
  end
  alg = tonumber(alg)
  if string.find(window, ',', 1, true) then
    if alg ~= ALG_FIXED_WINDOW then
      error('decide: calendar edges for an algorithm other than fixed_window in hit argument ' .. s)
    end
    local edges = {}
    for edge in string.gmatch(window, '%d+') do
      edges[#edges + 1] = tonumber(edge) * 1000000
    end
    window = edges
  else
    window = tonumber(window) * 1000000
  end
  local quota = role == ROLE_QUOTA or role == ROLE_QUOTA_OVER
  local rule = {
    alg = algorithms[alg],
    limit = tonumber(limit),
    window = window, -- microseconds, or a calendar's edges in microseconds
    cost = cost,
    need = math.max(cost, 1), -- math.max: tests call parse_rule outside a call (see bind_math)
    burst = tonumber(burst), -- nil but for GCRA
    ahead = (tonumber(ahead) or 0) * 1000, -- a slice's, in microseconds
    shadow = role == ROLE_SHADOW,
    record = kind.record,
    refund = kind.applied_first,
    quota = quota,
    group = quota and tonumber(group) or 0, -- a quota hit's: its quota
    over = role == ROLE_QUOTA_OVER, -- a quota hit's: its quota is over already
    -- a conditional record's condition (rlqs_lease.lua's record_conditions)
    conditional = kind.conditional and record_conditions[kind.name],
    bucket = kind.bucket, -- an Envoy's token bucket's lease: see record_slice
    lease = false, -- a lease's { ttl (microseconds), nonce }
    part = not (kind.lease or kind.settle) and nonce ~= '' and nonce, -- a part's charge's nonce (see sliding_window_log.commit)
    settle = false, -- a settlement's { units reserved, nonce }
    string = alg ~= ALG_SLIDING_WINDOW_LOG, -- kept in a string, read by prefetch
    charges = kind.charges and cost > 0, -- a charge of units (not a refund, not a check)
  }
  if not rule.alg or (not quota and role ~= ROLE_ENFORCED and role ~= ROLE_SHADOW) then
    error('decide: unknown algorithm or role in hit argument ' .. s)
  end
  if kind.conditional and not rule.conditional then
    error('decide: no condition (record_conditions) for the op of hit argument ' .. s)
  end
  if kind.lease or kind.settle then
    -- A lease's nonce is its own: the argument is never seen again, and is
    -- not kept among the rules.
    local n = tonumber(extra) or 0
    if kind.settle then
      rule.settle = { reserved = n, nonce = nonce }
    else
      rule.lease = { ttl = n * 1000, nonce = nonce }
    end
    return rule
  end
  if rule.part then
    return rule -- its nonce is its own, as a lease's
  end
  if nrules >= max_rules then
    rules, nrules = {}, 0
  end
  rules[s], nrules = rule, nrules + 1
  return rule
end

-- record_slice records a hot key's slice or an RLQS lease taken from a
-- counter or GCRA (the log names its members instead) beside the count, in
-- the hash "<key>:slices": "<token>:<units>", and ":bucket" after an RLQS
-- lease's (see gcra_above_slices), while the count can hold them. Its
-- give-back (refund.lua) takes back at most what the record holds, once:
-- nothing once a failover lost it with the lease, or a Reset deleted it.
-- It returns the record's name, negated, for the reply's token: the
-- charge's time, or the first microsecond after it no record of the key
-- holds, nor held before a Reset ("next", see reset.lua), so that no
-- give-back names another lease's record. named[h] is the last name this
-- call gave in h: a call's records of one key (an RLQS fleet's leases)
-- come after it, each with one HSETNX, not a probe past every name taken.
local named = {}
local function record_slice(key, token, rule, st, now)
  local h = key .. ':slices' -- declared in the call's keys after the hits' (Go's sliceRecordKey)
  local rec = fmt(token) .. ':' .. fmt(rule.cost) .. (rule.bucket and ':bucket' or '')
  local name = named[h]
  name = name and name + 1 or max(now, tonumber(redis.call('HGET', h, 'next')) or 0)
  while redis.call('HSETNX', h, fmt(name), rec) == 0 do
    name = name + 1
  end
  named[h] = name
  local ttl = type(rule.window) == 'number' and 2 * rule.window or rule.window[#rule.window] - now
  if st.w then -- GCRA: its TAT
    ttl = max(ttl, st.w - now + rule.window)
  end
  ttl = ceil(ttl / 1000)
  if redis.call('PTTL', h) < ttl then
    redis.call('PEXPIRE', h, fmt(ttl))
  end
  return -name
end

-- The state of a refund: shared, as nothing writes to it (it is never
-- committed).
local refunded = { admit = true, token = 0 }

-- The tables of a call kept for the next, as prelude.lua's are (see
-- clear): each is read only up to where this call wrote it, but the
-- reply, which Redis reads up to its first nil, is cut to this call's
-- length (replied).
local hit_rules, starts, strings, states, reply = {}, {}, {}, {}, {}
local replied = 0

-- quota_over[group] is q while request q of this call has a hit of that
-- quota group that does not fit (the quota is over); emptied as a call
-- begins, and written only for quota hits.
local quota_over = {}

local function decide(keys, args)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  begin_call()
  clear(quota_over)
  clear(named)
  -- Parse every request first, to read every string counter of the batch
  -- with one MGET (see prefetch); the log's sorted sets are read one by one.
  -- Hit h (keys[h]) has the rule hit_rules[h]; request q holds hits
  -- starts[q] to starts[q + 1] - 1. checks[q] is true when request q only
  -- checks, refunds[q] when it has a refund, conditions[q] its conditional
  -- records' condition when it has some: all are rare, so their tables
  -- are made only when needed. A string counter's key is listed once
  -- for the MGET, marked in stored (false) until prefetch reads it.
  local nreq = 0
  local checks, refunds, conditions = false, false, false
  local nstrings = 0
  local h, a, nargs = 0, 1, #args
  while a <= nargs do
    local n = tonumber(args[a])
    nreq = nreq + 1
    starts[nreq] = h + 1
    if n < 0 then
      checks = checks or {}
      checks[nreq] = true
      n = -n
    end
    local last = a + n
    for i = a + 1, last do
      local s = args[i]
      local rule = rules[s] or parse_rule(s)
      h = h + 1
      hit_rules[h] = rule
      if rule.string then
        local key = keys[h]
        if stored[key] == nil then
          stored[key] = false
          nstrings = nstrings + 1
          strings[nstrings] = key
        end
      end
      if rule.refund then
        refunds = refunds or {}
        refunds[nreq] = true
      end
      if rule.conditional then
        conditions = conditions or {}
        conditions[nreq] = rule.conditional
      end
    end
    a = last + 1
  end
  starts[nreq + 1] = h + 1
  -- The reply's length is known now (four values a hit): a call that fails
  -- after writing part of it leaves no value past what the next call cuts.
  if 4 * h > replied then
    replied = 4 * h
  end
  prefetch(strings, nstrings)
  -- denied[key] is the last denial of key in this batch, as the state a
  -- later hit of the same rule is given without asking Redis (again: its
  -- answer is known), until a charge of key changes its state. It is no
  -- second deny cache (the Go one is internal/limiter/denycache.go): it
  -- lives for this call, in which the clock (now) does not move and nothing
  -- else writes, so it answers exactly what checking again would, only
  -- cheaper for a burst at one key. Made at the call's first denial.
  local denied = false
  local r = 0
  for q = 1, nreq do
    local first, last = starts[q], starts[q + 1] - 1
    local charge = not (checks and checks[q])
    -- The request's refunds first: the checks below, and the charges they
    -- lead to, start from the state the refunds leave.
    if refunds and refunds[q] then
      for i = first, last do
        local rule = hit_rules[i]
        if rule.settle or rule.refund then
          if rule.settle then
            rule.alg.settle(keys[i], rule.settle, rule.cost, rule.limit, rule.window, now)
          else
            rule.alg.refund(keys[i], rule.cost, rule.limit, rule.window, now)
          end
          if denied then
            denied[keys[i]] = nil
          end
          states[i] = refunded
        end
      end
    end
    -- The request's rule, twin of Go's requestRule: refunds and shadow
    -- hits never deny, a quota denies only with every other quota, any
    -- other hit denies when it does not fit.
    local quotas = false
    for i = first, last do
      local rule = hit_rules[i]
      if not rule.refund then
        local key = keys[i]
        local st = denied and denied[key]
        -- A denial is never of a recorded hit, so it is never committed
        -- (a conditional record's may be: it is checked afresh).
        if not st or st.rule ~= rule or rule.conditional then
          st = rule.alg.check(key, rule.limit, rule.window, rule.need, now, rule.burst)
        end
        states[i] = st
        if rule.quota then
          quotas = true
          if rule.over or not st.admit then
            quota_over[rule.group] = q
          end
        elseif not st.admit and not rule.shadow then
          charge = false
        end
      end
    end
    if quotas and charge then
      -- One quota whole is enough: a hit of a group not over.
      charge = false
      for i = first, last do
        local rule = hit_rules[i]
        if rule.quota and quota_over[rule.group] ~= q then
          charge = true
          break
        end
      end
    end
    local condition = conditions and conditions[q]
    local recorded = condition and condition(keys, hit_rules, states, now, first, last)
    for i = first, last do
      local rule, key, st = hit_rules[i], keys[i], states[i]
      local alg = rule.alg
      -- A quota over charges none of its hits, as a denied request.
      local charged = rule.charges and
        (rule.record and (recorded or not rule.conditional) or
          charge and st.admit and not (rule.quota and quota_over[rule.group] == q))
      -- (A denial answered again is never charged: see the check loop.)
      if charged then
        alg.commit(key, st, rule.limit, rule.window, rule.cost, now, rule.ahead, rule.lease, rule.part)
        if denied then
          denied[key] = nil
        end
      end
      local remaining, reset
      if st.again then
        remaining, reset = st.remaining, st.reset
      elseif rule.refund or charged and not st.admit then
        -- A refund (applied above), or a recorded cost past the limit: the
        -- state changed, so the answer is about the next unit.
        local next = alg.check(key, rule.limit, rule.window, 1, now, rule.burst)
        remaining, reset = alg.result(key, next, rule.limit, rule.window, 1, now)
      else
        remaining, reset = alg.result(key, st, rule.limit, rule.window, rule.need, now)
        if not st.admit then
          denied = denied or {}
          denied[key] = { rule = rule, remaining = remaining, reset = reset, again = true, admit = false, token = 0 }
        end
      end
      local state
      if charged then
        state = st.admit and 2 or 3
      else
        state = st.admit and 1 or 0
      end
      reply[r + 1] = state + 4 * (charged and st.gen or 0)
      reply[r + 2] = floor(remaining)
      reply[r + 3] = floor(reset)
      local token = charged and st.token or 0
      if charged and rule.ahead > 0 and rule.string then
        token = record_slice(key, token, rule, st, now)
      end
      reply[r + 4] = token
      r = r + 4
    end
  end
  write_all()
  for i = r + 1, replied do
    reply[i] = nil
  end
  replied = r
  return reply
end
