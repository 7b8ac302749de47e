"""The "image" stand-in kind: a file-based Space (image in/out, file in, file out).

Endpoints, every one counted by the meter (in flight, peak, total) like ``/echo``:

* ``/flip`` — ``gr.Image(type="pil")`` in, the same image mirrored left-right out, saved
  by Gradio as PNG: a deterministic transform, so a test can compare bytes;
* ``/report`` — (text, lines) in, a generated text file out (``gr.File``): ``lines``
  lines of ``text``, so a test can ask for an output of a chosen size;
* ``/checksum`` — a file in (``gr.File(type="filepath")``), ``"<size> <sha256>"`` of
  its bytes out: what reached the Space after an upload;
* ``/tone`` — a frequency in, two outputs: one second of a sine wave as WAV audio
  (``gr.Audio``) and a text label, so a file sits inside a multi-output result;
* ``/echo`` — the text stand-in's signature (text, delay_s), so that generic tests and
  health probes work against this kind too.

``/flip`` and ``/echo`` are coroutines on the server's loop, as in :mod:`devspaces._app`;
``/report`` and ``/checksum`` touch the disk and run in Gradio's worker threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from devspaces._app import _Meter, act_out

MAX_REPORT_LINES = 200_000


def image_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    """The Blocks of an image/file stand-in Space."""
    import numpy
    from PIL import ImageOps

    name = meter.name
    # Generated reports are named after their content: the same call reuses the file,
    # so the directory stays as small as the set of distinct calls.
    reports = Path(tempfile.gettempdir()) / f"spacepool-standin-{os.getpid()}"
    reports.mkdir(parents=True, exist_ok=True)

    async def flip(image: Any) -> Any:
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            if image is None:
                raise gr.Error("no image")
            return ImageOps.mirror(image)
        finally:
            meter.leave(started)

    def report(text: str, lines: float) -> str:  # disk work: in Gradio's worker threads
        _, started = meter.enter()
        try:
            count = max(0, min(MAX_REPORT_LINES, int(lines or 0)))
            body = f"{name}:{text}\n" * count
            digest = hashlib.sha256(body.encode()).hexdigest()[:16]
            path = reports / f"report-{digest}.txt"
            if not path.exists():
                path.write_text(body)
            return str(path)
        finally:
            meter.leave(started)

    def checksum(path: str | None) -> str:
        _, started = meter.enter()
        try:
            if path is None:
                raise gr.Error("no file")
            data = Path(path).read_bytes()
            return f"{len(data)} {hashlib.sha256(data).hexdigest()}"
        finally:
            meter.leave(started)

    async def tone(frequency: float) -> tuple[tuple[int, Any], str]:
        _, started = meter.enter()
        try:
            rate = 8000
            t = numpy.arange(rate) / rate
            wave = (numpy.sin(2 * numpy.pi * float(frequency or 0) * t) * 3000).astype("int16")
            return (rate, wave), f"{float(frequency or 0):g} Hz"
        finally:
            meter.leave(started)

    async def echo(text: str, delay_s: float) -> str:
        _, started = meter.enter()
        try:
            await asyncio.sleep(max(0.0, float(delay_s or 0)))
            return f"{name}:{text}"
        finally:
            meter.leave(started, text)  # recorded like the echo kind's (calls())

    with gr.Blocks(title=f"stand-in image Space {name}") as demo:
        image_in = gr.Image(type="pil", label="image")
        image_out = gr.Image(type="pil", format="png", label="flipped")
        text = gr.Textbox(label="text")
        lines = gr.Number(label="lines", value=1)
        file_out = gr.File(label="report")
        file_in = gr.File(type="filepath", label="file")
        digest = gr.Textbox(label="checksum")
        frequency = gr.Number(label="frequency", value=440)
        audio = gr.Audio(type="numpy", format="wav", label="tone")
        caption = gr.Textbox(label="caption")
        delay = gr.Number(label="delay_s", value=0.0)
        echoed = gr.Textbox(label="output")
        gr.Button("flip").click(flip, image_in, image_out, api_name="flip")
        gr.Button("report").click(report, [text, lines], file_out, api_name="report")
        gr.Button("checksum").click(checksum, file_in, digest, api_name="checksum")
        gr.Button("tone").click(tone, frequency, [audio, caption], api_name="tone")
        gr.Button("echo").click(echo, [text, delay], echoed, api_name="echo")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks
