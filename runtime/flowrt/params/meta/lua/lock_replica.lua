-- ARGV: reader, provider, full id, ttl (ms), then pages. Reader reads them from provider.
local member, full, ttl = ARGV[1] .. SEP .. ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = now_ms()
for i = 5, #ARGV do
  local key = P .. 'rlock:' .. full .. ':' .. ARGV[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, now + ttl, member)
  touch(key, ttl)
end
return 1
