-- Admission in Redis: the all-or-nothing FIFO lease rule (_rule.py) as one atomic script,
-- loaded by _lua.py for the Redis store (_redis.py).
-- KEYS: meta, limits, held, queue, waiters, leases, lanes, park, spot, cwait, wake, aging,
--       owners, owned, inbox, qcount, gone (see _redis.py; every key under one prefix)
-- ARGV: channel prefix, then one or more operations, each as a count n and n items:
--       op, owner, epoch, op arguments...  Returns the JSON list of their results, then
--       the work of the run (redis commands + elements they returned).
-- Every operation does bounded work, whatever the number of waiters, Spaces and
-- consumers: sorted sets read at their head (O(log n)), no scan of a whole key.
local META, LIMITS, HELD, QUEUE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local WAITERS, LEASES, LANES = KEYS[5], KEYS[6], KEYS[7]
local PARK, SPOT, CWAIT, WAKE = KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local AGING, OWNERS, OWNED, INBOX, QCOUNT = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local GONE = KEYS[#KEYS]              -- tombstones (issue 22): always the last key
local BATCH, chan = ARGV, ARGV[1]
-- Rebound to each operation in turn (see the end): ARGV = {op, owner, epoch, chan, ...}.
local ARGV, op, owner, epoch = {}, '', '', ''
local UNLIMITED = 1073741824          -- _rule.UNLIMITED
local CONSUMER = 'consumer:'          -- _rule.CONSUMER_PREFIX
local GLOBAL = 'backend:global'       -- _rule.GLOBAL_RESOURCE
local SEP = '\1'                      -- separates the parts of a sorted-set member
local TOP = '\255'                    -- above every character of a member
local BATCH_SCORE = 1099511627776     -- 2^40: QUEUE score offset of the batch class
local PASS_BUDGET = 512               -- candidates a grant pass examines at most
local RETURN_BUDGET = 64              -- waiters a pass takes back from a consumer's wait
local REAP_BUDGET = 128               -- entries of dead owners dropped per operation
local AGE_BUDGET = 64                 -- batch waiters re-ranked (aged) per operation

local work = 0                        -- commands run + elements they returned (item 5)
local function R(...)
  local out = redis.call(...)
  work = work + 1
  if type(out) == 'table' then work = work + #out end
  return out
end

local store_epoch = R('HGET', META, 'epoch')
if redis.replicate_commands then redis.replicate_commands() end  -- TIME, then writes
local clock = R('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function is_private(r) return string.sub(r, 1, #CONSUMER) == CONSUMER end
local function range(p) return '[' .. p .. SEP, '[' .. p .. SEP .. TOP end   -- "p SEP *"
local function first_of(zset, p) return R('ZRANGEBYLEX', zset, '[' .. p .. SEP,
                                          '[' .. p .. SEP .. TOP, 'LIMIT', 0, 1)[1] end
local function seq15(n) return string.format('%015d', n) end

-- _rule.limit_lookup: the resource's own entry, else its prefix's ("consumer:").
local limits_cache = {}
local function limit_of(r)
  local found = limits_cache[r]
  if found == nil then
    found = tonumber(R('HGET', LIMITS, r) or '')
    if found == nil then
      local i = string.find(r, ':', 1, true)
      if i then found = tonumber(R('HGET', LIMITS, string.sub(r, 1, i)) or '') end
    end
    found = found or UNLIMITED
    limits_cache[r] = found
  end
  return found
end

local counts = {}                      -- HELD, read once per resource, kept in step
local function held_of(r)
  local c = counts[r]
  if c == nil then c = tonumber(R('HGET', HELD, r) or '0'); counts[r] = c end
  return c
end
local function is_full(r) return held_of(r) >= limit_of(r) end

-- == Tombstones (issue 22: a late command cannot act) ==================================
-- An id that left the store stays refused for at least one lease TTL: a late enqueue
-- or restore of it (sent before its withdraw, delivered after) is a no-op.
local TOMB_DEFAULT_MS = 60000         -- before any client registered its TTL
local tomb_ms = nil
local function bury(id)
  tomb_ms = tomb_ms or tonumber(R('HGET', META, 'tomb_ms') or TOMB_DEFAULT_MS)
  R('ZADD', GONE, now + tomb_ms, id)
end
local function is_gone(id)
  local until_ms = R('ZSCORE', GONE, id)
  return until_ms ~= false and tonumber(until_ms) > now
end
local function note_ttl(ttl)          -- tombstones outlive the longest TTL in use
  if ttl > tonumber(R('HGET', META, 'tomb_ms') or '0') then
    R('HSET', META, 'tomb_ms', ttl)
    tomb_ms = ttl
  end
end
-- == end of tombstones ==================================================================

-- == Where each sub-lane waits (the ready set) ==========================================
-- A sub-lane is one class of one lane: "lane SEP class". Its waiters are the LANES
-- members "sub SEP seq SEP id", in arrival order. A non-empty sub-lane sits in PARK
-- exactly once, as "where SEP key SEP sub": where = '' (ready: to be looked at by the
-- next pass) or the shared resource that blocks its head (full); key = its head's
-- rank (class, 0 once a batch waiter has aged) and seq, so each where's sub-lanes are
-- in rank order. SPOT sub = "where SEP key" finds it again.
local function ekey(w)                -- the rank of a waiter, as a 16-character key
  local rank = (w.p == 0 or (w.a or 0) <= now) and '0' or '1'
  return rank .. seq15(w.s)
end
local function sub_of(w) return w.l .. SEP .. w.p end
local function split_at(at)           -- "where SEP key" -> where, key
  local i = string.find(at, SEP, 1, true)
  return string.sub(at, 1, i - 1), string.sub(at, i + 1)
end
local function unspot(sub)
  local at = R('HGET', SPOT, sub)
  if at then R('ZREM', PARK, at .. SEP .. sub); R('HDEL', SPOT, sub) end
  return at
end
local function spot(sub, where, key)
  local at = where .. SEP .. key
  R('HSET', SPOT, sub, at)
  R('ZADD', PARK, 0, at .. SEP .. sub)
end
-- The head of a sub-lane: its LANES member, id and record (stale members removed).
local function head_of(sub)
  while true do
    local m = first_of(LANES, sub)
    if not m then return nil end
    local id = string.sub(m, #sub + 18)
    local rec = R('HGET', WAITERS, id)
    if rec then return m, id, rec end
    R('ZREM', LANES, m)
  end
end
-- Put a sub-lane (back) under `where`, keyed by its current head; drop it if empty.
local function respot(sub, where)
  unspot(sub)
  local m, _, rec = head_of(sub)
  if m then spot(sub, where, ekey(cjson.decode(rec))) end
end
-- == end of the ready set ================================================================

local function count_waiter(w, step)
  for _, r in ipairs(w.r) do
    if R('HINCRBY', QCOUNT, r, step) <= 0 then R('HDEL', QCOUNT, r) end
  end
  R('HINCRBY', META, 'waiting', step)
  if w.p ~= 0 then R('HINCRBY', META, 'batch', step) end
end

local function free_slot(r)           -- a slot of r came free: its parked may go on
  counts[r] = R('HINCRBY', HELD, r, -1)
  if counts[r] <= 0 then R('HDEL', HELD, r); counts[r] = 0 end
  R('SADD', WAKE, r)
end

local function drop_lease(id)
  bury(id)                                     -- tombstone (issue 22), found or not
  local rec = R('HGET', LEASES, id)
  if not rec then return false end
  local w = cjson.decode(rec)
  for _, r in ipairs(w.r) do free_slot(r) end
  R('HDEL', LEASES, id)
  R('ZREM', OWNED, w.o .. SEP .. id)
  return true
end

local function drop_waiter(id, granted)
  R('ZREM', QUEUE, id)
  local rec = R('HGET', WAITERS, id)
  if not rec then
    if not granted then bury(id) end
    return false
  end
  local w = cjson.decode(rec)
  if w.p ~= 0 then R('ZREM', AGING, id) end
  if w.c then
    R('ZREM', CWAIT, w.c)                      -- it waited for its consumer
  else
    R('ZREM', LANES, w.m)
    local sub = sub_of(w)
    local at = R('HGET', SPOT, sub)
    if at then
      local where, key = split_at(at)
      if string.sub(key, 2) == seq15(w.s) then respot(sub, where) end  -- it was the head
    end
  end
  count_waiter(w, -1)
  R('HDEL', WAITERS, id)
  if not granted then                          -- a grant lives on as a lease
    bury(id)                                   -- tombstone (issue 22)
    R('ZREM', OWNED, w.o .. SEP .. id)
  end
  return true
end

local function make_lease(id, w)
  for _, r in ipairs(w.r) do
    counts[r] = R('HINCRBY', HELD, r, 1)
  end
  R('HSET', LEASES, id, cjson.encode({o = w.o, r = w.r}))
  R('ZADD', OWNED, 0, w.o .. SEP .. id)
end

-- _rule.lane_of: the shared resources, sorted, comma-joined.
local function lane_of(resources)
  local shared = {}
  for _, r in ipairs(resources) do if not is_private(r) then shared[#shared + 1] = r end end
  table.sort(shared)
  return table.concat(shared, ',')
end

-- w: {o, r, p (class rank, default 0), a (ages_at ms)}; s, l, m are added here.
local function add_waiter(id, w)
  w.s = R('HINCRBY', META, 'seq', 1)
  w.p, w.a = w.p or 0, w.a or 0
  w.l = lane_of(w.r)
  local sub = sub_of(w)
  w.m = sub .. SEP .. seq15(w.s) .. SEP .. id
  R('ZADD', QUEUE, w.p * BATCH_SCORE + w.s, id)
  R('ZADD', LANES, 0, w.m)
  R('HSET', WAITERS, id, cjson.encode(w))
  R('ZADD', OWNED, 0, w.o .. SEP .. id)
  if w.p ~= 0 and w.a > now then R('ZADD', AGING, w.a, id) end
  count_waiter(w, 1)
  -- A later arrival never heads a non-empty sub-lane: only an empty one moves.
  if R('HEXISTS', SPOT, sub) == 0 then spot(sub, '', ekey(w)) end
end

-- == Liveness per owner (item 6) =========================================================
-- A process renews ONE deadline, its own (OWNERS), whatever it holds; its leases and
-- waiters (OWNED: "owner SEP id") live as long as it does. Past the deadline, each
-- operation drops up to REAP_BUDGET of the dead owner's entries.
local function alive(ttl)
  return R('ZADD', OWNERS, now + ttl, owner) == 1   -- true: we were not known
end

local function reclaim()
  local budget = REAP_BUDGET
  while budget > 0 do
    local first = R('ZRANGE', OWNERS, 0, 0, 'WITHSCORES')
    if not first[1] or tonumber(first[2]) >= now then break end
    local dead = first[1]
    local lo, hi = range(dead)
    local members = R('ZRANGEBYLEX', OWNED, lo, hi, 'LIMIT', 0, budget)
    for _, m in ipairs(members) do
      local id = string.sub(m, #dead + 2)
      if not drop_waiter(id) then drop_lease(id) end
      R('ZREM', OWNED, m)
    end
    if #members >= budget then break end      -- more next time
    budget = budget - #members
    R('ZREM', OWNERS, dead)
    R('ZREMRANGEBYLEX', INBOX, lo, hi)
  end
  -- Forget a few tombstones past their time (the rest on later operations).
  local old = R('ZRANGEBYSCORE', GONE, '-inf', now, 'LIMIT', 0, 64)
  if #old > 0 then R('ZREM', GONE, unpack(old)) end
end

local function quarantined()
  local until_ms = R('HGET', META, 'quarantine')
  return until_ms and now < tonumber(until_ms)
end

-- A batch waiter ranks as interactive from its ages_at: re-key those placed by rank.
local function age()
  local due = R('ZRANGEBYSCORE', AGING, '-inf', now, 'LIMIT', 0, AGE_BUDGET)
  for _, id in ipairs(due) do
    R('ZREM', AGING, id)
    local rec = R('HGET', WAITERS, id)
    if rec then
      local w = cjson.decode(rec)
      if w.c then
        local c = split_at(w.c)
        R('ZREM', CWAIT, w.c)
        w.c = c .. SEP .. ekey(w) .. SEP .. id
        R('ZADD', CWAIT, 0, w.c)
        R('HSET', WAITERS, id, cjson.encode(w))
      else
        local sub = sub_of(w)
        local at = R('HGET', SPOT, sub)
        if at then
          local where, key = split_at(at)
          if string.sub(key, 2) == seq15(w.s) then respot(sub, where) end
        end
      end
    end
  end
end

-- ---- The grant rule over the ready set: a port of _rule.py plan_grants ----------------
-- Candidates, best rank first: the ready sub-lanes, the sub-lanes parked under a shared
-- resource that came free (WAKE), and the waiters held back by a consumer that came
-- free (CWAIT "consumer SEP key SEP id"). A head short of a shared resource parks its
-- sub-lane under it (everyone behind is short too); one short only of its consumer
-- slot waits under that consumer, out of its lane, until the consumer frees a slot;
-- one that fits is granted, all or nothing. A parked sub-lane is not read again until
-- its resource frees a slot. Work per pass: O((grants + moves) x log n), each move
-- paid for by a state change; a pass stops after PASS_BUDGET candidates and the next
-- operation goes on from there (READY and WAKE are kept in the store).
local function blocker(w)             -- a full shared resource of w (Space before global)
  local global_full = false
  for r in string.gmatch(w.l, '[^,]+') do
    if is_full(r) then
      if r ~= GLOBAL then return r end
      global_full = true
    end
  end
  return global_full and GLOBAL or nil
end

local function grant_pass()
  if quarantined() then return {} end
  age()
  local woken, grants, budget, returned = {}, {}, PASS_BUDGET, 0
  local later = {}                             -- woken, but for the next pass
  local function load_wake()
    local got = R('SPOP', WAKE, 64)
    for _, r in ipairs(got) do woken[r] = true end
    return #got > 0
  end
  load_wake()
  while budget > 0 do
    local best_key, best_src, best_m = nil, nil, nil
    local m = first_of(PARK, '')
    if m then best_key, best_src, best_m = string.sub(m, 2, 17), '', m end
    for r in pairs(woken) do
      local private = is_private(r)
      local c = nil
      if not is_full(r) and not (private and returned >= RETURN_BUDGET) then
        c = first_of(private and CWAIT or PARK, r)
      end
      if not c then
        if private and returned >= RETURN_BUDGET and not is_full(r) then
          later[#later + 1] = r               -- the rest of its waiters: next time
        end
        woken[r] = nil
      else
        local k = string.sub(c, #r + 2, #r + 17)
        if not best_key or k < best_key then best_key, best_src, best_m = k, r, c end
      end
    end
    if not best_key then
      if not load_wake() then break end
    else
      budget = budget - 1
      if best_src ~= '' and is_private(best_src) then
        -- A waiter its consumer held back: back into its lane, in its place.
        returned = returned + 1
        R('ZREM', CWAIT, best_m)
        local id = string.sub(best_m, #best_src + 19)
        local rec = R('HGET', WAITERS, id)
        if rec then
          local w = cjson.decode(rec)
          w.c = nil
          R('ZADD', LANES, 0, w.m)
          R('HSET', WAITERS, id, cjson.encode(w))
          local sub = sub_of(w)
          local at = R('HGET', SPOT, sub)
          if not at then
            spot(sub, '', ekey(w))
          else
            local where, key = split_at(at)
            if ekey(w) < key then unspot(sub); spot(sub, where, ekey(w)) end
          end
        end
      else
        local sub = string.sub(best_m, #best_src + 19)
        unspot(sub)
        local hm, id, rec = head_of(sub)
        if hm then
          local w = cjson.decode(rec)
          local short = blocker(w)
          if short then
            spot(sub, short, ekey(w))          -- (1) blocked: so is its sub-lane
          else
            local held_back = nil
            for _, r in ipairs(w.r) do
              if is_private(r) and is_full(r) then held_back = r; break end
            end
            if held_back then                  -- (1) its consumer is full: no place
              R('ZREM', LANES, w.m)
              w.c = held_back .. SEP .. ekey(w) .. SEP .. id
              R('ZADD', CWAIT, 0, w.c)
              R('HSET', WAITERS, id, cjson.encode(w))
            else                               -- (2) grant, all or nothing
              drop_waiter(id, true)
              make_lease(id, w)
              grants[#grants + 1] = {id = id, o = w.o}
            end
            respot(sub, '')
          end
        end
      end
    end
  end
  if budget <= 0 then                          -- unfinished: the next operation goes on
    for r in pairs(woken) do later[#later + 1] = r end
  end
  -- Put back only now: a pass never takes up again what it set aside (it would loop).
  if #later > 0 then R('SADD', WAKE, unpack(later)) end
  local mine, others = {}, {}
  for _, g in ipairs(grants) do
    if g.o == owner then
      mine[#mine + 1] = g.id
    else
      others[g.o] = others[g.o] or {}
      table.insert(others[g.o], g.id)
      R('ZADD', INBOX, 0, g.o .. SEP .. g.id)  -- read by its owner's next poll
    end
  end
  for o, list in pairs(others) do R('PUBLISH', chan .. o, table.concat(list, ',')) end
  return mine
end
-- ---- end of the grant rule -------------------------------------------------------------

-- The limits that rule the given resources (for the wait estimate), as a flat list.
local function limits_for(resources)
  local flat = {}
  for _, r in ipairs(resources) do
    local own = R('HGET', LIMITS, r)
    if own then
      flat[#flat + 1] = r; flat[#flat + 1] = own
    else
      local i = string.find(r, ':', 1, true)
      local p = i and string.sub(r, 1, i)
      local inherited = p and R('HGET', LIMITS, p)
      if inherited then flat[#flat + 1] = p; flat[#flat + 1] = inherited end
    end
  end
  return flat
end

local function reply(status, mine, positions, extra, limits)
  if not limits then return {status, mine, positions, {}, '', extra or 0} end
  return {status, mine, positions, limits, R('HGET', META, 'mean') or '', extra or 0}
end

-- A prefix limit ("consumer:") changed: every resource under it may have room now.
local function wake_prefix(p)
  for _, zset in ipairs({PARK, CWAIT}) do
    local m = R('ZRANGEBYLEX', zset, '[' .. p, '[' .. p .. TOP, 'LIMIT', 0, 1)[1]
    while m do
      local r = string.sub(m, 1, string.find(m, SEP, 1, true) - 1)
      R('SADD', WAKE, r)
      m = R('ZRANGEBYLEX', zset, '[' .. r .. '\2', '[' .. p .. TOP, 'LIMIT', 0, 1)[1]
    end
  end
end

-- Each op returns a table; the script returns them as one JSON string (cheap to parse).
local function dispatch()
if op == 'enqueue' then
  -- ARGV 8, 9: class rank (0 interactive, 1 batch), ms after which batch ranks as 0
  local id, ttl = ARGV[5], tonumber(ARGV[7])
  local w = {o = owner, r = cjson.decode(ARGV[6]),
             p = tonumber(ARGV[8] or '0'), a = now + tonumber(ARGV[9] or '0')}
  alive(ttl)                                   -- the entry lives as long as its owner
  reclaim()
  note_ttl(ttl)
  if is_gone(id) then return reply('GONE', {}, {}) end  -- a late enqueue (issue 22)
  if R('ZCARD', QUEUE) == 0 and not quarantined() then
    -- Nobody queued: the rule reduces to "every resource has a free slot".
    local fits = true
    for _, r in ipairs(w.r) do
      if is_full(r) then fits = false; break end
    end
    if fits then
      make_lease(id, w)
      return reply('OK', {id}, {})
    end
  end
  add_waiter(id, w)
  local mine = grant_pass()
  local rank = R('ZRANK', QUEUE, id)
  if rank then return reply('OK', mine, {id, rank + 1}, 0, limits_for(w.r)) end
  return reply('OK', mine, {})

elseif op == 'release' then
  reclaim()
  local found = drop_lease(ARGV[5])
  if found then
    local mean = tonumber(R('HGET', META, 'mean') or '1')
    R('HSET', META, 'mean', tostring(0.8 * mean + 0.2 * tonumber(ARGV[6])))
  end
  return reply('OK', grant_pass(), {}, found and 1 or 0)

elseif op == 'withdraw' then
  local id, keep = ARGV[5], ARGV[6] == '1'
  reclaim()
  local status, position = 'GONE', 0
  local rank = R('ZRANK', QUEUE, id)
  if R('HEXISTS', WAITERS, id) == 1 then
    status = 'WAITING'
    if rank then position = rank + 1 end
    drop_waiter(id)
  elseif R('HEXISTS', LEASES, id) == 1 then
    status = 'GRANTED'
    if keep then return reply(status, {}, {}) end
    drop_lease(id)
  else
    bury(id)                                   -- its enqueue may still arrive (issue 22)
  end
  return reply(status, grant_pass(), {}, position)

elseif op == 'poll' then
  -- ARGV 5..: a few of our waiters (the client rotates through them): their positions.
  reclaim()
  local mine = grant_pass()
  local lo, hi = range(owner)
  local inbox = R('ZRANGEBYLEX', INBOX, lo, hi, 'LIMIT', 0, 256)
  for _, m in ipairs(inbox) do mine[#mine + 1] = string.sub(m, #owner + 2) end
  if #inbox > 0 then R('ZREM', INBOX, unpack(inbox)) end
  local positions = {}
  for i = 5, #ARGV do
    local rank = R('ZRANK', QUEUE, ARGV[i])
    if rank then
      positions[#positions + 1] = ARGV[i]
      positions[#positions + 1] = rank + 1
    elseif R('HEXISTS', LEASES, ARGV[i]) == 1 then
      mine[#mine + 1] = ARGV[i]                 -- granted earlier; the message was missed
    end
  end
  return reply('OK', mine, positions)

elseif op == 'renew' then
  -- ARGV 5: ttl, 6: how many entries the owner holds. One deadline, whatever it holds.
  local unknown = alive(tonumber(ARGV[5]))
  local lo, hi = range(owner)
  return {'OK', unknown and 0 or 1, R('ZLEXCOUNT', OWNED, lo, hi)}

elseif op == 'check' then
  -- ARGV 5..: a chunk of ids the owner holds: those the store does not have.
  local missing = {}
  for i = 5, #ARGV do
    if R('HEXISTS', LEASES, ARGV[i]) == 0 and R('HEXISTS', WAITERS, ARGV[i]) == 0 then
      missing[#missing + 1] = ARGV[i]
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
  for i = 5, #ARGV, 2 do
    local name = ARGV[i]
    R('HSET', LIMITS, name, ARGV[i + 1])
    if string.sub(name, -1) == ':' then wake_prefix(name) else R('SADD', WAKE, name) end
  end
  limits_cache = {}
  reclaim()
  return reply('OK', grant_pass(), {}, 0, R('HGETALL', LIMITS))

elseif op == 'snapshot' then
  -- Per resource: its size is the number of resources in use, not of waiters.
  reclaim()
  local mine = grant_pass()
  return {'OK', mine, R('HGETALL', HELD), R('HGETALL', QCOUNT), R('HGETALL', LIMITS),
          tonumber(R('HGET', META, 'waiting') or '0'),
          tonumber(R('HGET', META, 'batch') or '0')}

elseif op == 'secret' then
  R('HSETNX', META, 'secret', ARGV[5])
  return {'OK', R('HGET', META, 'secret')}

elseif op == 'restore' then
  -- ARGV 5 epoch seen before ('' if none, '?' if unknown), 6 new epoch candidate,
  -- 7 ttl_ms, 8 secret,
  -- then counted lists: limits (name, n), leases (id, resources), waiters (id, resources).
  -- A client re-registers in chunks: the later ones name the epoch the first returned.
  local prev, ttl, secret = ARGV[5], tonumber(ARGV[7]), ARGV[8]
  note_ttl(ttl)
  local current = R('HGET', META, 'epoch')
  if not current then
    current = ARGV[6]
    R('HSET', META, 'epoch', current, 'born', now)
  end
  local function quarantine_until(until_ms)
    if until_ms > tonumber(R('HGET', META, 'quarantine') or '0') then
      R('HSET', META, 'quarantine', until_ms)
    end
  end
  if prev ~= '' and prev ~= current then
    -- The store lost its state while we held entries in it: grant nothing new until
    -- every live process has had a lease TTL to re-register its leases.
    quarantine_until(tonumber(R('HGET', META, 'born')) + ttl)
  end
  -- A server younger than one TTL may have replaced one whose holders still run
  -- (uptime_in_seconds rounds down: the start is taken late, the quarantine long).
  local up = tonumber(string.match(R('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
  if up and up * 1000 < ttl then quarantine_until(now - up * 1000 + ttl) end
  if secret ~= '' then R('HSETNX', META, 'secret', secret) end
  alive(ttl)
  reclaim()
  local i = 9
  local n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    R('HSETNX', LIMITS, ARGV[i], ARGV[i + 1]); i = i + 2
  end
  limits_cache = {}
  local refused = {}
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    local id, w = ARGV[i], {o = owner, r = cjson.decode(ARGV[i + 1])}
    i = i + 2
    if is_gone(id) then
      refused[#refused + 1] = id               -- it left the store: never back (issue 22)
    elseif R('HEXISTS', LEASES, id) == 0 then
      drop_waiter(id, true)
      -- Taken back only into free slots: a slot given away meanwhile stays given.
      local fits = true
      for _, r in ipairs(w.r) do
        if is_full(r) then fits = false; break end
      end
      if fits then make_lease(id, w) else refused[#refused + 1] = id end
    end
  end
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    local id, w = ARGV[i], {o = owner, r = cjson.decode(ARGV[i + 1])}
    i = i + 2
    if is_gone(id) then
      refused[#refused + 1] = id               -- it left the store: never back (issue 22)
    elseif R('HEXISTS', LEASES, id) == 0 and R('HEXISTS', WAITERS, id) == 0 then
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
    if op == 'restore' then store_epoch = result[2]; limits_cache = {} end
  end
  results[#results + 1] = result
end
results[#results + 1] = work
return cjson.encode(results)
