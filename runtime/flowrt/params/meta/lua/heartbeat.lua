-- ARGV: node, node ttl (ms), deployment ttl (ms). 0 when the node had lapsed.
local key = P .. 'node:' .. ARGV[1]
if redis.call('PEXPIRE', key, tonumber(ARGV[2])) == 0 then
  return 0
end
local dttl = tonumber(ARGV[3])
redis.call('PEXPIRE', P .. 'layouts', dttl)
redis.call('PEXPIRE', P .. 'lfull', dttl)
for _, full in ipairs(redis.call('HVALS', key)) do
  for _, name in ipairs({'parts:', 'members:', 'ver:', 'combos:'}) do
    redis.call('PEXPIRE', P .. name .. full, dttl)
  end
end
return 1
