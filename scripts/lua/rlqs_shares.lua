-- rlqs_shares: the fleet's registry of RLQS assignments on one counter, and
-- one Envoy's (a member's) new share of its limit, decided atomically with
-- Redis TIME as the clock. Run on its own, not with decide.lua; its text
-- starts with water_level.lua.
--
-- KEYS[1]  the registry: a hash, one field per member, its value
--          "<demand> <T> <M> <lease end, ms of Redis TIME>"
-- ARGV     member, demand (units per window; < 0: unknown, wants the whole
--          limit), limit (units per window), window (ms), current (the T
--          the member holds, 0: none), report interval (ms), lease (ms)
--
-- Members whose lease has ended are dropped. The member's share is its
-- max-min fair share (water_level) of the limit among the live members'
-- demands, its new one included, rounded up, at least 1; kept at current
-- when current is at most a fifth above it and leaves the others their fair
-- shares, or it is at most 5 % above current (Envoy restarts a changed token
-- bucket full: it changes when it must); and never more than the limit less
-- the other live members' T, so that the T the Envoys hold never sum past
-- the limit. The entry keeps the larger of current and the grant until the
-- member's next call: it holds current until the answer reaches it (or for
-- good, when it is never sent), so what it gives up goes to others only then.
--
-- Reply: three whole numbers as strings: T granted (0: nothing left), M
-- (the bucket's size, max(1, ceil(T * min(interval, window) / window)), 0
-- for no T), and the lookahead: the units the other live members' buckets
-- may still refill before their leases end, ceil(sum of T * (lease end -
-- now) / window). A bucket's first fill (M) is not leased: see docs/rlqs.md.
local key, member = KEYS[1], ARGV[1]
local demand = tonumber(ARGV[2])
local limit, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local current, interval, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if not (demand and limit and window and current and interval and lease) or window <= 0 or lease <= 0 then
  error('rlqs_shares: bad arguments')
end
local function wanted(d)
  return (d < 0 or d > limit) and limit or d
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local fields = redis.call('HGETALL', key)
local demands = { wanted(demand) }
local others_t, ahead, last_end = 0, 0, now + lease
local others = {} -- { wanted demand, T } of each other live member
for i = 1, #fields, 2 do
  local name = fields[i]
  local d, tokens, size, lease_end = string.match(fields[i + 1], '^(%S+) (%d+) (%d+) (%d+)$')
  d, tokens, size, lease_end = tonumber(d), tonumber(tokens), tonumber(size), tonumber(lease_end)
  if not (d and tokens and size and lease_end) then
    error('rlqs_shares: bad entry for ' .. name .. ' in ' .. key)
  end
  if lease_end <= now then
    redis.call('HDEL', key, name)
  elseif name ~= member then
    demands[#demands + 1] = wanted(d)
    others[#others + 1] = { wanted(d), tokens }
    others_t = others_t + tokens
    ahead = ahead + tokens * (lease_end - now)
    last_end = math.max(last_end, lease_end)
  end
end

local level = water_level(demands, limit)
local share = math.min(wanted(demand), level)

-- What the other members lack of their own fair shares: a share kept above
-- its fair one must leave them that.
local deficit = 0
for _, o in ipairs(others) do
  deficit = deficit + math.max(0, math.max(1, math.ceil(math.min(o[1], level))) - o[2])
end

local desired = math.max(1, math.ceil(share))
if current > 0 and desired <= current and current - desired <= current / 5 and current <= limit - others_t - deficit then
  desired = current
elseif current > 0 and desired >= current and desired <= current * 1.05 then
  desired = current
end
local granted = math.max(0, math.min(desired, limit - others_t))
local size = 0
if granted > 0 then
  size = math.max(1, math.ceil(granted * math.min(interval, window) / window))
end

redis.call('HSET', key, member, string.format('%s %d %d %d', ARGV[2], math.max(granted, current), size, now + lease))
redis.call('PEXPIRE', key, string.format('%d', math.max(2 * lease, last_end - now)))
return { string.format('%d', granted), string.format('%d', size), string.format('%d', math.ceil(ahead / window)) }
