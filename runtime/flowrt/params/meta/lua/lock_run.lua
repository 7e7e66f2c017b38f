-- ARGV: session, holder, ttl (ms). Inference by holder runs on the session's pages.
local key, ttl = P .. 'run:' .. ARGV[1], tonumber(ARGV[3])
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
redis.call('ZADD', key, now + ttl, ARGV[2])
touch(key, ttl)
return 1
