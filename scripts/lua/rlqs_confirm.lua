-- rlqs_confirm: a member of the RLQS registry (see rlqs_shares.lua) has
-- been sent a smaller share than its entry keeps: the entry's T becomes
-- that share, so that what it gave up goes to the others at their next call
-- rather than at its own.
--
-- KEYS[1]  the registry
-- ARGV     member, T sent
--
-- Reply: one whole number as a string: 1 when the entry was lowered, 0 when
-- there is none (its lease ended) or it holds no more than that already.
local key, member, sent = KEYS[1], ARGV[1], tonumber(ARGV[2])
if not sent then
  error('rlqs_confirm: bad arguments')
end
local entry = redis.call('HGET', key, member)
if not entry then
  return { '0' }
end
local demand, tokens, size, lease_end = string.match(entry, '^(%S+) (%d+) (%d+) (%d+)$')
if not (demand and tonumber(tokens) and size and lease_end) then
  error('rlqs_confirm: bad entry for ' .. member .. ' in ' .. key)
end
if tonumber(tokens) <= sent then
  return { '0' }
end
redis.call('HSET', key, member, string.format('%s %d %s %s', demand, sent, size, lease_end))
return { '1' }
