"""Shared values in the Redis store (see :mod:`pool.admission._values`).

Per namespace, two keys under the store's prefix: ``values:<ns>`` (HASH key → value)
and ``vexp:<ns>`` (ZSET key scored by its deadline, ms on the server's clock). One
small script (:data:`_SCRIPT`) does each operation on one namespace's two keys, so a
scan of ``jobcancel:`` never reads the ``job:`` mirrors, and admission's script,
which no longer has any value key, never waits behind a scan.

Compare-and-set makes :meth:`RedisValues.update` atomic across processes; updates of
one key from the same process take turns (a striped lock), so only other processes
can conflict and the loop converges (under 120 concurrent updates it did not
otherwise).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._protocol import StoreUnavailable
from ._values import Update, namespace_of

# What means "Redis did not answer" (fail closed), for this module and the store's.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)
_CAS_ATTEMPTS = 32
_PURGE = 256  # expired values dropped per write at most (a scan drops them all)
# Values calls in flight at once per process. Each takes a connection of the client's
# pool (admission's calls share one batch, values calls do not), and redis-py refuses
# a call past the pool's size (100) as if Redis were unreachable.
_IN_FLIGHT = 32

_SCRIPT = r"""
-- KEYS: values:<ns> HASH, vexp:<ns> ZSET.  ARGV: op, key or prefix, op arguments.
local VALUES, EXPIRY = KEYS[1], KEYS[2]
local op, key = ARGV[1], ARGV[2]
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
end

if op == 'put' then
  put(key, ARGV[3], tonumber(ARGV[4]))
  return {'OK'}
elseif op == 'get' then
  return {'OK', live(key)}
elseif op == 'del' then
  redis.call('HDEL', VALUES, key)
  redis.call('ZREM', EXPIRY, key)
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
"""


class RedisValues:
    """The values of one Redis store (its client, its key prefix)."""

    def __init__(
        self, client: Redis, prefix: str, *, where: str, closed: Callable[[], bool]
    ) -> None:
        self._script = client.register_script(_SCRIPT)  # EVALSHA, loading it on NOSCRIPT
        self._prefix = prefix
        self._where = where
        self._closed = closed
        self._locks = [asyncio.Lock() for _ in range(16)]
        self._in_flight = asyncio.Semaphore(_IN_FLIGHT)

    async def _run(self, op: str, key: str, *args: str | int) -> list[Any]:
        if self._closed():  # a late call must not reconnect a closed client
            raise StoreUnavailable(f"redis {self._where}: store closed")
        ns = namespace_of(key)
        keys = [f"{self._prefix}values:{ns}", f"{self._prefix}vexp:{ns}"]
        try:
            async with self._in_flight:
                reply = await self._script(keys=keys, args=[op, key, *args])
        except UNREACHABLE as exc:
            raise StoreUnavailable(f"redis {self._where}: {exc}") from exc
        return list(reply)

    async def put(self, key: str, value: str, ttl_s: float) -> None:
        await self._run("put", key, value, _ms(ttl_s), _PURGE)

    async def get(self, key: str) -> str | None:
        found = (await self._run("get", key))[1]
        return None if found is None or found is False else str(found)

    async def scan(self, prefix: str) -> dict[str, str]:
        flat = (await self._run("scan", prefix))[1]
        return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def delete(self, key: str) -> None:
        await self._run("del", key)

    async def update(self, key: str, update: Update, ttl_s: float) -> str | None:
        # Optimistic: read, compute, compare-and-set; a write by another process in
        # between makes the script answer CONFLICT with the live value, and we go again.
        async with self._locks[hash(key) % len(self._locks)]:
            current = await self.get(key)
            for attempt in range(_CAS_ATTEMPTS):
                new = update(current)
                if new is None:
                    return current
                known = ("0", "") if current is None else ("1", current)
                reply = await self._run("cas", key, *known, new, _ms(ttl_s), _PURGE)
                if reply[0] == "OK":
                    return new
                current = None if reply[1] is None or reply[1] is False else str(reply[1])
                await asyncio.sleep(random.uniform(0, 0.001 * (attempt + 1)))
        raise StoreUnavailable(f"redis {self._where}: value {key!r} keeps changing")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
