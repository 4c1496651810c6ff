-- Helpers shared by every algorithm file.

-- Lua's math functions, as locals: called for every hit, they cost less
-- as upvalues than as fields of a global. A function library sees math
-- only when called, so begin_call binds them (bind_math).
local floor, ceil, min, max, fmod

local function bind_math()
  floor, ceil, min, max, fmod = math.floor, math.ceil, math.min, math.max, math.fmod
end

-- fmt renders a whole number (all here are, below 2^53) for redis.call: Lua
-- would print a microsecond timestamp as 1.7e+15, losing its last digits,
-- and '%d' costs Redis far less than a float format.
local function fmt(n)
  return string.format('%d', n)
end

-- max_count caps a window counter: recorded debts can grow it past any
-- limit, and Lua numbers stay exact below 2^53.
local max_count = 2 ^ 52

-- parse_windows reads a window counter's string (fixed_window.lua,
-- sliding_window_counter.lua), "<index>:<count>[:<previous>][/<generation>]";
-- nil reads as nothing counted. The generation counts the Resets the key
-- has seen while it lived (see generation).
local function parse_windows(v)
  if not v then
    return nil, 0, 0, 0
  end
  local idx, curr, prev, gen = string.match(v, '^(%d+):(%d+):?(%d*)/?(%d*)$')
  return tonumber(idx), tonumber(curr) or 0, tonumber(prev) or 0, tonumber(gen) or 0
end

-- generation is the suffix "/<generation>" a counter's or GCRA's value
-- carries after a Reset (reset.lua), kept by every write while the key lives
-- and named in each charge's reply (decide.lua): the give-back of a charge
-- made before a Reset finds another generation, taking nothing charged since.
local function generation(gen)
  return gen > 0 and '/' .. fmt(gen) or ''
end

-- A counter's or GCRA's slices and RLQS leases are recorded beside it, in
-- the hash "<key>:slices" (decide.lua's record_slice, refund.lua's
-- slice_record), and for the window counters also the units the records of
-- each window hold, less what their give-backs took, under
-- "units:<window>": the units a client's refund, or an undo of another
-- charge, never takes (their slices or Envoys spend them, or spent them).
local function held_by_slices(key, idx)
  return tonumber(redis.call('HGET', key .. ':slices', 'units:' .. fmt(idx))) or 0
end

-- seen holds what a decide call learnt about its keys, unwritten the window
-- counters it charged, each written once as the call ends; begin_call empties
-- these and stored (below): a function library's locals outlive the call.
local seen = {}
local unwritten = {} -- key to its value
local expiries = {} -- key to its ttl in ms, or false to keep it
local expire_ats = {} -- key to the Unix ms it expires at, set in place of a ttl (see write_later_at)
local lives = {} -- a log key to the ms it must live from now (see live_later)
local created = {} -- a log key to true when this call created it
local members = {} -- a log key to the ZADD arguments its charges wait to write (see add_later)
local formatted = {} -- fmt_cached's

-- fmt_cached returns fmt(n), formatted once per call and kept under key.
local function fmt_cached(key, n)
  local v = formatted[key]
  if v == nil then
    v = fmt(n)
    formatted[key] = v
  end
  return v
end

-- fmt_once is fmt for the numbers a call formats for many hits (its clock,
-- window starts): microsecond instants, which as keys go to the hash part,
-- not the array the embedded store's Lua fills up to a small whole number.
local function fmt_once(n)
  return fmt_cached(n, n)
end

-- fmt_ttl is fmt_once for a key's time to live in ms (repeated by a window's
-- hits), kept under its negation: off the array part (see fmt_once).
local function fmt_ttl(ms)
  return fmt_cached(-ms, ms)
end

-- stored holds the values of one decide call's window counters and GCRA
-- TATs, read together by prefetch (false: no such key): Redis calls cost
-- more than the commands they run, so a hundred counters cost one MGET, not
-- a hundred GETs. Nothing else writes during the call, and its own writes
-- wait for write_all, so what prefetch read stays true for the call; a key
-- the call charged is read from seen.
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
-- a call left Lua to collect. At most max_pooled are kept.
local pools, max_pooled = {}, 1024

local function new_pool()
  local pool = { taken = 0 }
  pools[#pools + 1] = pool
  return pool
end

-- take returns a state table from pool that no one else in this call holds,
-- as an earlier call left it: its check sets every field its algorithm reads.
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
local call_tables = { seen, unwritten, expiries, expire_ats, stored, formatted, lives, created, members }
local function begin_call()
  bind_math()
  for i = 1, #pools do
    pools[i].taken = 0
  end
  for i = 1, #call_tables do
    clear(call_tables[i])
  end
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

-- write_later records a window counter's new value, for write_all: within
-- a call its state is read from seen, never from Redis, so a hot key charged
-- by many requests costs one SET. A nil ttl keeps the key's expiry (KEEPTTL,
-- cheaper for Redis than setting it): a window counter expires at a time
-- fixed by its window, set when the window's count was first written.
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
-- bounded chunks (see prefetch); a log function reading them flushes first.
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
  -- GT keeps a longer life, which a member newer than TIME needs (after the
  -- clock stepped back); GT never sets a first expiry, so a key this call
  -- created, or one someone made persistent, gets it plainly.
  for key, ms in pairs(lives) do
    local ttl = fmt_ttl(ms)
    if created[key] then
      redis.call('PEXPIRE', key, ttl)
    elseif redis.call('PEXPIRE', key, ttl, 'GT') == 0 and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end
