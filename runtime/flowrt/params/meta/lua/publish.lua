-- ARGV: node, part id, session, ttl (ms), start (-1: append), located (0/1), then page hashes
-- in order, then (located = 1) one slot per page. The node becomes a provider of each page, its
-- field holding '@' .. slot (or '1': no location; a republish replaces it); the pages go to
-- the session's chain at start.. (a position holding another hash cuts the chain there). TTLs
-- are extended, never shortened. Returns the chain's length.
local node, part, sid, ttl, start = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local located = ARGV[6] == '1'
local FIRST = 7 -- ARGV index of the first page
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
local count = #ARGV - FIRST + 1
if located then
  count = math.floor(count / 2)
end
local existing = {}
if count > 0 then
  existing = redis.call('LRANGE', chain, start, start + count - 1)
end
local appending = false
for j = 1, count do
  local page = ARGV[FIRST + j - 1]
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
  local value = '1'
  if located then
    value = '@' .. ARGV[FIRST + count + j - 1]
  end
  redis.call('HSET', key, node .. SEP .. part, value)
  touch(key, ttl)
  key = P .. 'psess:' .. full .. ':' .. page
  redis.call('SADD', key, sid)
  touch(key, ttl)
end
touch(chain, ttl)
return redis.call('LLEN', chain)
