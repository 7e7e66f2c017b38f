-- ARGV: reader, provider, full id, then pages.
local member, full = ARGV[1] .. SEP .. ARGV[2], ARGV[3]
for i = 4, #ARGV do
  redis.call('ZREM', P .. 'rlock:' .. full .. ':' .. ARGV[i], member)
end
return 1
