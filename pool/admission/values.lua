-- Shared values in Redis (_redis_values.py): put, get, scan, delete, update, with expiry.
-- KEYS: values:<ns> HASH, vexp:<ns> ZSET.  ARGV: op, key or prefix, op arguments.
local VALUES, EXPIRY = KEYS[1], KEYS[2]
local op, key = ARGV[1], ARGV[2]
-- Every write is announced on <prefix>changed, the key as message (_watch.py): KEYS[1]
-- is <prefix>values:<ns>, with ns the key's text up to its first ':'.
local ns = string.match(key, '^[^:]*:') or ''
local CHANGED = string.sub(VALUES, 1, #VALUES - #ns - #'values:') .. 'changed'
if redis.replicate_commands then redis.replicate_commands() end  -- TIME, then writes
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function purge(limit)
  local due = limit and redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', now, 'LIMIT', 0, limit)
              or redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', now)
  for i = 1, #due, 512 do
    local part = {unpack(due, i, math.min(i + 511, #due))}
    redis.call('HDEL', VALUES, unpack(part))
    redis.call('ZREM', EXPIRY, unpack(part))
  end
end

local function live(k)
  local deadline = redis.call('ZSCORE', EXPIRY, k)
  if not deadline or tonumber(deadline) <= now then return false end
  return redis.call('HGET', VALUES, k)
end

local function put(k, v, ttl_ms)
  purge(tonumber(ARGV[#ARGV]))
  redis.call('HSET', VALUES, k, v)
  redis.call('ZADD', EXPIRY, now + ttl_ms, k)
  redis.call('PUBLISH', CHANGED, k)
end

if op == 'put' then
  put(key, ARGV[3], tonumber(ARGV[4]))
  return {'OK'}
elseif op == 'get' then
  return {'OK', live(key)}
elseif op == 'del' then
  redis.call('HDEL', VALUES, key)
  redis.call('ZREM', EXPIRY, key)
  redis.call('PUBLISH', CHANGED, key)
  return {'OK'}
elseif op == 'cas' then
  -- write ARGV[5] only if the live value is still ARGV[4] (ARGV[3] == '1'), or absent
  -- (ARGV[3] == '0'); else answer the live value
  local current = live(key)
  local expected = false
  if ARGV[3] == '1' then expected = ARGV[4] end
  if current ~= expected then return {'CONFLICT', current} end
  put(key, ARGV[5], tonumber(ARGV[6]))
  return {'OK'}
elseif op == 'scan' then
  purge(nil)
  local found = {}
  local flat = redis.call('HGETALL', VALUES)
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, #key) == key then
      found[#found + 1] = flat[i]
      found[#found + 1] = flat[i + 1]
    end
  end
  return {'OK', found}
end
return {'ERROR', 'spacepool: unknown values op ' .. tostring(op)}
