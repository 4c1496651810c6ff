-- region_allowance: the ledger's registry of one global counter's regional
-- allowances, and one region's new allowance, decided atomically with the
-- ledger's Redis TIME as the clock. Run on its own, on the ledger; its text
-- starts with water_level.lua.
--
-- A global limit of L units per window is split among R regions, each
-- deciding on its own Redis with its allowance as the limit: a floor it
-- keeps whatever happens (the rule's share of L, reserved reachable or not)
-- and a grant by demand from the rest, D = L - R * floor. The grants the
-- regions may count under never sum past D, so their counts never pass L.
--
-- KEYS[1]  the registry: a hash, one field per region, its value
--          "<demand> <grant> <lease end, ms of Redis TIME> <held> <count>
--          <limit> <floor> <regions> <turn>"
-- ARGV     region, demand (units per window the region asks for, its floor
--          included; < 0: unknown, the whole limit), count (the units the
--          region's counter holds now), current (the grant the region
--          decides with now, 0: none), limit (L), window (ms), lease (ms),
--          floor (units), regions (R), turn (the region's renewal turn,
--          greater with each)
--
-- A call of a turn no later than the last one run here (it timed out at
-- the region and ran after a later one) changes nothing and is granted
-- nothing: the region took no answer from it, and what it says of the
-- region is older than what the registry knows.
--
-- The regions' calls may disagree on L, the floor and R (a reload reaching
-- one region first, a limit override): the registry keeps each region's,
-- and a call shares the least limit, less the most regions times the most
-- floor, among those of the regions it keeps and its own.
--
-- Beyond its floor, a region may still count under the most of: its grant;
-- held, the larger of the grant it decided with when it asked (it keeps
-- deciding with it until the answer reaches it, or for good when the answer
-- is lost) and the one this registry last gave it (calls may run out of
-- order, as above); and its count past the floor (units counted stay
-- counted: a counter at c under a smaller limit admits nothing until it
-- falls under it). That is reserved from the others while the region's
-- lease lives and for a window and a lease after (its last units stay
-- counted a window, and its own record of the lease may end later than this
-- one, by the time the answer took to reach it); then the entry goes.
--
-- The region's grant is its max-min fair share of D among the live regions'
-- demands past their floors (water_level), in whole units, never more than
-- D less what the others reserve: what one gives up goes to the others at
-- their next call once it no longer counts.
--
-- Reply: two whole numbers as strings: the grant (units beyond the floor)
-- and the room left, D less what every region reserves, this one's new
-- grant included.
local key, region = KEYS[1], ARGV[1]
local demand, count, current = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local limit, window, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local floor_units, regions, turn = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
if not (demand and count and current and limit and window and lease and floor_units and regions and turn)
    or window <= 0 or lease <= 0 or regions < 1 or count < 0 or current < 0 or floor_units < 0 then
  error('region_allowance: bad arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local fields = redis.call('HGETALL', key)
local entries = {}
local least_limit, most_floor, most_regions = limit, floor_units, regions
for i = 1, #fields, 2 do
  local name = fields[i]
  local d, grant, lease_end, h, c, l, f, r, n = string.match(fields[i + 1],
    '^(%S+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  local e = { name = name, d = tonumber(d), grant = tonumber(grant), lease_end = tonumber(lease_end), h = tonumber(h),
    c = tonumber(c), limit = tonumber(l), floor = tonumber(f), regions = tonumber(r), turn = tonumber(n) }
  if not (e.d and e.grant and e.lease_end and e.h and e.c and e.limit and e.floor and e.regions and e.turn) then
    error('region_allowance: bad entry for ' .. name .. ' in ' .. key)
  end
  if e.lease_end + window + lease <= now then
    redis.call('HDEL', key, name)
  elseif name == region and turn <= e.turn then
    return { '0', '0' } -- late: see above
  else
    entries[#entries + 1] = e
    least_limit = math.min(least_limit, e.limit)
    most_floor, most_regions = math.max(most_floor, e.floor), math.max(most_regions, e.regions)
  end
end
local room = math.max(0, least_limit - most_regions * most_floor)

-- wanted is what a demand asks beyond the floor, at most D.
local function wanted(d)
  return d < 0 and room or math.min(room, math.max(0, d - floor_units))
end

local wants = { wanted(demand) } -- this region's first
local reserved = 0                -- by the others
local held = 0
for _, e in ipairs(entries) do
  if e.name == region then
    -- What the region decided with since it asked counts until the entry
    -- goes, its lease ended a window ago: the count the call brings may be
    -- older than those decisions (a call run late).
    held = math.max(current, e.grant)
  else
    reserved = reserved + math.max(e.grant, e.h, e.c - most_floor)
    if e.lease_end > now then
      wants[#wants + 1] = wanted(e.d)
    end
  end
end

local mine = wants[1] -- water_level sorts wants
local grant = math.floor(math.min(mine, water_level(wants, room), math.max(0, room - reserved)))

redis.call('HSET', key, region, string.format('%s %d %d %d %d %d %d %d %d', ARGV[2], grant, now + lease, held, count,
  limit, floor_units, regions, turn))
redis.call('PEXPIRE', key, 2 * lease + window)
local mine_reserved = math.max(grant, held, count - most_floor)
return { string.format('%d', grant), string.format('%d', math.max(0, room - reserved - mine_reserved)) }
