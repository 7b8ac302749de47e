"""Shared values in the Redis store (see :mod:`pool.admission._values`).

Per namespace, two keys under the store's prefix: ``values:<ns>`` (HASH key → value)
and ``vexp:<ns>`` (ZSET key scored by its deadline, ms on the server's clock). One
small script (``values.lua``, beside this module) does each operation on one
namespace's two keys, so a scan of ``jobcancel:`` never reads the ``job:`` mirrors,
and admission's script, which no longer has any value key, never waits behind a scan.

Every write is PUBLISHed (the key, on ``<prefix>changed``); one subscriber per
process (:func:`listen`, started by the first watcher) wakes the key's watchers
(:mod:`pool.admission._watch`). The admission store's grant channel uses the same
:func:`listen`.

Compare-and-set makes :meth:`RedisValues.update` atomic across processes; updates of
one key from the same process take turns (a striped lock), so only other processes
can conflict and the loop converges (under 120 concurrent updates it did not
otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._retry import RetryPolicy
from .._tasks import cancelling
from ._lua import load_script
from ._protocol import StoreUnavailable
from ._redis_conn import Client
from ._values import Update, namespace_of
from ._watch import Changed, Watchers

_log = logging.getLogger("spacepool.admission")

# What means "Redis did not answer" (fail closed), for this module and the store's.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)
_CAS_ATTEMPTS = 32
_PURGE = 256  # expired values dropped per write at most (a scan drops them all)
# Values calls in flight at once per process. Each takes a connection of the client's
# pool (admission's calls share one batch, values calls do not), and redis-py refuses
# a call past the pool's size (100) as if Redis were unreachable.
_IN_FLIGHT = 32

_SCRIPT = load_script("values.lua")
# A lost subscription is tried again after 0.05 s, then twice as long each time up to
# 1 s, until it is back. (Not pool.resilience.RetryPolicy: resilience is a layer above
# admission, tests/test_structure.py.)
_CAS_BACKOFF = RetryPolicy(attempts=1, base_s=0.001, max_s=0.016)  # a lost compare-and-set
_RESUBSCRIBE = RetryPolicy(attempts=1, base_s=0.05, max_s=1.0)  # jittered, 50 ms → 1 s
_READY_S = 1.0  # a new watcher waits this long at most for the subscription


async def listen(
    client: Client,
    channel: str,
    on_message: Callable[[str], None],
    on_subscribed: Callable[[], None],
    *,
    where: str,
) -> None:
    """Subscribe to ``channel`` and hand each message to ``on_message``, forever: a
    lost connection is reopened (backing off: :data:`_RESUBSCRIBE`), then
    ``on_subscribed`` runs, as messages may have been lost while it was away.

    Classic pub/sub, also on a Redis Cluster: a PUBLISH (the scripts') reaches the
    subscribers of every node, and the cluster client subscribes on the node that
    serves the channel's slot (the store's, by its hash tag)."""
    failures = 0
    while True:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel)
            failures = 0
            on_subscribed()
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                if message is not None and message["type"] == "message":
                    on_message(str(message["data"]))
        except UNREACHABLE as exc:
            if cancelling():  # the error is how the cancel surfaced: it is not lost
                raise asyncio.CancelledError from exc
            _log.debug("subscriber of %s lost redis %s: %s", channel, where, exc)
        finally:
            # Shielded: a cancel arriving while the connection closes must not leave
            # it open (it would outlive the client's own close).
            with contextlib.suppress(*UNREACHABLE):
                await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call,unused-ignore]  # untyped before redis-py 8.2
        failures += 1
        await asyncio.sleep(_RESUBSCRIBE.delay(failures))


class RedisValues:
    """The values of one Redis store (its client, its key prefix)."""

    def __init__(
        self,
        client: Client,
        prefix: str,
        *,
        where: str,
        closed: Callable[[], bool],
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._ready_store = ready  # the store's checks at the first call
        self._script = client.register_script(_SCRIPT)  # EVALSHA, loading it on NOSCRIPT
        self._prefix = prefix
        self._where = where
        self._closed = closed
        self._locks = [asyncio.Lock() for _ in range(16)]
        self._in_flight = asyncio.Semaphore(_IN_FLIGHT)
        self._client = client
        self._watchers = Watchers(self._ready)
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    def watch(self, key: str) -> AbstractAsyncContextManager[Changed]:
        return self._watchers.watch(key)

    def rebind(self, client: Client, prefix: str) -> None:
        """Use ``client`` and ``prefix`` from now on (the store found a cluster behind a
        plain URL at its first call, before any value was read or watched)."""
        self._client, self._prefix = client, prefix
        self._script = client.register_script(_SCRIPT)

    async def _ready(self) -> None:
        """Start the subscriber if need be; wait (bounded) until it is subscribed."""
        if self._closed():
            return
        if self._ready_store is not None:
            try:  # the subscriber starts on the client and prefix the checks settled
                await self._ready_store()
            except StoreUnavailable:
                return  # not yet: the next watch tries again
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                listen(self._client, self._prefix + "changed", self._watchers.notify,
                       self._on_subscribed, where=self._where),
                name="spacepool-values-watch",
            )  # fmt: skip
        if not self._subscribed.is_set():
            with contextlib.suppress(TimeoutError):  # woken when it is (notify_all)
                async with asyncio.timeout(_READY_S):
                    await self._subscribed.wait()

    def _on_subscribed(self) -> None:
        self._subscribed.set()
        self._watchers.notify_all()

    async def aclose(self) -> None:
        """Stop the subscriber (before the client closes)."""
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener

    async def _run(self, op: str, key: str, *args: str | int) -> list[Any]:
        if self._closed():  # a late call must not reconnect a closed client
            raise StoreUnavailable(f"redis {self._where}: store closed")
        if self._ready_store is not None:
            await self._ready_store()
        ns = namespace_of(key)
        keys = [f"{self._prefix}values:{ns}", f"{self._prefix}vexp:{ns}"]
        try:
            async with self._in_flight:
                reply = await self._script(keys=keys, args=[op, key, *args])
        except UNREACHABLE as exc:
            if cancelling():  # not "unreachable": a caller's retry would lose the cancel
                raise asyncio.CancelledError from exc
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
                await asyncio.sleep(_CAS_BACKOFF.delay(attempt + 1))
        raise StoreUnavailable(f"redis {self._where}: value {key!r} keeps changing")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
