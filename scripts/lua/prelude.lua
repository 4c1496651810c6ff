-- Helpers shared by every algorithm file.

-- fmt renders a number for redis.call. Lua would print a microsecond
-- timestamp as 1.7e+15 and lose its last digits.
local function fmt(n)
  return string.format('%.0f', n)
end

-- max_count caps a window counter: recorded debts can grow it past any
-- limit, and Lua numbers stay exact below 2^53.
local max_count = 2 ^ 52

-- parse_windows reads a window counter's string (see fixed_window.lua and
-- sliding_window_counter.lua), "<index>:<count>[:<previous count>]"; nil reads as
-- nothing counted.
local function parse_windows(v)
  if not v then
    return nil, 0, 0
  end
  local idx, curr, prev = string.match(v, '^(%d+):(%d+):?(%d*)$')
  return tonumber(idx), tonumber(curr) or 0, tonumber(prev) or 0
end

-- seen holds what one decide call learnt about its keys, and unwritten the
-- window counters it charged, each written once when the call ends (both set
-- anew by every call: a function library's locals outlive the call).
local seen = {}
local unwritten = {}

-- write_later records a window counter's new value, for write_all. Within
-- one call its state is read from seen, never from Redis, so a hot key
-- charged by many requests of the call costs one SET.
local function write_later(key, value, ttl)
  unwritten[key] = { value, ttl }
end

local function write_all()
  for key, w in pairs(unwritten) do
    redis.call('SET', key, w[1], 'PX', w[2])
  end
end
