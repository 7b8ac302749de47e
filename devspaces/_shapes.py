"""The "shapes" stand-in kind: one Gradio app with the endpoint shapes real Spaces have.

Every endpoint is deterministic (same inputs, same outputs, same file bytes), so a test
can run one call through two transports and compare the results. The endpoints:

* ``/multi`` (text, number, flag) -> (text, number, JSON): several inputs and outputs;
* ``/bundle`` (text, size) -> (file, image, audio, text): every file-carrying output at
  once — a text file, a PNG drawn from ``size``, a WAV tone, and a caption;
* ``/gallery`` (count) -> a ``gr.Gallery`` of ``count`` small PNGs, each captioned;
* ``/count`` (text, n) -> a generator of ``n`` partials of (text, chat messages): the
  text grows by appending (Gradio sends an ``append`` diff) and the ``gr.Chatbot``
  gains one message (an ``add`` diff), so the diff operations of ``process_generating``
  that real streaming Spaces cause are exercised;
* ``/counter`` (step) -> per-session counter in ``gr.State``: returns the running total
  of this session's steps; ``/history`` (text) -> this session's texts so far, joined;
* ``/progress`` (n) -> reports ``gr.Progress`` ``n`` times, then returns ``"done n"``;
* ``/notify`` (text) -> sends ``gr.Info`` and ``gr.Warning`` (``log`` messages), returns;
* ``/error`` (text) -> raises ``gr.Error`` with a title;
* ``/limited`` (text, delay_s) -> an event with ``concurrency_limit=2``; returns text;
* ``/batch`` (text) -> ``batch=True, max_batch_size=4``: upper-cased text, computed
  for a whole batch at once; the Space counts the largest batch it saw;
* ``/echo`` (text, delay_s) -> the signature every kind has (health probes, generic tests).

Every call is counted by the Space's meter (in flight, peak, total), as in
:mod:`devspaces._app`; ``/limited`` also keeps its own peak, read through ``/limited``
itself with ``text="?peak"`` (so a test needs no route of our own to check the limit).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import gradio as gr

from devspaces._app import _Meter, act_out, echo_fn

MAX_COUNT = 200
MAX_SIZE = 256
MAX_GALLERY = 16
MAX_PROGRESS = 100
MAX_DELAY_S = 10.0
LIMITED_CONCURRENCY = 2
MAX_BATCH = 4

T = TypeVar("T")


def _clamp(value: Any, low: int, high: int) -> int:
    return max(low, min(high, int(value or 0)))


def _picture(size: int, seed: int) -> Any:
    """A deterministic RGB picture (numpy uint8), ``size`` x ``size``, varied by ``seed``."""
    import numpy

    axis = numpy.arange(size, dtype=numpy.uint16)
    red = (axis[:, None] * 7 + seed * 31) % 256
    green = (axis[None, :] * 5 + seed * 17) % 256
    blue = (axis[:, None] + axis[None, :] + seed * 3) % 256
    return numpy.stack(numpy.broadcast_arrays(red, green, blue), axis=-1).astype(numpy.uint8)


def _tone(frequency: float) -> tuple[int, Any]:
    import numpy

    rate = 8000
    t = numpy.arange(rate // 4) / rate
    return rate, (numpy.sin(2 * numpy.pi * frequency * t) * 3000).astype("int16")


class _Peak:
    """In-flight count and peak of one endpoint, and the largest batch seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.largest_batch = 0

    def enter(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def shapes_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    """The Blocks of the "shapes" stand-in Space."""
    name = meter.name
    files = Path(tempfile.gettempdir()) / f"spacepool-shapes-{os.getpid()}"
    files.mkdir(parents=True, exist_ok=True)
    limited_peak = _Peak()

    async def counted(work: Callable[[], Awaitable[T]]) -> T:
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            return await work()
        finally:
            meter.leave(started)

    async def multi(text: str, number: float, flag: bool) -> tuple[str, float, dict[str, Any]]:
        async def work() -> tuple[str, float, dict[str, Any]]:
            value = float(number or 0)
            summary = {"space": name, "text": text, "double": value * 2, "flag": bool(flag)}
            return f"{name}:{text[::-1]}", value * 2 + (1 if flag else 0), summary

        return await counted(work)

    def text_file(text: str, lines: int) -> str:
        body = f"{name}:{text}\n" * lines
        path = files / f"bundle-{hashlib.sha256(body.encode()).hexdigest()[:16]}.txt"
        if not path.exists():
            path.write_text(body)
        return str(path)

    async def bundle(text: str, size: float) -> tuple[str, Any, tuple[int, Any], str]:
        async def work() -> tuple[str, Any, tuple[int, Any], str]:
            side = _clamp(size, 1, MAX_SIZE)
            return (
                text_file(text, side),
                _picture(side, len(text)),
                _tone(220.0 + side),
                f"{name}:{text}:{side}",
            )

        return await counted(work)

    async def gallery(count: float) -> list[tuple[Any, str]]:
        async def work() -> list[tuple[Any, str]]:
            n = _clamp(count, 0, MAX_GALLERY)
            return [(_picture(8 + i, i), f"{name}:{i}") for i in range(n)]

        return await counted(work)

    async def count(text: str, n: float) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            total = _clamp(n, 0, MAX_COUNT)
            for i in range(total):
                await asyncio.sleep(0.005)
                messages = [{"role": "assistant", "content": f"{text}{j}"} for j in range(i + 1)]
                yield f"{name}:" + text * (i + 1), messages
        finally:
            meter.leave(started)

    async def counter(step: float, total: int) -> tuple[str, int]:
        async def work() -> tuple[str, int]:
            new_total = int(total or 0) + int(step or 0)
            return f"{name}:total={new_total}", new_total

        return await counted(work)

    async def history(text: str, seen: list[str] | None) -> tuple[str, list[str]]:
        async def work() -> tuple[str, list[str]]:
            now = [*(seen or []), text]
            return f"{name}:" + " | ".join(now), now

        return await counted(work)

    async def progress(n: float, tracker: gr.Progress = gr.Progress()) -> str:  # noqa: B008
        async def work() -> str:
            steps = _clamp(n, 0, MAX_PROGRESS)
            for i in range(steps):
                tracker((i, steps), desc="step", unit="steps")
                # Gradio sends at most one progress message per 10 ms (queueing.py,
                # start_progress_updates): pause long enough for each to be seen.
                await asyncio.sleep(0.02)
            return f"{name}:done {steps}"

        return await counted(work)

    async def notify(text: str) -> str:
        async def work() -> str:
            gr.Info(f"info: {text}")
            gr.Warning(f"warning: {text}")
            return f"{name}:notified {text}"

        return await counted(work)

    async def error(text: str) -> str:
        async def work() -> str:
            raise gr.Error(f"error: {text}", title="Shapes error")

        return await counted(work)

    async def limited(text: str, delay_s: float) -> str:
        async def work() -> str:
            if text == "?peak":
                with limited_peak.lock:
                    return f"peak={limited_peak.peak} batch={limited_peak.largest_batch}"
            limited_peak.enter()
            try:
                await asyncio.sleep(max(0.0, min(float(delay_s or 0), MAX_DELAY_S)))
                return f"{name}:limited:{text}"
            finally:
                limited_peak.leave()

        return await counted(work)

    async def batch(texts: list[str]) -> list[list[str]]:
        async def work() -> list[list[str]]:
            with limited_peak.lock:
                limited_peak.largest_batch = max(limited_peak.largest_batch, len(texts))
            await asyncio.sleep(0.05)  # lets concurrent joins gather into one batch
            return [[f"{name}:{t.upper()}" for t in texts]]

        return await counted(work)

    echo = echo_fn(meter)

    with gr.Blocks(title=f"stand-in shapes Space {name}") as demo:
        text = gr.Textbox(label="text")
        number = gr.Number(label="number", value=0)
        flag = gr.Checkbox(label="flag")
        out_text = gr.Textbox(label="output")
        out_number = gr.Number(label="result")
        out_json = gr.JSON(label="summary")
        size = gr.Number(label="size", value=8)
        out_file = gr.File(label="file")
        out_image = gr.Image(type="numpy", format="png", label="image")
        out_audio = gr.Audio(type="numpy", format="wav", label="audio")
        how_many = gr.Number(label="count", value=3)
        out_gallery = gr.Gallery(label="gallery", format="png")
        out_chat = gr.Chatbot(label="messages")
        step = gr.Number(label="step", value=1)
        total = gr.State(0)
        seen = gr.State([])
        delay = gr.Number(label="delay_s", value=0.0)

        gr.Button("multi").click(
            multi, [text, number, flag], [out_text, out_number, out_json], api_name="multi"
        )
        gr.Button("bundle").click(
            bundle, [text, size], [out_file, out_image, out_audio, out_text], api_name="bundle"
        )
        gr.Button("gallery").click(gallery, how_many, out_gallery, api_name="gallery")
        gr.Button("count").click(count, [text, how_many], [out_text, out_chat], api_name="count")
        gr.Button("counter").click(counter, [step, total], [out_text, total], api_name="counter")
        gr.Button("history").click(history, [text, seen], [out_text, seen], api_name="history")
        gr.Button("progress").click(progress, how_many, out_text, api_name="progress")
        gr.Button("notify").click(notify, text, out_text, api_name="notify")
        gr.Button("error").click(error, text, out_text, api_name="error")
        gr.Button("limited").click(
            limited,
            [text, delay],
            out_text,
            api_name="limited",
            concurrency_limit=LIMITED_CONCURRENCY,
        )
        gr.Button("batch").click(
            batch,
            text,
            out_text,
            api_name="batch",
            batch=True,
            max_batch_size=MAX_BATCH,
            concurrency_limit=1,  # joins that wait gather into one batch
        )
        gr.Button("echo").click(echo, [text, delay], out_text, api_name="echo")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks
