"""Fleet-wide store (``redis://host:port/db``): processes on several hosts share Redis.

Also a Redis Cluster (``redis+cluster://``), a Sentinel's master (``redis+sentinel://``)
and TLS (``rediss://``): :mod:`pool.admission._redis_conn`. At its first call the
store checks the layout's version and that Redis does not evict keys
(:mod:`pool.admission._store_layout`).

Every decision is one Lua script (``admission.lua``, beside this module), so it is
atomic on the server and costs one round trip. The state, under a configurable key prefix
(``?prefix=``, default ``spacepool:``; on a Redis Cluster it gets a hash tag,
``{spacepool:}``, unless it has one, as every script touches all the keys)::

    layout    STRING the layout's version (:mod:`pool.admission._store_layout`)

    meta      HASH   epoch, born, quarantine, seq, mean (hold-time EWMA), secret,
                     tomb_ms, waiting and batch (counts of waiters)
    limits    HASH   resource or prefix ("consumer:") -> limit (read per resource)
    held      HASH   resource -> holders (kept in step with ``leases`` by the scripts)
    queue     ZSET   waiter id scored by class rank * 2^40 + a global sequence (HINCRBY
                     meta seq): the rank order, for positions (ZRANK)
    waiters   HASH   waiter id -> {o: owner, r: resources, p: class rank, a: ages_at
                     (ms; batch ranks as interactive from then), s: seq, l: lane,
                     m: its ``lanes`` member, c: its ``cwait`` member while there}
    leases    HASH   lease id -> {o, r}; a granted waiter keeps its id
    lanes     ZSET   all scores 0, members ``sub SEP seq(15 digits) SEP id``, sub =
                     ``lane SEP class``, SEP = chr(1): each lane and class (a sub-lane)
                     is a contiguous range, in arrival order (issue 18)
    park      ZSET   the ready set (issue 39): each non-empty sub-lane once, as ``where
                     SEP key SEP sub``; where = "" (ready) or the full shared resource
                     that blocks its head; key = the head's rank and seq
    spot      HASH   sub-lane -> ``where SEP key`` (its ``park`` member)
    cwait     ZSET   ``consumer SEP key SEP id``: waiters held back by their consumer
    wake      SET    resources that freed a slot since the last grant pass
    aging     ZSET   batch waiter ids by ages_at, until they rank as interactive
    owners    ZSET   owner -> liveness deadline (ms, server clock): one per process
    owned     ZSET   ``owner SEP id`` for every lease and waiter
    inbox     ZSET   ``owner SEP id``: grants made by another process, for its poll
    qcount    HASH   resource -> waiters that need it (the snapshot's ``queued``)
    gone      ZSET   tombstones: withdrawn, released, dropped or expired ids scored by
                     when they may be forgotten (>= one lease TTL later; see below)

Every key is ``prefix + name`` (``_KEYS``): a hash tag for Redis Cluster goes in the
prefix, in one place. Each script run does bounded work whatever the number of waiters,
Spaces and consumers (docs/leases.md, "The Redis store at fleet scale"); it returns its
work (commands + elements returned) after its results, kept in :attr:`_RedisStore.last_work`.

Shared values live under the same prefix (``values:<ns>``, ``vexp:<ns>``; each write
announced on ``changed``), read and written by their own script
(:mod:`pool.admission._redis_values`); this one never touches them.

Why it is shaped this way:

* **Same rule, in the server.** ``grant_pass`` in the script applies
  :func:`pool.admission._rule.plan_grants` incrementally: the ready sub-lanes and those
  parked under a resource that freed a slot, merged in rank order; a waiter that fits
  is granted, a waiter short of a shared resource parks its sub-lane under it, one
  short of its ``consumer:`` slot only waits under that consumer (``cwait``) until it
  frees a slot. Keep the two in step.
* **Liveness is data, per owner.** Each process renews one deadline (``owners``)
  whatever it holds; its entries live as long as it does. Every script starts by
  dropping a bounded share of the entries of owners past their deadline (``TIME`` of
  the server, so host clocks do not matter). No janitor process is needed.
* **Push, then poll.** A script that grants waiters of other processes PUBLISHes
  their ids on ``<prefix>grants:<owner>``; each process has ONE subscriber of it
  that resolves its local futures (``_redis_values.listen``, also the values' one).
  A slow safety poll (``?poll_ms=``, default 500) covers a lost message and lets
  waiting processes reclaim a crashed process's slots. Grants made by another process
  also go to the owner's ``inbox``, which its poll reads: a lost message costs one poll.
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
import hashlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from ._lease_keeper import LocalEntries, SharedCoordinator, StoreView, Withdrawn
from ._lua import load_script
from ._protocol import AdmissionSnapshot, StoreUnavailable, new_id
from ._redis_conn import Client, Target, cluster_prefix, open_client, parse_target
from ._redis_values import UNREACHABLE as _UNREACHABLE
from ._redis_values import RedisValues, listen
from ._rule import INTERACTIVE, RANK
from ._store_layout import (
    LAYOUT_SCRIPT,
    REDIS_LAYOUT,
    StoreRefused,
    eviction_problem,
    layout_problem,
    report_eviction,
)

_log = logging.getLogger("spacepool.admission")

# "gone" is last on purpose: other keys may be added before it (KEYS[10] in the script).
_KEYS = (
    "meta", "limits", "held", "queue", "waiters", "leases", "lanes", "park", "spot", "cwait",
    "wake", "aging", "owners", "owned", "inbox", "qcount", "gone",
)  # fmt: skip
_OPS_PER_RUN = 32  # operations per script run at most: Redis runs one script at a time
_CHUNK = 256  # ids per script run in a restore, a drop or a check (none runs over all)

_SCRIPT = load_script("admission.lua")


class RedisCoordinator(SharedCoordinator):
    """Admission shared by every process and host that uses one Redis (and prefix)."""

    def __init__(
        self,
        url: str,
        *,
        lease_ttl_s: float = 15.0,
        ca_file: str | None = None,
        allow_evicting_store: bool = False,
    ) -> None:
        base_url, prefix, poll_s, timeout_s = _parse_url(url)
        store = _RedisStore(
            base_url,
            owner=new_id(),
            lease_ttl_s=lease_ttl_s,
            prefix=prefix,
            poll_interval_s=poll_s,
            timeout_s=timeout_s,
            ca_file=ca_file,
            allow_evicting_store=allow_evicting_store,
        )
        self._store = store
        super().__init__(store, lease_ttl_s=lease_ttl_s)

    @property
    def prefix(self) -> str:
        """The keys' prefix (with its hash tag on a cluster)."""
        return self._store.prefix


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
    positions_per_poll = 64  # our waiters whose positions one poll refreshes, in turn
    positions_every_s = 0.0  # at every poll

    def __init__(
        self,
        url: str,
        *,
        owner: str,
        lease_ttl_s: float,
        prefix: str,
        poll_interval_s: float,
        timeout_s: float,
        ca_file: str | None = None,
        allow_evicting_store: bool = False,
    ) -> None:
        self.poll_interval_s = poll_interval_s
        target = parse_target(url)
        self._target = target
        self._where = target.where
        self._owner = owner
        self._ttl_ms = max(1, round(lease_ttl_s * 1000))
        self._timeout_s, self._lease_ttl_s, self._ca_file = timeout_s, lease_ttl_s, ca_file
        self._client: Client
        self._client, self._close_client = self._open(target)
        self._cluster = target.kind == "cluster"
        self._given_prefix = prefix
        self._allow_evicting = allow_evicting_store
        self._checked = False
        self._refused: StoreRefused | None = None
        self._check_lock = asyncio.Lock()
        self._sha = hashlib.sha1(_SCRIPT.encode()).hexdigest()
        self._batch: list[tuple[list[str | int | float], asyncio.Future[list[Any]]]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._use_prefix()
        self.last_work = 0  # the work of the last script run (commands + elements)
        self._epoch = ""
        self._restoring = False
        self._lost_contact = False  # we may have missed an epoch while Redis was away
        self._limits_set: dict[str, int] = {}
        self._secret: str | None = None
        self._local: LocalEntries | None = None
        self._closed = False
        self.values = RedisValues(
            self._client, self.prefix, where=self._where, closed=lambda: self._closed,
            ready=self._check,
        )  # fmt: skip

    def _open(self, target: Target) -> tuple[Client, Callable[[], Awaitable[None]]]:
        return open_client(target, timeout_s=self._timeout_s, lease_ttl_s=self._lease_ttl_s,
                           ca_file=self._ca_file)  # fmt: skip

    def _use_prefix(self) -> None:
        """The one place the key prefix is decided: every key and channel is under it."""
        given = self._given_prefix
        self.prefix = cluster_prefix(given) if self._cluster else given
        self._keys = [self.prefix + k for k in _KEYS]
        self._channels = self.prefix + "grants:"

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
            await self._client.script_load(_SCRIPT)  # on a cluster: every master
            if not self._restoring:  # maybe from an older snapshot: re-register first
                await self._restore()
            for i, reply in zip(missing, await self._send([runs[i] for i in missing]),
                                strict=True):
                replies[i] = reply
        out: list[Any] = []
        for run, reply in zip(runs, replies, strict=True):
            results = reply if isinstance(reply, Exception) else json.loads(reply)
            if isinstance(results, list) and results and isinstance(results[-1], int):
                self.last_work = results.pop()  # the run's work, last (see admission.lua)
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

    # -- the checks at the first call: layout version, eviction -----------------------------
    async def _check(self) -> None:
        """Once, before the first call: refuse (:class:`StoreRefused`) a store of
        another layout or one that evicts keys; unreachable: tried again next call."""
        if self._checked:
            return
        if self._closed:  # a late call must not reconnect a closed client
            raise StoreUnavailable(f"redis {self._where}: store closed")
        async with self._check_lock:
            if self._refused is not None:
                raise self._refused
            if self._checked:
                return
            try:
                await self._check_once()
            except StoreRefused as exc:
                self._refused = exc
                raise
            except _UNREACHABLE as exc:
                raise StoreUnavailable(f"redis {self._where}: {exc}") from exc
            self._checked = True

    async def _check_once(self) -> None:
        if not self._cluster and self._target.kind == "single":
            cluster = await self._info("cluster")
            if int(cluster.get("cluster_enabled", 0) or 0):
                await self._become_cluster()
        where = f"redis {self._where} (prefix {self.prefix!r})"
        if isinstance(self._client, RedisCluster):
            by_node = await self._info("memory", target_nodes=RedisCluster.PRIMARIES)
            infos = [i for i in by_node.values() if isinstance(i, dict)]
        else:
            infos = [await self._info("memory")]
        if not any("maxmemory_policy" in info for info in infos):
            _log.warning("%s: INFO memory does not say maxmemory-policy; make sure it is"
                         " noeviction (an evicted lease breaks the cap)", where)  # fmt: skip
        report_eviction(eviction_problem(infos, where), allow=self._allow_evicting)
        await self._claim_layout(claim=False)

    async def _info(self, section: str, **kwargs: Any) -> dict[str, Any]:
        """``INFO section``; empty where the server does not let us read it (ACL)."""
        try:
            return await self._client.info(section, **kwargs)
        except ResponseError as exc:
            if isinstance(exc, _UNREACHABLE):
                raise
            _log.debug("redis %s: INFO %s refused: %s", self._where, section, exc)
            return {}

    async def _become_cluster(self) -> None:
        """A plain URL names a Redis Cluster node: go on with the cluster client, started
        from that node, and a prefix in one hash slot (before anything else is sent)."""
        parts = urlsplit(self._target.url)
        if parts.hostname is None:  # unix://
            raise StoreRefused(f"redis {self._where}: a cluster node, use redis+cluster://")
        cluster = Target(
            "cluster", self._target.url, self._where, tls=self._target.tls,
            nodes=((parts.hostname, parts.port or 6379),), username=parts.username,
            password=parts.password,
        )  # fmt: skip
        old_close = self._close_client
        self._client, self._close_client = self._open(cluster)
        await old_close()
        self._cluster = True
        self._use_prefix()
        self.values.rebind(self._client, self.prefix)
        _log.info("redis %s is a Redis Cluster node: using the cluster client, keys under %r",
                  self._where, self.prefix)  # fmt: skip

    async def _claim_layout(self, *, claim: bool) -> None:
        """Read the store's layout version, recording ours where it has none (with
        ``claim``, also over an unversioned store that has state: a process that
        passed the check does so after the store was reset under it)."""
        try:
            found = await self._client.eval(
                LAYOUT_SCRIPT, 2, self.prefix + "layout", self.prefix + "meta",
                REDIS_LAYOUT, "1" if claim else "0",
            )  # fmt: skip
        except _UNREACHABLE as exc:
            raise StoreUnavailable(f"redis {self._where}: {exc}") from exc
        where = f"redis {self._where} (prefix {self.prefix!r})"
        problem = layout_problem(str(found), REDIS_LAYOUT, where)
        if problem is not None:
            raise StoreRefused(problem)

    async def _call(self, op: str, *args: str | int | float, owner: str | None = None) -> list[Any]:
        if not self._checked:
            await self._check()
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
        """Re-register our limits, leases and waiters (in that order), ``_CHUNK`` ids
        per script run: the first run settles the epoch, the others name it."""
        # The store may have been reset under us: record the layout again first. If a
        # process of another layout got there first, this one stops admitting (503s and
        # an error in the log) rather than mix with it.
        try:
            await self._claim_layout(claim=True)
        except StoreRefused as exc:
            _log.error("%s", exc)
            raise StoreUnavailable(str(exc)) from exc
        leases, waiters = self._local.local_entries() if self._local else ([], [])
        # "?" for a client that never saw an epoch but lost contact: it cannot vouch
        # that the store was not reset while it was away, so it asks for a quarantine.
        seen = self._epoch or ("?" if self._lost_contact else "")
        entries = [(0, e) for e in leases] + [(1, e) for e in waiters]
        chunks = [entries[i : i + _CHUNK] for i in range(0, len(entries), _CHUNK)] or [[]]
        refused: list[str] = []
        epoch = ""
        for number, chunk in enumerate(chunks):
            args: list[str | int | float] = [seen, new_id(), self._ttl_ms, self._secret or ""]
            limits = self._limits_set if number == 0 else {}
            args.append(len(limits))
            for name, limit in limits.items():
                args += [name, limit]
            for kind in (0, 1):
                part = [e for k, e in chunk if k == kind]
                args.append(len(part))
                for key, resources in part:
                    args += [key, json.dumps(list(resources))]
            reply = await self._eval("restore", self._owner, args)
            epoch = str(reply[1])
            seen = epoch  # the later chunks: the same store, no new quarantine
            refused += [str(key) for key in reply[2]]
        self._lost_contact = False
        if (self._epoch and epoch != self._epoch) or refused:
            _log.warning(
                "redis admission store %s was reset; re-registered %d lease(s) (%d refused: "
                "their slots were given away), %d waiter(s)",
                self._where, len(leases) - len(refused), len(refused), len(waiters),
            )
        self._epoch = epoch
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

    async def poll(self, told: Sequence[str]) -> StoreView:
        """Grants we missed (our inbox in the store) and the positions of ``told``: the
        coordinator names the next ``positions_per_poll`` of our waiters each poll, so a
        position is at most (our waiters / 64) polls old (an upper bound: the queue
        only moves forward), and no script runs over all of our waiters."""
        return _view(await self._call("poll", *told))

    async def renew(self, held: int, held_ids: Callable[[], Sequence[str]]) -> set[str]:
        """One renewal of our own liveness, whatever we hold (``held`` only counted).

        The store counts the entries it holds for us; only when it holds fewer than
        ``held`` (an older snapshot, a reset, our deadline passed) are our ids checked,
        a chunk per script run, and our live leases re-registered."""
        reply = await self._call("renew", self._ttl_ms, held)
        if reply[1] and int(reply[2]) >= held:
            return set()
        ids = held_ids()
        missing = await self._missing(ids)
        live = {key for key, _ in self._local.local_entries()[0]} if self._local else set()
        if missing & live:  # a live lease the store forgot (an older snapshot): restore
            await self._restore()
            missing = await self._missing(sorted(missing))
        return missing

    async def _missing(self, ids: Sequence[str]) -> set[str]:
        missing: set[str] = set()
        for i in range(0, len(ids), _CHUNK):
            missing.update((await self._call("check", *ids[i : i + _CHUNK]))[1])
        return missing

    async def drop(self, ids: Sequence[str]) -> None:
        for i in range(0, len(ids), _CHUNK):
            await self._call("drop", *ids[i : i + _CHUNK])

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
        """The one grant subscriber of this process; reconnects by itself, forever."""
        failures = 0
        while True:  # on the client and channel the first call's checks settle
            try:
                await self._check()
                break
            except StoreUnavailable:
                failures += 1
                await asyncio.sleep(min(1.0, 0.05 * 2**failures))
            except StoreRefused:
                return  # every call of this process says why
        await listen(
            self._client, self._channels + self._owner, lambda data: on_grant(data.split(",")),
            on_resume, where=self._where,
        )  # fmt: skip

    async def close(self) -> None:
        """Close every connection (the subscriber's went with its task); no reconnects."""
        self._closed = True
        await self.values.aclose()
        if self._flushes:  # calls already sent: let them finish on their connections
            await asyncio.gather(*self._flushes, return_exceptions=True)
        await self._close_client()


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
