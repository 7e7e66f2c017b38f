-- ARGV: session, holder.
redis.call('ZREM', P .. 'run:' .. ARGV[1], ARGV[2])
return 1
