"""Files are their team's (issue 38, F10 and item 1): a file kept under one API key is
unknown to another key and to callers without one, and when the store is over
``POOL_FILE_MAX_TOTAL_BYTES`` the files of a team over its equal share go first, so
one team's uploads do not evict another's. The real FileStore on a temporary folder."""

from __future__ import annotations

import itertools
from pathlib import Path

from app.edge._files import FileStore
from pool import LocalFile
from pool._consumer import CURRENT, Consumer

A = Consumer("team-a", "a1b2c3d4e5f60718")
B = Consumer("team-b", "0f1e2d3c4b5a6978")


def _keep(store: FileStore, tmp_path: Path, consumer: Consumer | None, name: str) -> str:
    """A 1000-byte file kept as ``consumer``'s; its token."""
    path = tmp_path / f"in-{name}"
    path.write_bytes(b"x" * 1000)
    token = CURRENT.set(consumer)
    try:
        return store.keep(LocalFile(path, name, 1000, "text/plain", {}))[0]
    finally:
        CURRENT.reset(token)


def _known(store: FileStore, consumer: Consumer | None, file_token: str) -> bool:
    token = CURRENT.set(consumer)
    try:
        return store.local(file_token) is not None
    finally:
        CURRENT.reset(token)


async def test_a_file_is_unknown_to_another_team(tmp_path: Path) -> None:
    """A's upload is A's: B and a caller without a key get None (a 404), A finds it."""
    store = FileStore(tmp_path / "files", ttl_s=3600, max_total_bytes=10**9)
    mine = _keep(store, tmp_path, A, "a")
    assert _known(store, A, mine)
    assert not _known(store, B, mine) and not _known(store, None, mine)


async def test_f10_one_teams_files_do_not_evict_anothers(tmp_path: Path) -> None:
    """Bound 4000 bytes: A keeps 1 file, then B keeps 6; the sweep deletes B's oldest
    (B is over its share of 2000), never A's older one (before: oldest first, A's)."""
    ticks = itertools.count()
    store = FileStore(tmp_path / "files", ttl_s=3600, max_total_bytes=4000,
                      clock=lambda: 1000.0 + next(ticks))  # fmt: skip
    first = _keep(store, tmp_path, A, "a")
    bs = [_keep(store, tmp_path, B, f"b{i}") for i in range(6)]
    store.sweep()
    assert _known(store, A, first)
    kept = [t for t in bs if _known(store, B, t)]
    assert kept == bs[-3:], "B's newest three stay, within the bound with A's one"
