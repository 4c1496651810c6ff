-- Helpers shared by every algorithm file.

-- fmt renders a number for redis.call. Lua would print a microsecond
-- timestamp as 1.7e+15 and lose its last digits.
local function fmt(n)
  return string.format('%.0f', n)
end

-- seen holds what one decide call learnt about its keys (set anew by every
-- call: a function library's locals outlive the call).
local seen = {}
