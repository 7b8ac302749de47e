-- Admission in Redis: the all-or-nothing FIFO lease rule (_rule.py) as one atomic script,
-- loaded by _lua.py for the Redis store (_redis.py).
-- KEYS: meta, limits, held, queue, waiters, wexp, leases, lexp, lanes (see _redis.py)
-- ARGV: channel prefix, then one or more operations, each as a count n and n items:
--       op, owner, epoch, op arguments...  Returns the JSON list of their results.
local META, LIMITS, HELD, QUEUE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local WAITERS, WEXP, LEASES, LEXP = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local LANES = KEYS[9]                  -- the waiters by lane and class (issue 18)
local GONE = KEYS[#KEYS]              -- tombstones (issue 22): always the last key
local BATCH, chan = ARGV, ARGV[1]
-- Rebound to each operation in turn (see the end): ARGV = {op, owner, epoch, chan, ...}.
local ARGV, op, owner, epoch = {}, '', '', ''
local UNLIMITED = 1073741824          -- _rule.UNLIMITED
local CONSUMER = 'consumer:'          -- _rule.CONSUMER_PREFIX
local GLOBAL = 'backend:global'       -- _rule.GLOBAL_RESOURCE
local CHUNK = 16                      -- lane entries read per ZRANGEBYLEX in grant_pass
local SEP = '\1'                      -- separates the parts of a LANES member
local BATCH_SCORE = 1099511627776     -- 2^40: QUEUE score offset of the batch class

local head = redis.call('HMGET', META, 'epoch', 'next_expiry')
local store_epoch = head[1]
-- A lower bound of every lease/waiter deadline: reclaim() is a no-op before it.
local next_expiry = tonumber(head[2]) or math.huge
if redis.replicate_commands then redis.replicate_commands() end  -- TIME, then writes
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function is_private(r) return string.sub(r, 1, #CONSUMER) == CONSUMER end

local function as_table(flat)
  local out = {}
  for i = 1, #flat, 2 do out[flat[i]] = tonumber(flat[i + 1]) end
  return out
end

local limits_cache = nil
-- _rule.limit_lookup: the resource's own entry, else its prefix's ("consumer:").
local function limit_of(r)
  if limits_cache == nil then limits_cache = as_table(redis.call('HGETALL', LIMITS)) end
  local found = limits_cache[r]
  if found == nil then
    local i = string.find(r, ':', 1, true)
    if i then found = limits_cache[string.sub(r, 1, i)] end
  end
  return found or UNLIMITED
end

local function held_of(r) return tonumber(redis.call('HGET', HELD, r) or '0') end

-- == Tombstones (issue 22: a late command cannot act) ==================================
-- An id that left the store stays refused for at least one lease TTL: a late enqueue
-- or restore of it (sent before its withdraw, delivered after) is a no-op.
local TOMB_DEFAULT_MS = 60000         -- before any client registered its TTL
local function bury(id)
  local keep = tonumber(redis.call('HGET', META, 'tomb_ms') or TOMB_DEFAULT_MS)
  redis.call('ZADD', GONE, now + keep, id)
end
local function is_gone(id)
  redis.call('ZREMRANGEBYSCORE', GONE, '-inf', now)
  return redis.call('ZSCORE', GONE, id) ~= false
end
local function note_ttl(ttl)          -- tombstones outlive the longest TTL in use
  if ttl > tonumber(redis.call('HGET', META, 'tomb_ms') or '0') then
    redis.call('HSET', META, 'tomb_ms', ttl)
  end
end
-- == end of tombstones ==================================================================

local function drop_lease(id)
  redis.call('ZREM', LEXP, id)
  bury(id)                                     -- tombstone (issue 22), found or not
  local rec = redis.call('HGET', LEASES, id)
  if not rec then return false end
  for _, r in ipairs(cjson.decode(rec).r) do
    if redis.call('HINCRBY', HELD, r, -1) <= 0 then redis.call('HDEL', HELD, r) end
  end
  redis.call('HDEL', LEASES, id)
  return true
end

local function drop_waiter(id, granted)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', WEXP, id)
  local rec = redis.call('HGET', WAITERS, id)
  if rec then redis.call('ZREM', LANES, cjson.decode(rec).m) end  -- its lane (issue 18)
  local found = redis.call('HDEL', WAITERS, id) == 1
  if not granted then bury(id) end             -- tombstone (issue 22); a grant lives on
  return found
end

-- Every new deadline goes through here (renewals only move deadlines later).
local function expire_at(zset, id, deadline)
  redis.call('ZADD', zset, deadline, id)
  if deadline < next_expiry then
    next_expiry = deadline
    redis.call('HSET', META, 'next_expiry', deadline)
  end
end

local function make_lease(id, rec, w)
  for _, r in ipairs(w.r) do redis.call('HINCRBY', HELD, r, 1) end
  redis.call('HSET', LEASES, id, rec)
  expire_at(LEXP, id, now + w.t)
end

-- _rule.lane_of: the shared resources, sorted, comma-joined.
local function lane_of(resources)
  local shared = {}
  for _, r in ipairs(resources) do if not is_private(r) then shared[#shared + 1] = r end end
  table.sort(shared)
  return table.concat(shared, ',')
end

-- w: {o, t, r, p (class rank, default 0), a (ages_at ms)}; its lane key is added here.
local function add_waiter(id, w)
  local seq = redis.call('HINCRBY', META, 'seq', 1)
  w.p, w.a = w.p or 0, w.a or 0
  w.m = lane_of(w.r) .. SEP .. w.p .. SEP .. string.format('%015d', seq) .. SEP .. id
  redis.call('ZADD', QUEUE, w.p * BATCH_SCORE + seq, id)
  redis.call('ZADD', LANES, 0, w.m)
  redis.call('HSET', WAITERS, id, cjson.encode(w))
  expire_at(WEXP, id, now + w.t)
end

local function reclaim()
  if now < next_expiry then return end
  local due = string.format('(%d', now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', LEXP, '-inf', due, 'LIMIT', 0, 512)) do
    drop_lease(id)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WEXP, '-inf', due, 'LIMIT', 0, 512)) do
    drop_waiter(id)
  end
  local first_lease = redis.call('ZRANGE', LEXP, 0, 0, 'WITHSCORES')[2]
  local first_waiter = redis.call('ZRANGE', WEXP, 0, 0, 'WITHSCORES')[2]
  next_expiry = math.min(tonumber(first_lease) or math.huge, tonumber(first_waiter) or math.huge)
  if next_expiry == math.huge then
    redis.call('HDEL', META, 'next_expiry')
  else
    redis.call('HSET', META, 'next_expiry', next_expiry)
  end
end

local function quarantined()
  local until_ms = redis.call('HGET', META, 'quarantine')
  return until_ms and now < tonumber(until_ms)
end

-- ---- The grant rule over lanes (issue 18): a port of _rule.py plan_grants ------------
-- Each lane and class of LANES is read CHUNK members at a time, from its head; the
-- heads are merged in rank order (class rank, with batch aged to interactive at w.a,
-- then arrival). A waiter that fits is granted; one short of a shared resource closes
-- its lane for the pass (everyone behind it is short too); one short only of its
-- consumer slot is skipped. Grants are applied after the merge, so offsets stay valid.
-- A lane with a shared resource full before the pass is not read (_rule.lane_open).
local function lane_cursors(counts)
  local subs, first = {}, redis.call('ZRANGEBYLEX', LANES, '-', '+', 'LIMIT', 0, 1)[1]
  while first do
    local lane = string.sub(first, 1, string.find(first, SEP, 1, true) - 1)
    local open = true
    for r in string.gmatch(lane, '[^,]+') do
      if (counts[r] or 0) >= limit_of(r) then open = false; break end
    end
    for _, rank in ipairs(open and {'0', '1'} or {}) do
      subs[#subs + 1] = {p = lane .. SEP .. rank .. SEP, r = tonumber(rank), buf = {},
                         i = 1, off = 0, done = false}
    end
    first = redis.call('ZRANGEBYLEX', LANES, '(' .. lane .. '\2', '+', 'LIMIT', 0, 1)[1]
  end
  return subs
end

-- The head entry of a cursor {id, rec, w, rank, seq}, or nil when it is exhausted.
local function lane_head(c)
  while not c.cur do
    if c.i > #c.buf then
      if c.done then return nil end
      c.buf = redis.call('ZRANGEBYLEX', LANES, '[' .. c.p, '[' .. c.p .. '\255',
                         'LIMIT', c.off, CHUNK)
      c.i, c.off, c.done = 1, c.off + #c.buf, #c.buf < CHUNK
      if #c.buf == 0 then return nil end
    end
    local m = c.buf[c.i]
    local id = string.sub(m, #c.p + 17)
    local rec = redis.call('HGET', WAITERS, id)
    if rec then
      local w = cjson.decode(rec)
      local rank = c.r
      if rank > 0 and w.a <= now then rank = 0 end
      c.cur = {id = id, rec = rec, w = w, rank = rank,
               seq = tonumber(string.sub(m, #c.p + 1, #c.p + 15))}
    else
      redis.call('ZREM', LANES, m)                                -- a stale member
      c.i, c.off = c.i + 1, c.off - 1
    end
  end
  return c.cur
end

local function grant_pass()
  if quarantined() then return {} end
  local counts = as_table(redis.call('HGETALL', HELD))
  local subs, grants = lane_cursors(counts), {}
  while true do
    local best, at = nil, nil
    for k, c in ipairs(subs) do
      local e = (not c.closed) and lane_head(c)
      if not e then
        c.closed = true
      elseif not best or e.rank < best.rank or (e.rank == best.rank and e.seq < best.seq) then
        best, at = e, k
      end
    end
    if not best then break end
    local c = subs[at]
    c.cur, c.i = nil, c.i + 1
    local shut, fits = false, true
    for _, r in ipairs(best.w.r) do
      if (counts[r] or 0) >= limit_of(r) then
        fits = false
        if not is_private(r) then shut = true end
      end
    end
    if shut then
      c.closed = true                                      -- (1) blocked: so is its lane
    elseif fits then                                       -- (2) grant, all or nothing
      for _, r in ipairs(best.w.r) do counts[r] = (counts[r] or 0) + 1 end
      grants[#grants + 1] = best
    end                                                    -- else: its consumer is full
  end
  local mine, others = {}, {}
  for _, g in ipairs(grants) do
    drop_waiter(g.id, true)
    make_lease(g.id, g.rec, g.w)
    if g.w.o == owner then
      mine[#mine + 1] = g.id
    else
      others[g.w.o] = others[g.w.o] or {}
      table.insert(others[g.w.o], g.id)
    end
  end
  for o, list in pairs(others) do redis.call('PUBLISH', chan .. o, table.concat(list, ',')) end
  return mine
end
-- ---- end of the grant rule -------------------------------------------------------------

-- Limits and mean hold time go back only with positions (for the wait estimate).
local function reply(status, mine, positions, extra)
  if #positions == 0 and op ~= 'set_limits' then return {status, mine, {}, {}, '', extra or 0} end
  return {status, mine, positions, redis.call('HGETALL', LIMITS),
          redis.call('HGET', META, 'mean') or '', extra or 0}
end

-- Each op returns a table; the script returns it as one JSON string (cheap to parse).
local function dispatch()
if op == 'enqueue' then
  -- ARGV 8, 9: class rank (0 interactive, 1 batch), ms after which batch ranks as 0
  local id, ttl = ARGV[5], tonumber(ARGV[7])
  local w = {o = owner, t = ttl, r = cjson.decode(ARGV[6]),
             p = tonumber(ARGV[8] or '0'), a = now + tonumber(ARGV[9] or '0')}
  local rec = cjson.encode(w)
  reclaim()
  note_ttl(ttl)
  if is_gone(id) then return reply('GONE', {}, {}) end  -- a late enqueue (issue 22)
  if redis.call('ZCARD', QUEUE) == 0 and not quarantined() then
    -- Nobody queued: the rule reduces to "every resource has a free slot".
    local fits = true
    for _, r in ipairs(w.r) do
      if held_of(r) >= limit_of(r) then fits = false; break end
    end
    if fits then
      make_lease(id, rec, w)
      return reply('OK', {id}, {})
    end
  end
  add_waiter(id, w)
  local mine = grant_pass()
  local rank = redis.call('ZRANK', QUEUE, id)
  if rank then return reply('OK', mine, {id, rank + 1}) end
  return reply('OK', mine, {})

elseif op == 'release' then
  reclaim()
  local found = drop_lease(ARGV[5])
  if found then
    local mean = tonumber(redis.call('HGET', META, 'mean') or '1')
    redis.call('HSET', META, 'mean', tostring(0.8 * mean + 0.2 * tonumber(ARGV[6])))
  end
  return reply('OK', grant_pass(), {}, found and 1 or 0)

elseif op == 'withdraw' then
  local id, keep = ARGV[5], ARGV[6] == '1'
  reclaim()
  local status, position = 'GONE', 0
  local rank = redis.call('ZRANK', QUEUE, id)
  if redis.call('HEXISTS', WAITERS, id) == 1 then
    status = 'WAITING'
    if rank then position = rank + 1 end
    drop_waiter(id)
  elseif redis.call('HEXISTS', LEASES, id) == 1 then
    status = 'GRANTED'
    if keep then return reply(status, {}, {}) end
    drop_lease(id)
  else
    bury(id)                                   -- its enqueue may still arrive (issue 22)
  end
  return reply(status, grant_pass(), {}, position)

elseif op == 'poll' then
  reclaim()
  local mine = grant_pass()
  local positions = {}
  for i = 5, #ARGV do
    local rank = redis.call('ZRANK', QUEUE, ARGV[i])
    if rank then
      positions[#positions + 1] = ARGV[i]
      positions[#positions + 1] = rank + 1
    elseif redis.call('HEXISTS', LEASES, ARGV[i]) == 1 then
      mine[#mine + 1] = ARGV[i]                 -- granted earlier; the message was missed
    end
  end
  return reply('OK', mine, positions)

elseif op == 'renew' then
  local ttl = tonumber(ARGV[5])
  local missing = {}
  for i = 6, #ARGV do
    local id = ARGV[i]
    if redis.call('ZSCORE', LEXP, id) then
      redis.call('ZADD', LEXP, now + ttl, id)
    elseif redis.call('ZSCORE', WEXP, id) then
      redis.call('ZADD', WEXP, now + ttl, id)
    else
      missing[#missing + 1] = id
    end
  end
  return {'OK', missing}

elseif op == 'drop' then
  reclaim()
  for i = 5, #ARGV do
    if not drop_waiter(ARGV[i]) then drop_lease(ARGV[i]) end
  end
  return reply('OK', grant_pass(), {})

elseif op == 'set_limits' then
  for i = 5, #ARGV, 2 do redis.call('HSET', LIMITS, ARGV[i], ARGV[i + 1]) end
  limits_cache = nil
  reclaim()
  return reply('OK', grant_pass(), {})

elseif op == 'snapshot' then
  reclaim()
  local mine = grant_pass()
  local queued, waiting, batch = {}, 0, 0
  for _, rec in ipairs(redis.call('HVALS', WAITERS)) do
    waiting = waiting + 1
    local w = cjson.decode(rec)
    batch = batch + (w.p or 0)                               -- the batch class (issue 18)
    for _, r in ipairs(w.r) do queued[r] = (queued[r] or 0) + 1 end
  end
  local flat = {}
  for r, n in pairs(queued) do flat[#flat + 1] = r; flat[#flat + 1] = n end
  return {'OK', mine, redis.call('HGETALL', HELD), flat, redis.call('HGETALL', LIMITS), waiting,
          batch}

elseif op == 'secret' then
  redis.call('HSETNX', META, 'secret', ARGV[5])
  return {'OK', redis.call('HGET', META, 'secret')}

elseif op == 'restore' then
  -- ARGV 5 epoch seen before ('' if none, '?' if unknown), 6 new epoch candidate,
  -- 7 ttl_ms, 8 secret,
  -- then counted lists: limits (name, n), leases (id, resources), waiters (id, resources).
  local prev, ttl, secret = ARGV[5], tonumber(ARGV[7]), ARGV[8]
  note_ttl(ttl)
  local current = redis.call('HGET', META, 'epoch')
  if not current then
    current = ARGV[6]
    redis.call('HSET', META, 'epoch', current, 'born', now)
  end
  local function quarantine_until(until_ms)
    if until_ms > tonumber(redis.call('HGET', META, 'quarantine') or '0') then
      redis.call('HSET', META, 'quarantine', until_ms)
    end
  end
  if prev ~= '' and prev ~= current then
    -- The store lost its state while we held entries in it: grant nothing new until
    -- every live process has had a lease TTL to re-register its leases.
    quarantine_until(tonumber(redis.call('HGET', META, 'born')) + ttl)
  end
  -- A server younger than one TTL may have replaced one whose holders still run
  -- (uptime_in_seconds rounds down: the start is taken late, the quarantine long).
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
  if up and up * 1000 < ttl then quarantine_until(now - up * 1000 + ttl) end
  if secret ~= '' then redis.call('HSETNX', META, 'secret', secret) end
  reclaim()
  local i = 9
  local n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do redis.call('HSETNX', LIMITS, ARGV[i], ARGV[i + 1]); i = i + 2 end
  limits_cache = nil
  local refused = {}
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    local id, w = ARGV[i], {o = owner, t = ttl, r = cjson.decode(ARGV[i + 1])}
    i = i + 2
    if is_gone(id) then
      refused[#refused + 1] = id               -- it left the store: never back (issue 22)
    elseif redis.call('HEXISTS', LEASES, id) == 0 then
      drop_waiter(id, true)
      -- Taken back only into free slots: a slot given away meanwhile stays given.
      local fits = true
      for _, r in ipairs(w.r) do
        if held_of(r) >= limit_of(r) then fits = false; break end
      end
      if fits then make_lease(id, cjson.encode(w), w) else refused[#refused + 1] = id end
    end
  end
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    local id, w = ARGV[i], {o = owner, t = ttl, r = cjson.decode(ARGV[i + 1])}
    i = i + 2
    if is_gone(id) then
      refused[#refused + 1] = id               -- it left the store: never back (issue 22)
    elseif redis.call('HEXISTS', LEASES, id) == 0 and redis.call('HEXISTS', WAITERS, id) == 0 then
      add_waiter(id, w)
    end
  end
  return {'OK', current, refused}
end
end

-- Each operation runs against the epoch its client knew: another epoch answers EPOCH.
local results, i = {}, 2
while i <= #BATCH do
  local n = tonumber(BATCH[i])
  ARGV = {BATCH[i + 1], BATCH[i + 2], BATCH[i + 3], chan}
  for j = 4, n do ARGV[j + 1] = BATCH[i + j] end
  i = i + n + 1
  op, owner, epoch = ARGV[1], ARGV[2], ARGV[3]
  local result
  if op ~= 'restore' and store_epoch ~= epoch then
    result = {'EPOCH'}
  else
    result = dispatch() or {'ERROR', 'spacepool: unknown op ' .. tostring(op)}
    if op == 'restore' then store_epoch = result[2]; limits_cache = nil end
  end
  results[#results + 1] = result
end
return cjson.encode(results)
