-- ARGV: layout id, layout JSON, deployment ttl (ms). A full layout of the deployment.
redis.call('HSET', P .. 'layouts', ARGV[1], ARGV[2])
redis.call('PEXPIRE', P .. 'layouts', tonumber(ARGV[3]))
return 1
