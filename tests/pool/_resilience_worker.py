"""One process of the two-process resilience tests, driven line by line over stdin.

    python -m tests.pool._resilience_worker [--sleeping NAME ...]

Settings come from ``POOL_*`` variables (spaces, coordinator URL, breaker, wake). With
``--sleeping``, a :class:`FakeSpaceControl` in this process reports those Spaces
SLEEPING (the Hub as this process sees it); every other stage is unknown.

Prints ``{"ready": true}`` once the pool has started, then answers each JSON command
with one JSON line:

* ``{"op": "predict", "n": N, "space": S, "watch": W}`` — N predicts one after the
  other (``/echo``, no delay), pinned to S if given; per request the Space that served
  it (or the error kind) and W's window and breaker afterwards, from this process;
* ``{"op": "begin", "id": I, "space": S, "delay": D}`` — start one predict (the Space
  answers after D seconds) in the background with its own WaitTicket;
  ``{"op": "ticket", "id": I}`` — its stage now, and whether it is done;
  ``{"op": "finish", "id": I}`` — wait for it and answer as ``predict`` does;
* ``{"op": "stats"}`` — window, breaker and wake of every Space, from ``pool.stats()``;
* ``{"op": "calls"}`` — the calls the fake Hub received in this process;
* ``{"op": "quit"}`` — close the pool and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, TextIO

from pool import Pool, PoolError, PoolSettings, WaitTicket
from pool.resilience import FakeSpaceControl


async def _one(
    pool: Pool, i: str, space: str | None, ticket: WaitTicket | None, delay_s: float = 0.0
) -> dict[str, Any]:
    began = time.monotonic()
    try:
        done = await pool.predict("/echo", i, delay_s, space=space, ticket=ticket, timeout=90)
    except PoolError as exc:
        return {"error": exc.kind, "took": time.monotonic() - began}
    return {
        "space": done.space,
        "result": done.result,
        "attempts": done.attempts,
        "took": time.monotonic() - began,
        # CLOCK_MONOTONIC is the machine's: the test compares it with its own readings
        # (its answer to the test may come much later on a loaded machine).
        "ended_at": time.monotonic(),
    }


async def _serve(pool: Pool, control: FakeSpaceControl, out: TextIO) -> None:
    background: dict[str, tuple[asyncio.Task[dict[str, Any]], WaitTicket]] = {}
    counter = 0

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    reply({"ready": True})
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return  # the test went away
        command = json.loads(line)
        op = command["op"]
        if op == "quit":
            for task, _ticket in background.values():
                task.cancel()
            await asyncio.gather(*(t for t, _ in background.values()), return_exceptions=True)
            reply({"bye": True})
            return
        if op == "predict":
            watch = command.get("watch")
            outcomes = []
            for _ in range(int(command.get("n", 1))):
                counter += 1
                outcome = await _one(pool, f"r{counter}", command.get("space"), None)
                if watch:
                    h = pool.board.get(watch)
                    outcome.update(window=h.window, breaker=h.breaker)
                outcomes.append(outcome)
            reply({"outcomes": outcomes})
        elif op == "begin":
            ticket = WaitTicket()
            task = asyncio.create_task(
                _one(pool, command["id"], command.get("space"), ticket, command.get("delay", 0.0))
            )
            background[command["id"]] = (task, ticket)
            reply({"begun": command["id"]})
        elif op == "ticket":
            task, ticket = background[command["id"]]
            reply({"stage": ticket.stage, "space": ticket.space, "done": task.done()})
        elif op == "finish":
            task, ticket = background.pop(command["id"])
            reply({"outcome": await task, "stage": ticket.stage})
        elif op == "stats":
            stats = await pool.stats()
            keys = ("window", "breaker", "wake")
            reply({n: {k: p[k] for k in keys} for n, p in stats["pools"].items()})
        elif op == "calls":
            reply({"calls": control.calls})
        else:
            reply({"unknown": op})


async def main(sleeping: list[str]) -> None:
    # Answers go to the real stdout; anything a library prints goes to stderr instead.
    out, sys.stdout = sys.stdout, sys.stderr
    control = FakeSpaceControl(dict.fromkeys(sleeping, "SLEEPING"))
    pool = Pool(PoolSettings(), space_control=control)
    try:
        await pool.start()
        await _serve(pool, control, out)
    finally:
        await pool.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleeping", action="append", default=[])
    asyncio.run(main(parser.parse_args().sleeping))
