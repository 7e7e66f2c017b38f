-- ARGV: full id, version the caller computed from, combinations JSON, deployment ttl (ms).
-- Writes only if no registration changed the full layout since (else 0: recompute).
local version = redis.call('GET', P .. 'ver:' .. ARGV[1]) or '0'
if version ~= ARGV[2] then
  return 0
end
redis.call('SET', P .. 'combos:' .. ARGV[1], ARGV[3], 'PX', tonumber(ARGV[4]))
return 1
