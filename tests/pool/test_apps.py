"""Apps and replicas through the library, against Gradio demo apps that all name their
endpoint /predict: a call without a Space never reaches the wrong app, replicas share
the load and keep a user, and uploads reach the app under the name given."""

from __future__ import annotations

from pathlib import Path

import pytest

from devspaces import SpaceProcess
from pool import AmbiguousEndpoint, Pool, PoolSettings, file_arg


def _pool(entries: str) -> Pool:
    return Pool(PoolSettings(spaces=entries, coordinator_url="memory://", min_connections=1))


async def test_three_apps_with_predict_are_ambiguous_before_any_slot(
    demo_spaces: dict[str, SpaceProcess],
) -> None:
    """upper (2 replicas), state, filename: /predict without a Space is
    AmbiguousEndpoint naming the three apps; nothing was admitted or run; with a
    Space it runs there."""
    for space in demo_spaces.values():
        space.reset()
    pool = _pool(",".join(f"{n}={s.url}" for n, s in demo_spaces.items()))
    try:
        with pytest.raises(AmbiguousEndpoint) as caught:
            await pool.predict("/predict", "hi")
        assert caught.value.apps == {
            "upper-1": ["upper-1", "upper-2"], "state": ["state"], "filename": ["filename"],
        }  # fmt: skip
        assert all(s.stats().total == 0 for s in demo_spaces.values())
        assert (await pool.stats())["admission"]["globalInUse"] == 0
        assert pool.apps.apps() == caught.value.apps
        done = await pool.predict("/predict", "hi", space="upper-2")
        assert done.result == "upper-2:HI"
    finally:
        await pool.aclose()


async def test_replicas_share_new_users_and_keep_each_user(
    demo_spaces: dict[str, SpaceProcess],
) -> None:
    """Two replicas of upper: eight users spread over both; each user's calls all go
    to one replica; explicit groups (alias@app=URL) that differ are ambiguous."""
    one, two = demo_spaces["upper-1"], demo_spaces["upper-2"]
    pool = _pool(f"upper-1={one.url},upper-2={two.url}")
    try:
        served: dict[str, set[str]] = {}
        for round_ in range(2):
            for i in range(8):
                done = await pool.predict("/predict", f"r{round_}", email=f"u{i}@example.com")
                served.setdefault(f"u{i}", set()).add(done.space)
        assert all(len(spaces) == 1 for spaces in served.values()), served
        assert set().union(*served.values()) == {"upper-1", "upper-2"}
    finally:
        await pool.aclose()
    split = _pool(f"a@left={one.url},b@right={two.url}")
    try:
        with pytest.raises(AmbiguousEndpoint) as caught:
            await split.predict("/predict", "x")
        assert caught.value.apps == {"left": ["a"], "right": ["b"]}
    finally:
        await split.aclose()


async def test_file_arg_name_is_the_name_the_app_sees(
    demo_spaces: dict[str, SpaceProcess], tmp_path: Path
) -> None:
    """file_arg(path, name="notes.txt") of a file stored as tmp123.bin: the app sees
    notes.txt; two files of one name in one call both arrive."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "tmp123.bin", tmp_path / "b" / "same.txt"
    first.write_text("hello notes")
    second.write_text("second one")
    other = tmp_path / "same.txt"
    other.write_text("first one")
    pool = _pool(f"filename={demo_spaces['filename'].url}")
    try:
        done = await pool.predict("/predict", [file_arg(first, name="notes.txt")])
        assert done.result == [{"name": "notes.txt", "text": "hello notes"}]
        both = await pool.predict("/predict", [file_arg(other), file_arg(second)])
        assert both.result == [
            {"name": "same.txt", "text": "first one"}, {"name": "same.txt", "text": "second one"},
        ]  # fmt: skip
    finally:
        await pool.aclose()
