"""The outbound secret guard refuses secrets before they leave, without echoing them."""

from __future__ import annotations

import logging
import random
import re
import time

import pytest

from devspaces import SpaceFleet
from pool import RefusedByPolicy, check_outbound
from tests.conftest import PoolMaker

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAzq7secretmaterial\n"
    "-----END RSA PRIVATE KEY-----"
)
BEARER = "Authorization: Bearer sk-live-abcdefghijklmnop123456"
BIG = 512 * 1024  # the service's cap on a body's args and kwargs

# The rules as they were written before issue 28 (they backtracked cubically on long
# inputs): the reference for what the linear guard must mean, run on short strings only.
REFERENCE = (
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("bearer_token", re.compile(r"\bBearer\s+[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE)),
    ("hf_token", re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")),
    (
        "secret_assignment",
        re.compile(
            r"\b[\w.-]*(?:api[_-]?key|secret|token|passw(?:or)?d|passwd)[\w.-]*\s*[:=]\s*"
            r"['\"]?[^\s'\"]{6,}",
            re.IGNORECASE,
        ),
    ),
)
FRAGMENTS = (
    *("token", "TOKEN", "api_key", "Api-Key", "apikey", "secret", "password", "passwd"),
    *("Bearer", "bearer", "hf_", "-----BEGIN ", "RSA ", "PRIVATE KEY-----", "PRIVATE ", "A "),
    *(" ", "\t", "\n", ":", "=", "'", '"', ".", "-", "_", "/", "+", "~", "@", "x", "abc"),
    *("abcdefgh", "ABCDEFGHIJKLMNOPQRSTUV", "abcdefghijklmnopqrstu", "é", "ſ", "\u212a"),
)


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


def reason_of(text: str) -> str | None:
    """The guard's reason code for ``text``, or None when it passes."""
    try:
        check_outbound((text,), {})
    except RefusedByPolicy as exc:
        return exc.reason
    return None


def test_guard_means_what_the_old_rules_meant() -> None:
    """On 20,000 short strings built from the rules' pieces, the linear guard gives the
    reason (or pass) that the old backtracking regexes gave, in the same rule order."""
    rng = random.Random(28)
    seen: set[str | None] = set()
    for _ in range(20_000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))
        expected = next((r for r, pattern in REFERENCE if pattern.search(text)), None)
        assert reason_of(text) == expected, text
        seen.add(expected)
    assert seen == {None, "private_key", "bearer_token", "hf_token", "secret_assignment"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("token." * (BIG // 6), None),  # the input: 3,000 chars took 8.7 s
        ("token." * (BIG // 6) + "= abcdefgh", "secret_assignment"),
        ("x.TOKEN" + " " * BIG + ":", None),
        ("api_key" + ":" * BIG, "secret_assignment"),
        ("hf_" + "a" * BIG + "_", None),
        ("hf_" + "a" * BIG, "hf_token"),
        ("Bearer " * (BIG // 7), None),
        ("Bearer" + " " * BIG + "abcdefgh", "bearer_token"),
        ("-----BEGIN " + "A " * (BIG // 2), None),
        ("-----BEGIN " + "A " * (BIG // 2) + "PRIVATE KEY-----", "private_key"),
    ],
    ids=lambda v: v if v is None or len(v) < 40 else f"{v[:12]!r}..{len(v)}",
)
def test_guard_is_fast_on_adversarial_512_kib_strings(text: str, reason: str | None) -> None:
    """A 512 KiB string shaped against backtracking is decided in under 1 s of CPU
    with the right answer (tens of ms here; on the "token." ones the old
    secret_assignment rule was cubic: 5.6 s at 3,000 chars, 43 s at 6,000, so months at
    512 KiB). CPU time of this thread, not wall time: other processes on a loaded
    machine do not count, backtracking does."""
    started = time.thread_time()
    assert reason_of(text) == reason
    assert time.thread_time() - started < 1.0


async def test_large_payloads_are_checked_off_the_loop_with_the_same_answers(
    clean_fleet: SpaceFleet, make_pool: PoolMaker
) -> None:
    """A payload over the inline limit (checked in a worker thread) is still refused when
    it holds a secret and sent when it does not."""
    pool = make_pool(clean_fleet, secret_guard="on")
    await pool.start()
    large = "token." * 20_000  # 120,000 characters, over the 64 KiB inline limit
    with pytest.raises(RefusedByPolicy) as info:
        await pool.predict("/echo", large + " password=hunter2hunter2", 0, space="alpha")
    assert info.value.reason == "secret_assignment"
    assert clean_fleet["alpha"].stats().total == 0
    sent = await pool.predict("/echo", large, 0, space="alpha")
    assert sent.result == "alpha:" + large


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
