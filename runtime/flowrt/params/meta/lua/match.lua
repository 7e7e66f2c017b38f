-- ARGV: full id, session, then the query's page hashes. One round trip for the whole match:
-- the longest prefix equal to the session's chain whose every page has a complete candidate
-- combination of live providers; an expired page cuts the chain there. Providers are chosen
-- as flowrt.params.meta.combos.assign does (this mirrors it); each provider's slots come from
-- the same page fields the providers do.
-- Returns {length, chain length, segments, then per segment: start, stop, k, (lid, node) x k,
-- then per provider its slots of pages start..stop-1 in one string, comma-separated, empty
-- where unknown ("3,,5"): one reply element, not one per page}.
local full, sid = ARGV[1], ARGV[2]
local count = #ARGV - 2
local chain_key = P .. 'chain:' .. full .. ':' .. sid
local chain = {}
if count > 0 then
  chain = redis.call('LRANGE', chain_key, 0, count - 1)
end
local combos = combos_of(full)
local found = {}
local length = 0
for i = 1, count do
  local page = ARGV[i + 2]
  if chain[i] ~= page then
    break
  end
  local providers, members = avail(full, page, nil)
  if members == 0 then -- expired (or evicted for good): cut the tail
    if i == 1 then
      redis.call('DEL', chain_key)
    else
      redis.call('LTRIM', chain_key, 0, i - 2)
    end
    break
  end
  if first_complete(providers, combos) == nil then
    break
  end
  found[i] = providers
  length = i
end
-- runs[i][lid|node]: consecutive pages from i that node provides in lid
local runs = {}
runs[length + 1] = {}
for i = length, 1, -1 do
  local here, after = {}, runs[i + 1]
  for lid, nodes in pairs(found[i]) do
    for node, _ in pairs(nodes) do
      local key = lid .. SEP .. node
      here[key] = 1 + (after[key] or 0)
    end
  end
  runs[i] = here
end
local out = {length, redis.call('LLEN', chain_key), 0}
local current = nil
local segments = {}
for i = 1, length do
  local keep = current ~= nil
  if keep then
    for _, chosen in ipairs(current) do
      local nodes = found[i][chosen[1]]
      if nodes == nil or not nodes[chosen[2]] then
        keep = false
        break
      end
    end
  end
  if keep then
    segments[#segments][2] = i
  else
    current = {}
    for _, lid in ipairs(combos[first_complete(found[i], combos)]) do
      local best, best_run = nil, -1
      for node, _ in pairs(found[i][lid]) do
        local run = runs[i][lid .. SEP .. node]
        if run > best_run or (run == best_run and node < best) then
          best, best_run = node, run
        end
      end
      current[#current + 1] = {lid, best}
    end
    segments[#segments + 1] = {i - 1, i, current}
  end
end
out[3] = #segments
for _, segment in ipairs(segments) do
  out[#out + 1] = segment[1]
  out[#out + 1] = segment[2]
  out[#out + 1] = #segment[3]
  for _, chosen in ipairs(segment[3]) do
    out[#out + 1] = chosen[1]
    out[#out + 1] = chosen[2]
  end
  for _, chosen in ipairs(segment[3]) do
    local slots = {}
    for i = segment[1] + 1, segment[2] do
      slots[#slots + 1] = slot_of(found[i][chosen[1]][chosen[2]]) or ''
    end
    out[#out + 1] = table.concat(slots, ',')
  end
end
return out
