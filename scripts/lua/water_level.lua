-- water_level: the max-min fair share (water-filling) of total among wants,
-- shared by the registries that split a limit (rlqs_shares.lua,
-- region_allowance.lua), whose text it starts.
--
-- water_level(wants, total) sorts wants in place and returns the level L:
-- a want is met in full when at most L, else cut to L (math.huge when every
-- want is met). The smallest wants are met in full while they are under an
-- equal part of what is left; the rest share what is left equally.
local function water_level(wants, total)
  table.sort(wants)
  local left = total
  for i, w in ipairs(wants) do
    local part = left / (#wants - i + 1)
    if w > part then
      return part
    end
    left = left - w
  end
  return math.huge
end
