-- flowkv: helpers every script of the Redis metadata store starts with (the loader prepends
-- this file). KEYS[1] is the deployment's prefix "flowkv:{DEPLOYMENT}:" (the hash tag keeps a
-- deployment's keys in one cluster slot); key names are built from it.
local P = KEYS[1]
local SEP = '|'

local function fail(message)
  return redis.error_reply('FLOWKV ' .. message)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function split(member)
  local at = string.find(member, SEP, 1, true)
  return string.sub(member, 1, at - 1), string.sub(member, at + 1)
end

-- a provider member "node|part" is live while the node's key (renewed by heartbeats) maps the part
local live_cache = {}
local function live(member)
  local value = live_cache[member]
  if value == nil then
    local node, part = split(member)
    value = redis.call('HEXISTS', P .. 'node:' .. node, part) == 1
    live_cache[member] = value
  end
  return value
end

-- a page's provider field holds '1' (no location) or '@' .. slot; the slot (a string), or false
local function slot_of(value)
  if value and string.sub(value, 1, 1) == '@' then
    return string.sub(value, 2)
  end
  return false
end

-- layout id -> {node = field value (truthy)} of the live providers of a page; and how many
-- members it has
local function avail(full, page, exclude)
  local fields = redis.call('HGETALL', P .. 'page:' .. full .. ':' .. page)
  local found = {}
  for i = 1, #fields, 2 do
    local member = fields[i]
    if member ~= exclude and live(member) then
      local node, lid = split(member)
      local nodes = found[lid]
      if nodes == nil then
        nodes = {}
        found[lid] = nodes
      end
      nodes[node] = fields[i + 1]
    end
  end
  return found, #fields / 2
end

local function first_complete(found, combos)
  for index, combo in ipairs(combos) do
    local ok = true
    for _, lid in ipairs(combo) do
      if found[lid] == nil then
        ok = false
        break
      end
    end
    if ok then
      return index
    end
  end
  return nil
end

local function combos_of(full)
  local text = redis.call('GET', P .. 'combos:' .. full)
  if not text then
    return {}
  end
  return cjson.decode(text)['combos']
end

local function touch(key, ttl)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
