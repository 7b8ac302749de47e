"""The one ownership mechanism (``pool/admission/_ownership.py``): fenced writes of an
owned record, the takeover that raises the token, liveness, the heartbeat's rhythm."""

from __future__ import annotations

import asyncio
import json

import pytest

from pool.admission import Coordinator
from pool.admission._ownership import (
    Heartbeat,
    Holder,
    Owners,
    reclaimable,
    taken_over,
    write_fenced,
)


def _record(owner: str, fence: int, stage: str = "running") -> str:
    return json.dumps({"owner": owner, "fence": fence, "stage": stage})


def _closed(held: object) -> bool:
    return isinstance(held, dict) and held.get("stage") == "done"


async def test_a_stale_owner_is_fenced_after_a_takeover(coord: Coordinator) -> None:
    """A writes its record; B takes it over (token 1): A's next write is refused, B's
    goes through, and once closed nobody writes it, not even B."""
    values = coord.values
    a, b = Holder("a", 0), Holder("b", 1)
    assert await write_fenced(values, "job:x", _record("a", 0), a, ttl_s=30, closed=_closed)
    assert await write_fenced(values, "job:x", _record("b", 1), a, ttl_s=30, closed=_closed)
    assert not await write_fenced(values, "job:x", _record("a", 0, "done"), a, ttl_s=30,
                                  closed=_closed)  # fmt: skip
    stored = json.loads(await values.get("job:x") or "{}")
    assert taken_over(stored, a) and not taken_over(stored, b)
    assert await write_fenced(values, "job:x", _record("b", 1, "done"), b, ttl_s=30,
                              closed=_closed)  # fmt: skip
    assert not await write_fenced(values, "job:x", _record("b", 1), b, ttl_s=30, closed=_closed)


async def test_the_same_owner_with_an_old_token_is_fenced(coord: Coordinator) -> None:
    """The token, not the owner's name, decides: a worker that took its own record
    over (token 2) refuses its older self (token 1)."""
    values = coord.values
    await write_fenced(values, "job:y", _record("a", 2), Holder("a", 1), ttl_s=30,
                       closed=_closed)  # fmt: skip
    assert not await write_fenced(values, "job:y", _record("a", 1), Holder("a", 1), ttl_s=30,
                                  closed=_closed)  # fmt: skip


async def test_liveness_lasts_one_ttl_after_the_last_beat(coord: Coordinator) -> None:
    """An owner is alive while it beats and gone one TTL after its last beat."""
    owners = Owners(lambda: coord.values, "jobowner:", "w1", ttl_s=0.3)
    await owners.beat()
    assert await owners.alive() == {"w1"}
    await asyncio.sleep(0.5)  # the behaviour under test is the passing of time
    assert await owners.alive() == set()


@pytest.mark.parametrize(
    ("owner", "deadline", "expected"),
    [
        ("me", 100.0, (False, False)),  # mine, in time
        ("other", 100.0, (False, False)),  # alive
        ("ghost", 100.0, (True, False)),  # its heartbeat is gone
        ("me", 80.0, (True, True)),  # past its deadline by more than a TTL: anyone's
        ("other", 89.5, (False, False)),  # past its deadline, within a TTL
    ],
)
def test_reclaimable(owner: str, deadline: float, expected: tuple[bool, bool]) -> None:
    """A record is taken when its owner is gone, or past its deadline by a TTL."""
    got = reclaimable(owner, deadline, me="me", alive={"me", "other"}, ttl_s=10.0, now=99.0)
    assert got == expected


async def test_heartbeat_retries_soon_after_a_failure() -> None:
    """After a failed beat the next comes after a third of the period (at most 0.5 s);
    after a successful one, a whole period after it started."""
    delays: list[float] = []

    async def sleep(delay: float) -> None:  # records the rhythm instead of waiting
        delays.append(delay)

    rhythm = Heartbeat(ttl_s=6.0, sleep=sleep)  # period 2 s, retry 0.5 s (capped)
    beats = 0

    async def beat() -> None:
        nonlocal beats
        beats += 1
        if beats == 1:
            raise OSError("store away")
        if beats == 3:
            raise asyncio.CancelledError

    failures: list[Exception] = []
    with pytest.raises(asyncio.CancelledError):
        await rhythm.run(beat, failed=failures.append, errors=(OSError,), first_now=True)
    assert len(failures) == 1
    assert delays[:2] == [0.0, 0.5]
    assert 1.9 < delays[2] <= 2.0, delays
