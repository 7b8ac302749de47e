"""The outbound secret guard refuses secrets before they leave, without echoing them."""

from __future__ import annotations

import logging

import pytest

from devspaces import SpaceFleet
from pool import RefusedByPolicy, check_outbound
from tests.conftest import PoolMaker

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAzq7secretmaterial\n"
    "-----END RSA PRIVATE KEY-----"
)
BEARER = "Authorization: Bearer sk-live-abcdefghijklmnop123456"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ((PEM,), "private_key"),
        (("please call with " + BEARER,), "bearer_token"),
        (({"nested": ["x", "password = hunter2hunter2"]},), "secret_assignment"),
        (("my token is hf_abcdefghijklmnopqrstuvwxyz123",), "hf_token"),
    ],
)
def test_guard_finds_secrets(payload: tuple[object, ...], reason: str) -> None:
    """Each secret shape is refused with its reason code and no echo of the secret."""
    with pytest.raises(RefusedByPolicy) as info:
        check_outbound(payload, {})
    assert info.value.reason == reason
    assert "hunter2" not in str(info.value) and "sk-live" not in str(info.value)


def test_guard_lets_ordinary_text_through() -> None:
    """Ordinary prompts, including the words token and password, pass."""
    check_outbound(("How do I reset my password?", "tokens per second: 40"), {"n": 3})


async def test_refused_payload_never_reaches_the_space(
    clean_fleet: SpaceFleet, make_pool: PoolMaker, caplog: pytest.LogCaptureFixture
) -> None:
    """With the guard on, a PEM key or bearer header is refused; the Space sees nothing,
    the window and breaker do not move, and the secret is in no log."""
    caplog.set_level(logging.DEBUG)
    pool = make_pool(clean_fleet, secret_guard="on")
    alpha = clean_fleet["alpha"]
    await pool.start()
    before = pool.board.get("alpha")
    for secret in (PEM, BEARER):
        for _ in range(3):  # more refusals than it takes to halve or to open a breaker
            with pytest.raises(RefusedByPolicy):
                await pool.predict("/echo", secret, 0, space="alpha")
    assert alpha.stats().total == 0
    after = pool.board.get("alpha")
    assert (after.window, after.failures, after.breaker) == (before.window, 0, "closed")
    assert pool.spaces["alpha"].is_up() and pool.spaces["alpha"].last_error is None
    stats = await pool.stats()
    assert stats["inUseConnections"] == 0 and stats["admission"]["globalInUse"] == 0
    assert "PRIVATE KEY" not in caplog.text and "sk-live" not in caplog.text
    async with pool.client("g@example.com", space="alpha") as client:
        assert await client.predict("fine", 0, api_name="/echo") == "alpha:fine"
