-- decide: one request's hits, decided atomically with Redis TIME as the clock.
--
-- KEYS[i]   base key of hit i (it carries the hash tag)
-- ARGV[1]   '1' to charge admitted hits, '0' to only check
-- ARGV[2..] five values per hit i, at 2 + 5 * (i - 1):
--           algorithm (1 log, 2 counter, 3 fixed), limit, window in
--           microseconds, cost, shadow ('1' or '0')
--
-- All or nothing: when any enforced (non-shadow) hit does not fit, nothing is
-- charged. A shadow hit that does not fit neither denies the request nor is
-- charged, as if it were enforced.
--
-- Reply: five integers per hit: admitted (1/0), charged (1/0), remaining,
-- microseconds until reset (see each algorithm's result), and a refund
-- token: what refund.lua needs to undo the charge (the log's score, the
-- counters' window index).
local algorithms = { sliding_window_log, sliding_window_counter, fixed_window }

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local charge = ARGV[1] == '1'
local hits = {}
for i, key in ipairs(KEYS) do
  local a = 2 + 5 * (i - 1)
  local hit = {
    key = key,
    alg = algorithms[tonumber(ARGV[a])],
    limit = tonumber(ARGV[a + 1]),
    window = tonumber(ARGV[a + 2]),
    cost = tonumber(ARGV[a + 3]),
    shadow = ARGV[a + 4] == '1',
  }
  hit.st = hit.alg.check(key, hit.limit, hit.window, hit.cost, now)
  if not hit.st.admit and not hit.shadow then
    charge = false
  end
  hits[i] = hit
end

local reply = {}
for _, hit in ipairs(hits) do
  local charged = charge and hit.st.admit and hit.cost > 0
  if charged then
    hit.alg.commit(hit.key, hit.st, hit.limit, hit.window, hit.cost, now)
  end
  local remaining, reset = hit.alg.result(hit.key, hit.st, hit.limit, hit.window, hit.cost, now)
  reply[#reply + 1] = hit.st.admit and 1 or 0
  reply[#reply + 1] = charged and 1 or 0
  reply[#reply + 1] = math.floor(remaining)
  reply[#reply + 1] = math.floor(reset)
  reply[#reply + 1] = charged and hit.st.token or 0
end
return reply
