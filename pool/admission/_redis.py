"""Fleet-wide store (``redis://host:port/db``): processes on several hosts share Redis.

Every decision is one Lua script (:data:`_SCRIPT`), so it is atomic on the server and
costs one round trip. The state, under a configurable key prefix
(``?prefix=``, default ``spacepool:``; use a hash tag such as ``{spacepool}:`` on
Redis Cluster, as every script touches all the keys)::

    meta      HASH   epoch, born, quarantine, seq, mean (hold-time EWMA), secret,
                     next_expiry (no deadline is earlier: reclaim has nothing to do)
    limits    HASH   resource or prefix ("consumer:") -> limit
    held      HASH   resource -> holders (kept in step with ``leases`` by the scripts)
    queue     ZSET   waiter id scored by class rank * 2^40 + a global sequence (HINCRBY
                     meta seq): the rank order, for positions
    waiters   HASH   waiter id -> {o: owner, t: ttl_ms, r: resources, p: class rank,
                     a: ages_at (ms; batch ranks as interactive from then), m: lane key}
    wexp      ZSET   waiter id scored by its expiry (ms, server clock)
    leases    HASH   lease id -> the same record; a granted waiter keeps its id
    lexp      ZSET   lease id scored by its expiry
    lanes     ZSET   all scores 0, members ``lane SEP rank SEP seq(15 digits) SEP id``
                     with SEP = chr(1): each lane and class is a contiguous range, in
                     arrival order (issue 18)
    gone      ZSET   tombstones: withdrawn, released, dropped or expired ids scored by
                     when they may be forgotten (>= one lease TTL later; see below)

Shared values live under the same prefix (``values:<ns>``, ``vexp:<ns>``), read and
written by their own script (:mod:`pool.admission._redis_values`); this one never
touches them.

Why it is shaped this way:

* **Same rule, in the server.** ``grant_pass`` in the script is a line-for-line port
  of :func:`pool.admission._rule.plan_grants`: the heads of the lanes (``lanes``)
  merged in rank order, a waiter that fits is granted, a waiter short of a shared
  resource closes its lane for the pass, one short of its ``consumer:`` slot only is
  skipped. Keep the two in step.
* **Expiry is data.** Deadlines of leases and waiters live in ZSETs and every script
  starts by reclaiming what is past due (``TIME`` of the server, so host clocks do
  not matter). No janitor process is needed.
* **Push, then poll.** A script that grants waiters of other processes PUBLISHes
  their ids on ``<prefix>grants:<owner>``; each process has ONE subscriber that
  resolves its local futures. A slow safety poll (``?poll_ms=``, default 500) covers
  a lost message and lets waiting processes reclaim a crashed process's slots.
* **Batched.** Operations made in the same event-loop iteration (concurrent
  acquires and releases) go out together: one round trip, and one script run for up
  to ``_OPS_PER_RUN`` of them, applied in order, each against its own epoch. Per
  operation, a script run of its own cost more than the work (the run's setup on
  the server, ten keys packed and parsed by redis-py on the client).
* **Fail closed, promptly.** Socket timeouts are short (``?timeout_ms=``, default
  1000) and redis-py's retries are off: an admission that cannot reach Redis raises
  at once (the coordinator maps it to ``BusyError(reason="coordinator_unavailable")``)
  instead of retrying a non-idempotent script. The subscriber reconnects by itself.
* **A late command cannot act.** A command abandoned on timeout may still reach
  Redis later (seen: an enqueue 7 s after a partition healed, after its waiter had
  been withdrawn on a new connection). So every id that leaves the store (withdrawn,
  released, dropped, expired) leaves a tombstone in ``gone`` for at least one lease
  TTL (``meta tomb_ms``: the longest TTL any client registered), and an enqueue or a
  restore of a tombstoned id does nothing (answers ``GONE``); a renewal already
  ignores an unknown id. And the client resets (``SO_LINGER`` 0) a connection it
  abandons, so the kernel drops what it had not delivered instead of retransmitting
  it after the heal (:mod:`pool.admission._redis_conn`).
* **Surviving a restart, empty or from an older snapshot.** Admitting against a
  store that forgot slots still in use would break the cap. So each client sends the
  store *epoch* it knows, and a script run against another epoch does nothing and
  answers ``EPOCH``; a restarted server also answers ``NOSCRIPT`` to every client's
  first call. Either way the client re-registers its limits, its live leases and its
  queued waiters (``restore``, waiters in their order) before it goes on; a renewal
  that finds a live lease missing (an older snapshot) does the same. A lease is
  re-registered only if its slots are still free: one whose slot was given away
  meanwhile is reported back and its holder fences itself (``LeaseLost``).
  *Quarantine*: while a server is younger than one lease TTL (``INFO`` uptime, read
  by ``restore``), or for one TTL after a client that knew an earlier epoch finds a
  new one (a flush), nothing new is granted. A holder of the old server renewed
  before that server went away, so its local expiry falls inside the quarantine:
  by its end every live holder has re-registered or fenced itself, and the rule
  counts slots again. Waiters queue meanwhile and are served in order after it.
  The price: the first TTL after any Redis start admits nothing. Left open: a
  ``FLUSHALL`` on a long-running server first seen by a brand-new process (it can
  be admitted over the limit until an old holder's next heartbeat imposes the
  quarantine); do not flush a live store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError

from ._lease_keeper import LocalEntries, SharedCoordinator, StoreView, Withdrawn
from ._protocol import AdmissionSnapshot, StoreUnavailable, new_id
from ._redis_conn import ResetOnClose
from ._redis_values import UNREACHABLE as _UNREACHABLE
from ._redis_values import RedisValues
from ._rule import INTERACTIVE, RANK

_log = logging.getLogger("spacepool.admission")

# "gone" is last on purpose: other keys may be added before it (KEYS[10] in the script).
_KEYS = ("meta", "limits", "held", "queue", "waiters", "wexp", "leases", "lexp", "lanes", "gone")
_OPS_PER_RUN = 32  # operations per script run at most: Redis runs one script at a time

_SCRIPT = r"""
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
"""


class RedisCoordinator(SharedCoordinator):
    """Admission shared by every process and host that uses one Redis (and prefix)."""

    def __init__(self, url: str, *, lease_ttl_s: float = 15.0) -> None:
        base_url, prefix, poll_s, timeout_s = _parse_url(url)
        self.prefix = prefix
        super().__init__(
            _RedisStore(
                base_url,
                owner=new_id(),
                lease_ttl_s=lease_ttl_s,
                prefix=prefix,
                poll_interval_s=poll_s,
                timeout_s=timeout_s,
            ),
            lease_ttl_s=lease_ttl_s,
        )


def _parse_url(url: str) -> tuple[str, str, float, float]:
    """Split our options (prefix, poll_ms, timeout_ms) from the redis-py URL."""
    parts = urlsplit(url)
    ours = {"prefix": "spacepool:", "poll_ms": "500", "timeout_ms": "1000"}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in ours:
            ours[key] = value
        else:
            rest.append((key, value))
    base = urlunsplit(parts._replace(query=urlencode(rest)))
    return base, ours["prefix"], float(ours["poll_ms"]) / 1000, float(ours["timeout_ms"]) / 1000


class _RedisStore:
    """One client, one script, one subscriber; see the module docstring."""

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        owner: str,
        lease_ttl_s: float,
        prefix: str,
        poll_interval_s: float,
        timeout_s: float,
    ) -> None:
        self.poll_interval_s = poll_interval_s
        self._where = urlsplit(url).netloc.rpartition("@")[2]
        self._owner = owner
        self._ttl_ms = max(1, round(lease_ttl_s * 1000))
        self._client: Redis = Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=max(5, int(lease_ttl_s)),
            # A redis:// URL's connections are reset when abandoned (a rediss:// or
            # unix:// URL names its own class, which wins).
            connection_class=ResetOnClose,
        )
        self._sha = hashlib.sha1(_SCRIPT.encode()).hexdigest()
        self._batch: list[tuple[list[str | int | float], asyncio.Future[list[Any]]]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._keys = [prefix + k for k in _KEYS]
        self._channels = prefix + "grants:"
        self._epoch = ""
        self._restoring = False
        self._lost_contact = False  # we may have missed an epoch while Redis was away
        self._limits_set: dict[str, int] = {}
        self._secret: str | None = None
        self._local: LocalEntries | None = None
        self._closed = False
        self.values = RedisValues(
            self._client, prefix, where=self._where, closed=lambda: self._closed
        )

    def attach(self, local: LocalEntries) -> None:
        self._local = local

    # -- script calls, pipelined -----------------------------------------------------------
    async def _eval(self, op: str, owner: str, args: Sequence[str | int | float]) -> list[Any]:
        """One operation; those made in the same loop iteration share a round trip."""
        if self._closed:  # a late call (a release after aclose) must not reconnect
            raise StoreUnavailable(f"redis {self._where}: store closed")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if not self._batch:
            self._flushes.add(task := asyncio.get_running_loop().create_task(self._flush()))
            task.add_done_callback(self._flushes.discard)
        self._batch.append(([op, owner, self._epoch, *args], future))
        return await future

    async def _flush(self) -> None:
        batch, self._batch = self._batch, []
        futures = [future for _, future in batch]
        try:
            replies = await self._pipeline([args for args, _ in batch])
        except _UNREACHABLE as exc:
            self._lost_contact = True
            for future in futures:
                if not future.done():
                    error = StoreUnavailable(f"redis {self._where}: {exc}")
                    error.__cause__ = exc
                    future.set_exception(error)
            return
        except BaseException as exc:  # nobody may be left waiting forever
            for future in futures:
                if not future.done():
                    if isinstance(exc, Exception):
                        future.set_exception(exc)
                    else:
                        future.cancel()
            raise
        for future, reply in zip(futures, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            elif reply[0] == "ERROR":
                future.set_exception(ResponseError(str(reply[1])))
            else:
                future.set_result(cast(list[Any], reply))

    async def _pipeline(self, calls: list[list[str | int | float]]) -> list[Any]:
        """Run ``calls`` in order, in one round trip; one reply per call: its result list,
        or the error of the script run it was part of."""
        runs = [calls[i : i + _OPS_PER_RUN] for i in range(0, len(calls), _OPS_PER_RUN)]
        replies = await self._send(runs)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:  # Redis restarted or flushed its scripts: nothing of these ran
            await self._client.script_load(_SCRIPT)
            if not self._restoring:  # maybe from an older snapshot: re-register first
                await self._restore()
            for i, reply in zip(missing, await self._send([runs[i] for i in missing]),
                                strict=True):
                replies[i] = reply
        out: list[Any] = []
        for run, reply in zip(runs, replies, strict=True):
            results = reply if isinstance(reply, Exception) else json.loads(reply)
            if not isinstance(results, list) or len(results) != len(run):
                results = ResponseError(f"spacepool: {len(run)} operations, reply {reply!r}")
            out.extend([results] * len(run) if isinstance(results, Exception) else results)
        return out

    async def _send(self, runs: list[list[list[str | int | float]]]) -> list[Any]:
        """One reply per run: its JSON string, or its error (unreachable: raised)."""
        calls: list[list[str | int | float]] = []
        for run in runs:
            args: list[str | int | float] = [self._channels]
            for call in run:
                args.append(len(call))
                args.extend(call)
            calls.append(args)
        if len(calls) == 1:  # the usual case; a pipeline object costs ~40 us of CPU more
            try:
                return [await self._client.evalsha(self._sha, len(self._keys), *self._keys,
                                                   *calls[0])]
            except ResponseError as exc:
                if isinstance(exc, _UNREACHABLE):
                    raise
                return [exc]
        pipe = self._client.pipeline(transaction=False)
        for args in calls:
            pipe.evalsha(self._sha, len(self._keys), *self._keys, *args)
        replies = list(await pipe.execute(raise_on_error=False))
        for reply in replies:
            if isinstance(reply, _UNREACHABLE):
                raise reply
        return replies

    async def _call(self, op: str, *args: str | int | float, owner: str | None = None) -> list[Any]:
        who = self._owner if owner is None else owner
        for _ in range(3):
            reply = await self._eval(op, who, args)
            if reply[0] != "EPOCH":
                return reply
            await self._restore()
        raise StoreUnavailable(f"redis {self._where}: store epoch keeps changing")

    async def _restore(self) -> None:
        self._restoring = True
        try:
            await self._restore_once()
        finally:
            self._restoring = False

    async def _restore_once(self) -> None:
        leases, waiters = self._local.local_entries() if self._local else ([], [])
        # "?" for a client that never saw an epoch but lost contact: it cannot vouch
        # that the store was not reset while it was away, so it asks for a quarantine.
        seen = self._epoch or ("?" if self._lost_contact else "")
        args: list[str | int | float] = [seen, new_id(), self._ttl_ms, self._secret or ""]
        args.append(len(self._limits_set))
        for name, limit in self._limits_set.items():
            args += [name, limit]
        for entries in (leases, waiters):
            args.append(len(entries))
            for key, resources in entries:
                args += [key, json.dumps(list(resources))]
        reply = await self._eval("restore", self._owner, args)
        self._lost_contact = False
        refused = [str(key) for key in reply[2]]
        if (self._epoch and reply[1] != self._epoch) or refused:
            _log.warning(
                "redis admission store %s was reset; re-registered %d lease(s) (%d refused: "
                "their slots were given away), %d waiter(s)",
                self._where, len(leases) - len(refused), len(refused), len(waiters),
            )
        self._epoch = str(reply[1])
        if refused and self._local is not None:
            self._local.entries_lost(refused)

    # -- SharedStore ----------------------------------------------------------------------
    async def enqueue(
        self,
        waiter_id: str,
        resources: tuple[str, ...],
        *,
        priority: str = INTERACTIVE,
        ages_after_s: float = 60.0,
    ) -> StoreView:
        reply = await self._call(
            "enqueue", waiter_id, json.dumps(list(resources)), self._ttl_ms, RANK[priority],
            max(0, round(ages_after_s * 1000)),
        )  # fmt: skip
        return _view(reply)

    async def withdraw(self, waiter_id: str, *, keep: bool) -> Withdrawn:
        reply = await self._call("withdraw", waiter_id, "1" if keep else "0")
        return Withdrawn(reply[0] == "GRANTED", int(reply[5]), _view(reply))

    async def release(self, lease_id: str, held_s: float) -> StoreView:
        reply = await self._call("release", lease_id, max(held_s, 0.0))
        if not reply[5]:
            _log.warning("lease %s was gone from the store (expired?) at release", lease_id[:8])
        return _view(reply)

    async def poll(self, waiting: Sequence[str]) -> StoreView:
        return _view(await self._call("poll", *waiting))

    async def renew(self, ids: Sequence[str]) -> set[str]:
        reply = await self._call("renew", self._ttl_ms, *ids)
        missing = set(reply[1])
        live = {key for key, _ in self._local.local_entries()[0]} if self._local else set()
        if missing & live:  # a live lease the store forgot (an older snapshot): restore
            await self._restore()
            missing = set((await self._call("renew", self._ttl_ms, *missing))[1])
        return missing

    async def drop(self, ids: Sequence[str]) -> None:
        await self._call("drop", *ids)

    async def set_limits(self, limits: Mapping[str, int]) -> StoreView:
        self._limits_set.update(limits)  # re-registered if the store is ever reset
        args: list[str | int] = []
        for name, limit in limits.items():
            args += [name, int(limit)]
        return _view(await self._call("set_limits", *args))

    async def snapshot(self) -> AdmissionSnapshot:
        # owner "": every grant this pass makes is published, ours included.
        _, _, held, queued, limits, waiting, batch = await self._call("snapshot", owner="")
        return AdmissionSnapshot(
            held=_pairs(held),
            queued=_pairs(queued),
            limits=_pairs(limits),
            waiting=int(waiting),
            store=self.name,
            batch_waiting=int(batch),
        )

    async def shared_secret(self) -> bytes:
        if self._secret is None:
            reply = await self._call("secret", secrets.token_hex(32))
            self._secret = str(reply[1])
        return bytes.fromhex(self._secret)

    async def watch(
        self, on_grant: Callable[[Iterable[str]], None], on_resume: Callable[[], None]
    ) -> None:
        """The one subscriber of this process; reconnects by itself, forever."""
        delay = 0.05
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channels + self._owner)
                on_resume()  # a grant may have been published while we were away
                delay = 0.05
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                       timeout=5.0)
                    if message is not None and message["type"] == "message":
                        on_grant(str(message["data"]).split(","))
            except _UNREACHABLE as exc:
                _log.debug("admission subscriber lost redis %s: %s", self._where, exc)
            finally:
                # Shielded: a cancel arriving while the connection closes must not leave
                # it open (it would outlive the client's own close).
                with contextlib.suppress(*_UNREACHABLE):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call,unused-ignore]  # untyped before redis-py 8.2
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def close(self) -> None:
        """Close every connection (the subscriber's went with its task); no reconnects."""
        self._closed = True
        if self._flushes:  # calls already sent: let them finish on their connections
            await asyncio.gather(*self._flushes, return_exceptions=True)
        await self._client.aclose()


def _pairs(flat: Sequence[Any]) -> dict[str, int]:
    """``[k1, v1, k2, v2, ...]`` as a dict (an empty Lua table arrives as ``{}``)."""
    return {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def _view(reply: Sequence[Any]) -> StoreView:
    """``{status, mine, positions, limits, mean, extra}`` as a :class:`StoreView`."""
    return StoreView(
        granted=frozenset(reply[1]),
        positions=_pairs(reply[2]),
        limits=_pairs(reply[3]) if reply[3] else None,
        mean_hold_s=float(reply[4]) if reply[4] else None,
    )
