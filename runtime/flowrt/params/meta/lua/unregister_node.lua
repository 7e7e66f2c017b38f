-- ARGV: node. Drops its registration at once; returns the full layouts it touched.
local key = P .. 'node:' .. ARGV[1]
local old = redis.call('HGETALL', key)
local affected = {}
for i = 1, #old, 2 do
  redis.call('HDEL', P .. 'members:' .. old[i + 1], ARGV[1] .. SEP .. old[i])
  redis.call('INCR', P .. 'ver:' .. old[i + 1])
  affected[#affected + 1] = old[i + 1]
end
redis.call('DEL', key)
return affected
