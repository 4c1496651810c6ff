-- rlqs_lease: the condition of an RLQS fleet's lease (the op record_if_alone),
-- all decide.lua knows of RLQS: a request's record_if_alone hits are recorded
-- past the counter's limit only when the fleet is the counter's only user,
-- read in the same call; otherwise they are decided as any charge.
--
-- record_conditions maps a conditional op's name (OPS[...].conditional) to
-- its condition(keys, rules, states, now, first, last): whether the
-- conditional hits of the request at hits first to last (keys[i], their
-- rules and states as the request's checks left them) are recorded.

-- holds is what hit i's counter holds before the request's charges, by its
-- check (the same reading as Go's answer: its capacity less what remains).
local function holds(keys, rules, states, now, i)
  local rule, st = rules[i], states[i]
  local remaining = st.remaining
  if not st.again then
    remaining = rule.alg.result(keys[i], st, rule.limit, rule.window, rule.need, now)
  end
  local capacity = rule.burst or rule.limit
  return capacity - min(remaining, capacity)
end

-- alone_fleet: the request holds the fleet's own count of the counter (its
-- hit at the counter's key .. FLEET_SUFFIX, not a give back), and the
-- counter holds at most a unit (of rounding) more than it, read now: the
-- fleet is then the counter's only user, and its shares hold it to the
-- limit. When others took from the counter, the lease must fit beside
-- them, as any hit. Without the fleet's count in this call (a limit of the
-- rule on another Cluster slot), nothing says the fleet is alone.
local function alone_fleet(keys, rules, states, now, first, last)
  local measured = false
  for i = first, last do
    if rules[i].conditional == alone_fleet then
      local fleet = keys[i] .. FLEET_SUFFIX
      for j = first, last do
        if keys[j] == fleet and not rules[j].refund then
          if holds(keys, rules, states, now, i) > holds(keys, rules, states, now, j) + 1 then
            return false
          end
          measured = true
        end
      end
    end
  end
  return measured
end

local record_conditions = { record_if_alone = alone_fleet }
