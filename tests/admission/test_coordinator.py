"""The admission contract (SPEC 4.5), pinned once and run against every store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from pool import BusyError, MisuseError, PoolClosedError
from pool.admission import CONSUMER_PREFIX, Coordinator, Lease, open_coordinator, plan_grants
from pool.admission._memory import MemoryCoordinator
from pool.admission._rule import limit_lookup

from .conftest import Opener
from .helpers import GLOBAL, queue, settle, until_async

A, B = "space:a", "space:b"


async def test_never_more_holders_than_the_limit(coord: Coordinator) -> None:
    """Safety: with 20 tasks cycling, a resource never has more holders than its limit."""
    await coord.set_limits({GLOBAL: 3})
    inside = peak = done = 0

    async def worker() -> None:
        nonlocal inside, peak, done
        for _ in range(5):
            lease = await coord.acquire([GLOBAL], timeout=30)
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0)
            inside -= 1
            await coord.release(lease)
            done += 1

    await asyncio.gather(*(worker() for _ in range(20)))
    assert peak <= 3
    assert done == 100
    assert (await coord.snapshot()).held == {}


async def test_a_full_resource_times_out_the_next_request(coord: Coordinator) -> None:
    """Up to the limit is granted at once; one more waits and times out."""
    await coord.set_limits({GLOBAL: 2})
    leases = [await coord.acquire([GLOBAL], timeout=0) for _ in range(2)]
    with pytest.raises(BusyError):
        await coord.acquire([GLOBAL], timeout=0.05)
    for lease in leases:
        await coord.release(lease)


async def test_a_waiter_holds_nothing_until_it_holds_everything(coord: Coordinator) -> None:
    """All-or-nothing: a waiter short of one resource holds none, and claims nothing on
    the resources that do not block it (the work-conserving rule, issue 18)."""
    await coord.set_limits({A: 1, B: 1})
    b = await coord.acquire([B], timeout=1)
    both, _ = await queue(coord, [A, B])
    snap = await coord.snapshot()
    assert snap.held == {B: 1}
    assert snap.queued == {A: 1, B: 1}
    only_a = await coord.acquire([A], timeout=0)  # A is free and the waiter is blocked on B
    await coord.release(b)
    await settle()
    assert not both.done(), "B is free now, but A is not: still nothing held"
    assert (await coord.snapshot()).held == {A: 1}
    await coord.release(only_a)
    lease = await both
    assert (await coord.snapshot()).held == {A: 1, B: 1}
    await coord.release(lease)


async def test_waiters_are_served_in_arrival_order(coord: Coordinator) -> None:
    """FIFO: a freed slot goes to the oldest waiter; the next one keeps waiting."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    first, t1 = await queue(coord, [GLOBAL])
    second, t2 = await queue(coord, [GLOBAL])
    assert (t1.position, t2.position) == (1, 2)
    await coord.release(holder)
    lease1 = await first
    await settle()
    assert not second.done()
    await coord.release(lease1)
    await coord.release(await second)


async def test_a_later_waiter_never_takes_a_slot_an_earlier_one_is_short_of(
    coord: Coordinator,
) -> None:
    """FIFO per resource: the head waiter's missing resource is reserved for it."""
    await coord.set_limits({GLOBAL: 3, A: 1})
    holder = await coord.acquire([GLOBAL, A], timeout=1)
    early, _ = await queue(coord, [GLOBAL, A])
    late, _ = await queue(coord, [GLOBAL, A])
    await coord.release(holder)
    lease = await early
    await settle()
    assert not late.done()
    await coord.release(lease)
    await coord.release(await late)


async def test_free_slots_of_other_resources_are_used(coord: Coordinator) -> None:
    """Work-conserving (a): a waiter blocked by its Space holds no global slot, so other
    Spaces use every free one; the Space's release then serves it (property (c))."""
    await coord.set_limits({GLOBAL: 3, A: 1})
    holder = await coord.acquire([GLOBAL, A], timeout=1)
    waiting_a, _ = await queue(coord, [GLOBAL, A])  # short of A only
    others = [await coord.acquire([GLOBAL, B], timeout=0) for _ in range(2)]
    with pytest.raises(BusyError):  # the global resource is full now
        await coord.acquire([GLOBAL, B], timeout=0)
    assert not waiting_a.done()
    await coord.release(holder)  # frees A and a global slot together
    lease = await waiting_a
    assert (await coord.snapshot()).held == {GLOBAL: 3, A: 1, B: 2}
    for done in [*others, lease]:
        await coord.release(done)


async def test_a_consumer_at_its_own_limit_does_not_delay_others(coord: Coordinator) -> None:
    """No monopoly: a waiter blocked only by its consumer limit lets other consumers pass."""
    x, y = CONSUMER_PREFIX + "x", CONSUMER_PREFIX + "y"
    await coord.set_limits({GLOBAL: 2, CONSUMER_PREFIX: 1})
    x1 = await coord.acquire([GLOBAL, x], timeout=1)
    x2, ticket = await queue(coord, [GLOBAL, x])
    y1 = await coord.acquire([GLOBAL, y], timeout=0)  # later, yet served at once
    assert ticket.position == 1 and not x2.done()
    await coord.release(y1)
    await settle()
    assert not x2.done()  # still blocked by its own consumer slot only
    await coord.release(x1)
    await coord.release(await x2)


async def test_timeout_raises_busy_with_queue_position(coord: Coordinator) -> None:
    """A bounded wait ends in BusyError carrying the position held and a retry estimate."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    first, _ = await queue(coord, [GLOBAL])
    with pytest.raises(BusyError) as caught:
        await coord.acquire([GLOBAL], timeout=0.1)
    assert caught.value.queue_position == 2
    assert caught.value.reason == "queue_timeout"
    assert caught.value.retry_after_s > 0
    assert (await coord.snapshot()).waiting == 1  # the timed-out entry is gone
    await coord.release(holder)
    await coord.release(await first)


async def test_cancelled_waiter_leaves_no_entry(coord: Coordinator) -> None:
    """Cancelling a waiter removes it from the store; the next release finds nobody."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    task, _ = await queue(coord, [GLOBAL])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    snap = await coord.snapshot()
    assert (snap.waiting, snap.queued) == (0, {})
    await coord.release(holder)
    assert (await coord.snapshot()).held == {}


async def test_slot_handed_to_a_cancelled_waiter_is_passed_on(coord: Coordinator) -> None:
    """A waiter cancelled right after being granted gives the slot to the next waiter."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    first, _ = await queue(coord, [GLOBAL])
    second, _ = await queue(coord, [GLOBAL])
    await coord.release(holder)  # grants `first`, which has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    lease = await second
    assert (await coord.snapshot()).held == {GLOBAL: 1}
    await coord.release(lease)


async def test_memory_slot_granted_to_a_waiter_cancelled_before_it_ran_is_passed_on() -> None:
    """Memory store: a waiter's future is cancelled with its task; a pass that reaches
    it before the task ran its exit passes the slot on."""
    coord = MemoryCoordinator()
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    first, _ = await queue(coord, [GLOBAL])
    second, _ = await queue(coord, [GLOBAL])
    first.cancel()  # its task has not run yet: still queued in the store
    await coord.release(holder)  # the pass meets `first` first
    with pytest.raises(asyncio.CancelledError):
        await first
    lease = await second
    assert (await coord.snapshot()).held == {GLOBAL: 1}
    await coord.release(lease)
    await coord.aclose()


async def test_memory_waiters_timing_out_together_all_end_busy() -> None:
    """Memory store: one timer holds every deadline; 600 waiters due at once all end in
    BusyError (a bounded number per loop iteration) and leave nothing queued."""
    coord = MemoryCoordinator()
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    waiting = [asyncio.create_task(coord.acquire([GLOBAL], timeout=0.1)) for _ in range(600)]
    ended = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(e, BusyError) and e.queue_position >= 1 for e in ended)
    snap = await coord.snapshot()
    assert (snap.held, snap.waiting, snap.queued) == ({GLOBAL: 1}, 0, {})
    await coord.release(holder)
    await coord.aclose()


async def test_double_release_raises(coord: Coordinator) -> None:
    """Releasing a lease twice is a programming error."""
    lease = await coord.acquire([GLOBAL], timeout=1)
    await coord.release(lease)
    with pytest.raises(MisuseError):
        await coord.release(lease)


async def test_release_through_another_coordinator_raises(
    coord: Coordinator, store_url: str, open_store: Opener
) -> None:
    """Only the coordinator that granted a lease may release it."""
    other = open_store(store_url)
    lease = await coord.acquire([GLOBAL], timeout=1)
    with pytest.raises(MisuseError):
        await other.release(lease)
    await coord.release(lease)


async def test_raising_a_limit_admits_waiters_at_once(coord: Coordinator) -> None:
    """set_limits takes effect immediately: a higher limit grants the queued waiter."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    waiter, _ = await queue(coord, [GLOBAL])
    await coord.set_limits({GLOBAL: 2})
    lease = await waiter
    await coord.set_limits({GLOBAL: 1})
    with pytest.raises(BusyError):  # lowered: two holders, limit one
        await coord.acquire([GLOBAL], timeout=0.05)
    await coord.release(holder)
    with pytest.raises(BusyError):  # still at the limit with one holder
        await coord.acquire([GLOBAL], timeout=0.05)
    await coord.release(lease)
    await coord.release(await coord.acquire([GLOBAL], timeout=0))


async def test_prefix_limit_applies_to_each_consumer(coord: Coordinator) -> None:
    """A "consumer:" limit bounds every consumer:<hash> separately."""
    await coord.set_limits({CONSUMER_PREFIX: 1})
    x = await coord.acquire([CONSUMER_PREFIX + "x"], timeout=0)
    y = await coord.acquire([CONSUMER_PREFIX + "y"], timeout=0)
    with pytest.raises(BusyError):
        await coord.acquire([CONSUMER_PREFIX + "x"], timeout=0.05)
    for lease in (x, y):
        await coord.release(lease)


async def test_zero_timeout_is_one_attempt(coord: Coordinator) -> None:
    """timeout=0 grants when there is room and fails at once when there is none."""
    await coord.set_limits({GLOBAL: 1})
    lease = await coord.acquire([GLOBAL], timeout=0)
    with pytest.raises(BusyError) as caught:
        await coord.acquire([GLOBAL], timeout=0)
    assert caught.value.queue_position == 1
    await coord.release(lease)


async def test_snapshot_counts_holders_waiters_and_limits(coord: Coordinator) -> None:
    """snapshot() reports per-resource holders, queued waiters, limits and the store."""
    await coord.set_limits({GLOBAL: 2, A: 1})
    held = [await coord.acquire([GLOBAL, A], timeout=1), await coord.acquire([GLOBAL], timeout=1)]
    waiter, _ = await queue(coord, [GLOBAL, A])
    snap = await coord.snapshot()
    assert snap.held == {GLOBAL: 2, A: 1}
    assert snap.queued == {GLOBAL: 1, A: 1}
    assert snap.limits == {GLOBAL: 2, A: 1}
    assert snap.waiting == 1
    assert snap.store == coord.store
    assert snap.reachable
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for lease in held:
        await coord.release(lease)


async def test_wait_ticket_reports_position_and_estimate(coord: Coordinator) -> None:
    """A WaitTicket shows the waiter's place in the queue and a wait estimate."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    first, t1 = await queue(coord, [GLOBAL])
    second, t2 = await queue(coord, [GLOBAL])
    assert (t1.position, t2.position) == (1, 2)
    assert 0 < t1.estimate_s <= t2.estimate_s
    for task in (first, second):
        task.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    await coord.release(holder)


async def test_a_wait_ticket_signals_its_changes(coord: Coordinator) -> None:
    """A reader awaiting ``changed()`` wakes when the store moves the waiter up (no
    polling); a ticket set to what it already holds wakes nobody."""
    await coord.set_limits({GLOBAL: 1})
    holder = await coord.acquire([GLOBAL], timeout=1)
    first, _ = await queue(coord, [GLOBAL])
    second, t2 = await queue(coord, [GLOBAL])
    assert t2.position == 2
    moved = asyncio.create_task(t2.changed())
    await asyncio.sleep(0.05)
    assert not moved.done()
    first.cancel()  # the waiter ahead leaves: the second is next
    async with asyncio.timeout(10):
        await moved
        while t2.position != 1:  # a store may announce it in more than one change
            await t2.changed()
    same = asyncio.create_task(t2.changed())
    t2.update(position=t2.position)
    await asyncio.sleep(0.05)
    assert not same.done()
    same.cancel()
    second.cancel()
    await asyncio.gather(first, second, same, return_exceptions=True)
    await coord.release(holder)


def test_a_waiter_blocked_by_its_space_takes_no_global_place() -> None:
    """plan_grants: W1 is blocked by its Space only and claims nothing on the global
    resource; W3 and W4 of another Space take the free global slots (property (a))."""
    limits = {GLOBAL: 4, A: 1, B: 5, CONSUMER_PREFIX: 1}
    held = {GLOBAL: 2, A: 1, B: 1, CONSUMER_PREFIX + "x": 1, CONSUMER_PREFIX + "y": 1}
    waiters = [
        ("w1", (GLOBAL, A, CONSUMER_PREFIX + "c"), (0, 1)),
        ("w3", (GLOBAL, B, CONSUMER_PREFIX + "c"), (0, 3)),
        ("w4", (GLOBAL, B, CONSUMER_PREFIX + "d"), (0, 4)),
        ("w5", (GLOBAL, B, CONSUMER_PREFIX + "e"), (0, 5)),
    ]
    limit_of = limit_lookup(limits)
    lanes = [[w for w in waiters if w[1][1] == space] for space in (A, B)]
    assert plan_grants(lanes, held, limit_of) == ["w3", "w4"]
    # W3 batch: the interactive W4 and W5, though later, rank first and take both
    batch = sorted(((k, r, (int(k == "w3"), o[1])) for k, r, o in waiters[1:]),
                   key=lambda w: w[2])  # fmt: skip
    assert plan_grants([batch], held, limit_of) == ["w4", "w5"]


async def test_a_waiter_whose_consumer_fills_up_gives_its_place_away(coord: Coordinator) -> None:
    """Every store: a pass that fills a place-holding waiter's consumer hands that
    waiter's global place on at once, not after a timeout."""
    cx, cy, cc, cd = (CONSUMER_PREFIX + n for n in "xycd")
    await coord.set_limits({GLOBAL: 2, A: 1, B: 5, CONSUMER_PREFIX: 1})
    held = [await coord.acquire(r, timeout=1) for r in ([GLOBAL, A, cx], [GLOBAL, B, cy])]
    w1, _ = await queue(coord, [GLOBAL, A, cc])
    w3, _ = await queue(coord, [GLOBAL, B, cc])
    w4, _ = await queue(coord, [GLOBAL, B, cd])
    await coord.set_limits({GLOBAL: 4})  # one pass over W1, W3, W4, in this process
    await settle()
    assert w3.done() and w4.done(), "W4 was granted by the same pass, not a later poll"
    leases = [w3.result(), w4.result()]
    assert not w1.done()
    assert (await coord.snapshot()).held[GLOBAL] == 4
    w1.cancel()
    await asyncio.gather(w1, return_exceptions=True)
    for lease in [*held, *leases]:
        await coord.release(lease)


async def test_shared_secret_is_32_stable_bytes(coord: Coordinator) -> None:
    """shared_secret() is a 32-byte key that does not change between calls."""
    secret = await coord.shared_secret()
    assert len(secret) == 32
    assert await coord.shared_secret() == secret


async def test_shared_values_expire_and_list_by_prefix(coord: Coordinator) -> None:
    """values.put/get/scan/delete: a small TTL'd map for the whole fleet."""
    values = coord.values
    await values.put("proc:a", "1", ttl_s=30)
    await values.put("proc:b", "", ttl_s=30)
    await values.put("other", "3", ttl_s=30)
    await values.put("proc:short", "4", ttl_s=0.05)
    assert await values.get("proc:a") == "1"
    assert await values.get("proc:b") == ""
    assert await values.get("missing") is None
    await values.put("proc:a", "2", ttl_s=30)
    await until_async(
        lambda: _equals(values.scan("proc:"), {"proc:a": "2", "proc:b": ""}),
        what="the short-lived value to expire",
    )
    await values.delete("proc:a")
    assert await values.get("proc:a") is None
    assert await values.scan("") == {"other": "3"}


async def test_a_scan_reads_one_namespace_and_filters_by_the_rest_of_the_prefix(
    coord: Coordinator,
) -> None:
    """Keys are grouped by namespace (text up to the first colon): a scan returns
    only its namespace's keys that start with the whole prefix."""
    values = coord.values
    for key in ("job:a1", "job:a2", "job:b1", "jobcancel:a1", "jobs:a1", "job"):
        await values.put(key, key.upper(), ttl_s=30)
    assert await values.scan("job:") == {"job:a1": "JOB:A1", "job:a2": "JOB:A2", "job:b1": "JOB:B1"}
    assert await values.scan("job:a") == {"job:a1": "JOB:A1", "job:a2": "JOB:A2"}
    assert await values.scan("jobcancel:") == {"jobcancel:a1": "JOBCANCEL:A1"}
    assert await values.scan("") == {"job": "JOB"}
    await values.delete("job:a1")
    assert await values.scan("job:a") == {"job:a2": "JOB:A2"}
    assert await values.get("jobcancel:a1") == "JOBCANCEL:A1"


async def _equals(result: Awaitable[dict[str, str]], expected: dict[str, str]) -> bool:
    return await result == expected


# -- stores shared by several processes ------------------------------------------------------


async def test_every_process_reads_the_same_secret(shared_url: str, open_store: Opener) -> None:
    """Two processes on one store get the same secret key."""
    first, second = open_store(shared_url), open_store(shared_url)
    assert await first.shared_secret() == await second.shared_secret()


async def test_limits_and_holders_are_fleet_wide(shared_url: str, open_store: Opener) -> None:
    """A limit set by one process binds the others, and their holders add up."""
    first, second = open_store(shared_url), open_store(shared_url)
    await first.set_limits({GLOBAL: 2})
    leases = [await first.acquire([GLOBAL], timeout=1), await second.acquire([GLOBAL], timeout=1)]
    with pytest.raises(BusyError):
        await second.acquire([GLOBAL], timeout=0.05)
    assert (await first.snapshot()).held == {GLOBAL: 2}
    await first.release(leases[0])
    await second.release(leases[1])


async def test_slot_freed_by_another_process_reaches_the_waiter(
    shared_url: str, open_store: Opener
) -> None:
    """A grant made by another process's release wakes the waiter, FIFO across processes."""
    first, second = open_store(shared_url), open_store(shared_url)
    await first.set_limits({GLOBAL: 1})
    holder = await first.acquire([GLOBAL], timeout=1)
    remote, _ = await queue(second, [GLOBAL])
    local, _ = await queue(first, [GLOBAL])
    await first.release(holder)  # first's own waiter is later: the slot goes to `second`
    lease = await asyncio.wait_for(remote, 5)
    assert not local.done()
    await second.release(lease)
    await first.release(await asyncio.wait_for(local, 5))


async def test_close_frees_leases_and_queue_entries(shared_url: str, open_store: Opener) -> None:
    """aclose() returns this process's slots and removes its waiters for everyone."""
    leaving, staying = open_store(shared_url), open_store(shared_url)
    await staying.set_limits({GLOBAL: 1})
    await leaving.acquire([GLOBAL], timeout=1)
    waiter, _ = await queue(leaving, [GLOBAL])
    await leaving.aclose()
    with pytest.raises(PoolClosedError):
        await waiter
    snap = await staying.snapshot()
    assert (snap.held, snap.waiting) == ({}, 0)
    await staying.release(await staying.acquire([GLOBAL], timeout=0))


async def test_release_after_close_is_quiet(shared_url: str) -> None:
    """A lease released after its coordinator closed is marked released, no error."""
    coordinator = open_coordinator(shared_url, lease_ttl_s=2)
    lease = await coordinator.acquire([GLOBAL], timeout=1)
    await coordinator.aclose()
    await coordinator.release(lease)
    assert lease.released


async def test_heartbeat_keeps_leases_and_waiters_past_their_ttl(
    shared_url: str, open_store: Opener
) -> None:
    """The heartbeat keeps a long-held lease and a long wait alive past lease_ttl."""
    # A TTL of 1.2 s beats every 0.4 s: a stall of ~0.8 s (the loaded CI machine's
    # scheduler) is tolerated, where 0.6 s once lost the lease under heavy load.
    holder = open_store(shared_url, lease_ttl_s=1.2)
    observer = open_store(shared_url)
    await holder.set_limits({GLOBAL: 1})
    lease: Lease = await holder.acquire([GLOBAL], timeout=1)
    waiter, _ = await queue(holder, [GLOBAL])
    await asyncio.sleep(3.0)  # the behaviour under test is the passing of time: 2.5 TTLs
    snap = await observer.snapshot()
    assert (snap.held, snap.waiting) == ({GLOBAL: 1}, 1)
    await holder.release(lease)
    await holder.release(await waiter)


def without_polling(url: str) -> str:
    """The same store, for a coordinator that never polls (grants found only on exit)."""
    return url + ("&" if "?" in url else "?") + "poll_ms=600000"


async def test_grant_found_when_the_wait_times_out_is_kept(
    shared_url: str, open_store: Opener
) -> None:
    """A grant that landed before the waiter noticed it is returned, not a BusyError."""
    holder = open_store(shared_url)
    slow = open_store(without_polling(shared_url))
    await holder.set_limits({GLOBAL: 1})
    held = await holder.acquire([GLOBAL], timeout=1)
    waiter, _ = await queue(slow, [GLOBAL], timeout=0.5)
    await holder.release(held)  # granted in the store; `slow` learns it at its timeout
    lease = await waiter
    assert (await holder.snapshot()).held == {GLOBAL: 1}
    await slow.release(lease)


async def test_grant_found_when_the_waiter_is_cancelled_is_passed_on(
    shared_url: str, open_store: Opener
) -> None:
    """A waiter cancelled after an unnoticed grant frees the slot again."""
    holder = open_store(shared_url)
    slow = open_store(without_polling(shared_url))
    await holder.set_limits({GLOBAL: 1})
    held = await holder.acquire([GLOBAL], timeout=1)
    waiter, _ = await queue(slow, [GLOBAL])
    await holder.release(held)
    if waiter.cancel():
        with pytest.raises(asyncio.CancelledError):
            await waiter
    else:  # Redis pushed the grant before we could cancel: plain release
        await slow.release(waiter.result())
    snap = await holder.snapshot()
    assert (snap.held, snap.waiting) == ({}, 0)
