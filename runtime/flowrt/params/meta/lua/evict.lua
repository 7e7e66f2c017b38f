-- ARGV: node, part id, drop (0/1), then pages. All three guards and the deletion in one
-- script, page by page (no window between check and delete); the node's slot of the page goes
-- with its provider field. Returns one reason per page.
local node, part, drop = ARGV[1], ARGV[2], ARGV[3] == '1'
local full = redis.call('HGET', P .. 'lfull', part)
if not full then
  return fail('layout ' .. part .. ' was never registered by a node: nothing provides it')
end
local member = node .. SEP .. part
local now = now_ms()
local combos = combos_of(full)
local out = {}
for i = 4, #ARGV do
  local page = ARGV[i]
  local key = P .. 'page:' .. full .. ':' .. page
  local sessions_key = P .. 'psess:' .. full .. ':' .. page
  local reason = nil
  if redis.call('HEXISTS', key, member) == 0 then
    reason = 'not_provider'
  end
  if reason == nil then -- (1) replica locks: another node reads this page from this node
    for _, lock in ipairs(redis.call('ZRANGEBYSCORE', P .. 'rlock:' .. full .. ':' .. page, '(' .. now, '+inf')) do
      local reader, provider = split(lock)
      if provider == node and reader ~= node then
        reason = 'replica_lock'
        break
      end
    end
  end
  local sessions = {}
  if reason == nil then -- (2) run locks of the sessions using the page
    sessions = redis.call('SMEMBERS', sessions_key)
    for _, sid in ipairs(sessions) do
      if redis.call('ZCOUNT', P .. 'run:' .. sid, '(' .. now, '+inf') > 0 then
        reason = 'run_lock'
        break
      end
    end
  end
  if reason == nil and not drop then -- (3) integrity: the last complete copy a live session references
    if first_complete(avail(full, page, nil), combos) ~= nil and first_complete(avail(full, page, member), combos) == nil then
      for _, sid in ipairs(sessions) do
        if redis.call('EXISTS', P .. 'chain:' .. full .. ':' .. sid) == 1 then
          reason = 'last_replica'
          break
        end
      end
    end
  end
  if reason == nil then
    redis.call('HDEL', key, member)
    if redis.call('EXISTS', key) == 0 then
      redis.call('DEL', sessions_key)
    end
    reason = 'evicted'
  end
  out[#out + 1] = reason
end
return out
