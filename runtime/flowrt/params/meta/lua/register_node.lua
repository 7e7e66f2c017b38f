-- ARGV: node, node ttl (ms), deployment ttl (ms), then (part id, full id, part JSON) triples.
-- Replaces the node's registration; bumps the version of every full layout it touches.
-- Returns those full layout ids (their combinations are recomputed by the caller).
local node, ttl, dttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local key = P .. 'node:' .. node
local affected, seen = {}, {}
local function affect(full)
  if not seen[full] then
    seen[full] = true
    affected[#affected + 1] = full
  end
end
for i = 4, #ARGV, 3 do -- check first: a script's writes are not rolled back by an error
  if redis.call('HEXISTS', P .. 'layouts', ARGV[i + 1]) == 0 then
    return fail('full layout ' .. ARGV[i + 1] .. ' is not registered: register_layout it first')
  end
end
local old = redis.call('HGETALL', key)
for i = 1, #old, 2 do
  redis.call('HDEL', P .. 'members:' .. old[i + 1], node .. SEP .. old[i])
  affect(old[i + 1])
end
redis.call('DEL', key)
for i = 4, #ARGV, 3 do
  local part, full, json = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('HSET', key, part, full)
  redis.call('HSET', P .. 'lfull', part, full)
  redis.call('HSET', P .. 'parts:' .. full, part, json)
  redis.call('HSET', P .. 'members:' .. full, node .. SEP .. part, '1')
  affect(full)
end
if redis.call('EXISTS', key) == 1 then
  redis.call('PEXPIRE', key, ttl)
end
for _, name in ipairs({'layouts', 'lfull'}) do
  redis.call('PEXPIRE', P .. name, dttl)
end
for _, full in ipairs(affected) do
  redis.call('INCR', P .. 'ver:' .. full)
  for _, name in ipairs({'parts:', 'members:', 'ver:', 'combos:'}) do
    redis.call('PEXPIRE', P .. name .. full, dttl)
  end
end
return affected
