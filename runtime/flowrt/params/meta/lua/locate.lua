-- ARGV: node, part id, then pages. Where the node keeps each page: its slot (a string), or nil
-- where it published none, does not provide the page, or is not live (lapsed, unregistered).
local node, part = ARGV[1], ARGV[2]
local count = #ARGV - 2
local full = redis.call('HGET', P .. 'node:' .. node, part)
local out = {}
if not full then
  if redis.call('HEXISTS', P .. 'lfull', part) == 0 then
    return fail('layout ' .. part .. ' was never registered by a node: nothing provides it')
  end
  for i = 1, count do
    out[i] = false
  end
  return out
end
local member = node .. SEP .. part
for i = 1, count do
  out[i] = slot_of(redis.call('HGET', P .. 'page:' .. full .. ':' .. ARGV[i + 2], member))
end
return out
