-- ARGV: node, part id, session, ttl (ms), start (-1: append), then page hashes in order.
-- The node becomes a provider of each page; the pages go to the session's chain at start..
-- (a position holding another hash cuts the chain there). TTLs are extended, never
-- shortened. Returns the chain's length.
local node, part, sid, ttl, start = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local full = redis.call('HGET', P .. 'node:' .. node, part)
if not full then
  return fail('node ' .. node .. ' does not hold layout ' .. part .. ' (or its heartbeat lapsed): register_node first')
end
local chain = P .. 'chain:' .. full .. ':' .. sid
local length = redis.call('LLEN', chain)
if start < 0 then
  start = length
end
if start > length then
  return fail('session ' .. sid .. ' has ' .. length .. ' pages: cannot publish from page ' .. start .. ' (a gap)')
end
local count = #ARGV - 5
local existing = {}
if count > 0 then
  existing = redis.call('LRANGE', chain, start, start + count - 1)
end
local appending = false
for j = 1, count do
  local page = ARGV[j + 5]
  if not appending and existing[j] ~= page then
    if existing[j] ~= nil then
      if start + j - 1 == 0 then
        redis.call('DEL', chain)
      else
        redis.call('LTRIM', chain, 0, start + j - 2)
      end
    end
    appending = true
  end
  if appending then
    redis.call('RPUSH', chain, page)
  end
  local key = P .. 'page:' .. full .. ':' .. page
  redis.call('HSET', key, node .. SEP .. part, '1')
  touch(key, ttl)
  key = P .. 'psess:' .. full .. ':' .. page
  redis.call('SADD', key, sid)
  touch(key, ttl)
end
touch(chain, ttl)
return redis.call('LLEN', chain)
