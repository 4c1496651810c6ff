-- Helpers shared by every algorithm file.

-- Lua's math functions, as locals: called for every hit, they cost less
-- as upvalues than as fields of a global. A function library sees math
-- only when it is called, so bind_math sets them as a call begins
-- (begin_call).
local floor, ceil, min, max, fmod

local function bind_math()
  floor, ceil, min, max, fmod = math.floor, math.ceil, math.min, math.max, math.fmod
end

-- fmt renders a whole number for redis.call. Lua would print a microsecond
-- timestamp as 1.7e+15 and lose its last digits; '%d' formats it as the
-- integer it is (every number here is whole and below 2^53), which costs
-- Redis far less than a float format.
local function fmt(n)
  return string.format('%d', n)
end

-- max_count caps a window counter: recorded debts can grow it past any
-- limit, and Lua numbers stay exact below 2^53.
local max_count = 2 ^ 52

-- parse_windows reads a window counter's string (see fixed_window.lua and
-- sliding_window_counter.lua), "<index>:<count>[:<previous count>][/<generation>]";
-- nil reads as nothing counted. The generation counts the Resets the
-- counter's key has seen while it lived (see generation).
local function parse_windows(v)
  if not v then
    return nil, 0, 0, 0
  end
  local idx, curr, prev, gen = string.match(v, '^(%d+):(%d+):?(%d*)/?(%d*)$')
  return tonumber(idx), tonumber(curr) or 0, tonumber(prev) or 0, tonumber(gen) or 0
end

-- generation is the suffix a counter's or GCRA's value carries after a
-- Reset (reset.lua): "/<generation>", kept by every write while the key
-- lives, and named in each charge's reply (decide.lua), so that the
-- give-back of a charge made before a Reset finds another generation, and
-- takes nothing of the charges made since.
local function generation(gen)
  return gen > 0 and '/' .. fmt(gen) or ''
end

-- seen holds what one decide call learnt about its keys, and unwritten the
-- window counters it charged, each written once when the call ends (these
-- tables, and stored below, are emptied as every call begins: a function
-- library's locals outlive the call).
local seen = {}
local unwritten = {} -- key to its value
local expiries = {} -- key to its ttl in ms, or false to keep it
local expire_ats = {} -- key to the Unix ms it expires at, set in place of a ttl (see write_later_at)
local lives = {} -- a log key to the ms it must live from now (see live_later)
local created = {} -- a log key to true when this call created it
local members = {} -- a log key to the ZADD arguments its charges wait to write (see add_later)
local formatted = {} -- fmt_once's

-- cached returns f(x), computed once per call: cache is one of the call's
-- tables, and f depends on x alone.
local function cached(cache, f, x)
  local v = cache[x]
  if v == nil then
    v = f(x)
    cache[x] = v
  end
  return v
end

-- fmt_once is fmt for the numbers a call formats for many hits (its clock,
-- where each window starts). They are microsecond instants: as table keys
-- they go to the hash part, where the embedded store's Lua would fill an
-- array up to a small whole number.
local function fmt_once(n)
  return cached(formatted, fmt, n)
end

-- fmt_ttl is fmt_once for a whole number of milliseconds (a key's time to
-- live, which repeats for the hits of a window), cached under its negation:
-- small positive keys are the ones the embedded store's Lua would fill an
-- array up to.
local function fmt_ttl(ms)
  local v = formatted[-ms]
  if v == nil then
    v = fmt(ms)
    formatted[-ms] = v
  end
  return v
end

-- stored holds the values of the window counters and GCRA TATs of one
-- decide call, read together by prefetch (false: no such key). Redis calls
-- cost more than the commands they run, and a batch of a hundred requests on
-- a hundred counters then costs one MGET instead of a hundred GETs. Nothing
-- else writes during the call, and the call's own writes wait for
-- write_all, so what prefetch read stays true for the call; a key the call
-- charged is read from seen.
local stored = {}

-- clear empties t. Tables that every call fills are kept and emptied
-- rather than made anew: that costs Lua less than making, growing (by
-- doubling, each time moving what it holds) and collecting new ones.
local function clear(t)
  for k in pairs(t) do
    t[k] = nil
  end
end

-- A pool holds the state tables of one algorithm's checks (see take), kept
-- across calls as the call's other tables are (see clear): a window counter
-- is checked for nearly every hit, and a table per check was most of what
-- a call left Lua to collect. A call takes them from the first on; at most
-- max_pooled are kept, a larger call makes the rest.
local pools, max_pooled = {}, 1024

local function new_pool()
  local pool = { taken = 0 }
  pools[#pools + 1] = pool
  return pool
end

-- take returns a state table from pool that no one else in this call
-- holds. It keeps what it held in an earlier call: the check that takes it
-- sets every field its algorithm reads.
local function take(pool)
  local n = pool.taken + 1
  pool.taken = n
  local st = pool[n]
  if not st then
    st = {}
    if n <= max_pooled then
      pool[n] = st
    end
  end
  return st
end

-- begin_call empties the tables of the call before (see seen and stored),
-- which an error may have left half full, and gives the pools back.
local function begin_call()
  bind_math()
  for i = 1, #pools do
    pools[i].taken = 0
  end
  clear(seen)
  clear(unwritten)
  clear(expiries)
  clear(expire_ats)
  clear(stored)
  clear(formatted)
  clear(lives)
  clear(created)
  clear(members)
end

-- prefetch reads the first n of keys (distinct, each holding a string or
-- nothing) into stored, in bounded chunks: Lua's unpack has a stack limit.
local function prefetch(keys, n)
  for first = 1, n, 1000 do
    local last = min(first + 999, n)
    local values = redis.call('MGET', unpack(keys, first, last))
    for i = first, last do
      stored[keys[i]] = values[i - first + 1]
    end
  end
end

-- get returns key's value, from stored when prefetch read it.
local function get(key)
  local v = stored[key]
  if v == nil then
    return redis.call('GET', key)
  end
  return v or nil
end

-- write_later records a window counter's new value, for write_all. Within
-- one call its state is read from seen, never from Redis, so a hot key
-- charged by many requests of the call costs one SET. A nil ttl keeps the
-- key's expiry (KEEPTTL), which costs Redis less than setting it: the window
-- counters expire at a time fixed by their window, already set when the
-- window's count was first written.
local function write_later(key, value, ttl)
  unwritten[key] = value
  expiries[key] = ttl or false
end

-- write_later_at is write_later with an expiry at a Unix instant in ms, for
-- a key whose expiry names it (reference_fixed_window's).
local function write_later_at(key, value, at)
  unwritten[key] = value
  expiries[key], expire_ats[key] = false, at
end

-- live_later records that a log key must live ms more milliseconds, for
-- write_all, which sets each key's expiry once per call however many times
-- the call charged it. new says the key did not exist before this call.
local function live_later(key, ms, new)
  local prior = lives[key]
  if not prior or ms > prior then
    lives[key] = ms
  end
  if new then
    created[key] = true
  end
end

-- add_later records log members (score, name, score, name, ...) for
-- flush_members: a hot key charged by many requests of one call costs one
-- ZADD, as a window counter costs one SET.
local function add_later(key, args)
  local pending = members[key]
  if not pending then
    members[key] = args
    return
  end
  for i = 1, #args do
    pending[#pending + 1] = args[i]
  end
end

-- flush_members writes key's waiting members (every key's with no key), in
-- bounded chunks: Lua's unpack has a stack limit. A log function that reads
-- a key's members from Redis flushes them first.
local function flush_members(key)
  for k, args in pairs(members) do
    if not key or k == key then
      for first = 1, #args, 1000 do
        redis.call('ZADD', k, unpack(args, first, min(first + 999, #args)))
      end
      members[k] = nil
    end
  end
end

local function write_all()
  flush_members() -- before the expiries: a key this call created exists once written
  for key, value in pairs(unwritten) do
    local ttl, at = expiries[key], expire_ats[key]
    if ttl then
      redis.call('SET', key, value, 'PX', ttl)
    elseif at then
      redis.call('SET', key, value, 'PXAT', at)
    else
      redis.call('SET', key, value, 'KEEPTTL')
    end
  end
  -- GT keeps a longer life, which a member newer than TIME needs (after
  -- the clock stepped back); a key this call created has none yet and gets
  -- it plainly (GT never sets a first expiry), as does one someone made
  -- persistent.
  for key, ms in pairs(lives) do
    local ttl = fmt_ttl(ms)
    if created[key] then
      redis.call('PEXPIRE', key, ttl)
    elseif redis.call('PEXPIRE', key, ttl, 'GT') == 0 and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end
