-- region_sync: a region's record of one global counter's allowance, on the
-- region's own store, shared by the region's instances; decided atomically
-- with that store's Redis TIME as the clock. Run on its own.
--
-- KEYS[1]  the record: a hash with the fields grant, lease_end (ms of Redis
--          TIME), renewer, turn and renew_until (the instance renewing the
--          grant, its turn, and until when it may), and d:<instance> =
--          "<demand> <until>" for each instance's demand
-- ARGV     instance, demand (the units per window it sees asked),
--          demand_ttl (ms), renew_ahead (ms: the grant is renewed when its
--          lease ends within it), renew_ttl (ms: how long a renewer has),
--          then, from a renewer: its turn, and the ledger's answer (grant,
--          lease: the ms left of it), or a grant of -1 to give its turn up
--
-- An instance records its demand and reads the grant; the first instance
-- to see the lease end within renew_ahead (or no grant at all) while no
-- other renews becomes the renewer, with a turn greater than any before
-- (at least Redis TIME in ms), and writes the ledger's answer back with
-- its turn while the turn lasts, which ends it; a renewer whose call
-- failed gives its turn up, so that the next sync renews.
--
-- Reply: five whole numbers as strings: the grant (0: none), the ms left
-- of its lease (0: none), the region's demand (the sum of the instances'
-- live ones), 1 when this instance is to renew, else 0, and the turn (0
-- unless it is to renew).
local key, instance = KEYS[1], ARGV[1]
local demand, demand_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local renew_ahead, renew_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local set_turn, set_grant, set_lease = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if not (demand and demand_ttl and renew_ahead and renew_ttl) or demand_ttl <= 0 or renew_ttl <= 0 then
  error('region_sync: bad arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local fields = redis.call('HGETALL', key)
local rec, total = {}, demand
for i = 1, #fields, 2 do
  local name, v = fields[i], fields[i + 1]
  if string.sub(name, 1, 2) == 'd:' then
    local d, untl = string.match(v, '^(%S+) (%d+)$')
    if not (tonumber(d) and tonumber(untl)) or tonumber(untl) <= now then
      redis.call('HDEL', key, name)
    elseif name ~= 'd:' .. instance then
      total = total + tonumber(d)
    end
  else
    rec[name] = v
  end
end
redis.call('HSET', key, 'd:' .. instance, ARGV[2] .. ' ' .. string.format('%d', now + demand_ttl))

local grant, lease_end = tonumber(rec.grant) or 0, tonumber(rec.lease_end) or 0
local turn = tonumber(rec.turn) or 0
local renewing = rec.renewer and (tonumber(rec.renew_until) or 0) > now
local ended = false -- this call ended its turn: the next sync renews, if anyone
if set_turn and renewing and rec.renewer == instance and set_turn == turn then
  ended = true
  if set_grant and set_grant >= 0 and set_lease then
    grant, lease_end = set_grant, now + set_lease
    redis.call('HSET', key, 'grant', string.format('%d', grant), 'lease_end', string.format('%d', lease_end))
  end
  redis.call('HDEL', key, 'renewer', 'renew_until')
  renewing = false
end
if lease_end <= now then
  grant, lease_end = 0, now
end

local renew = 0
if not renewing and not ended and lease_end - now <= renew_ahead then
  renew, turn = 1, math.max(now, turn + 1)
  redis.call('HSET', key, 'renewer', instance, 'turn', string.format('%d', turn), 'renew_until', string.format('%d', now + renew_ttl))
else
  turn = 0
end
redis.call('PEXPIRE', key, math.max(lease_end - now, renew_ttl, demand_ttl) + demand_ttl)
return { string.format('%d', grant), string.format('%d', lease_end - now), string.format('%.0f', total), tostring(renew),
  string.format('%d', turn) }
