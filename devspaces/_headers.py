"""The "headers" stand-in kind: a Space that shows what each call sent and said.

Endpoints, every one counted by the meter like ``/echo``:

* ``/headers`` — (text, delay_s) in, after ``delay_s`` the ``x-*`` headers (and a W3C
  ``traceparent``) of the call's queue join out (``gr.Request``), as a JSON object:
  which caller's headers reached it;
* ``/copy`` — a file in (``gr.File(type="filepath")``), a file out: the same bytes
  followed by a line naming the ``x-caller`` header of the call — an upload and a
  download in one call;
* ``/report`` — (text, steps) in: ``gr.Info`` and ``gr.Warning`` messages and a
  ``gr.Progress`` bar of ``steps`` steps, then ``"done:<text>"`` — the protocol's
  ``log`` and ``progress`` messages;
* ``/event_data`` — text in, the ``event_data`` of the call's join out (``gr.EventData``,
  which Gradio builds from it): what a client sent beside ``data``;
* ``/echo`` — the text stand-in's signature (text, delay_s).

Headers of the other requests of a call (data stream, upload, download, cancel) never
reach the app: a test records them in front of the Space.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from devspaces._app import _Meter, act_out, echo_fn


def headers_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    name = meter.name
    echo = echo_fn(meter)
    copies = Path(tempfile.gettempdir()) / f"spacepool-standin-{os.getpid()}"

    async def headers(text: str, delay_s: float, request: gr.Request) -> dict[str, Any]:
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            await asyncio.sleep(max(0.0, float(delay_s or 0)))
            return {k: v for k, v in request.headers.items()
                    if k.lower().startswith("x-") or k.lower() == "traceparent"}  # fmt: skip
        finally:
            meter.leave(started)

    def copy(path: str | None, request: gr.Request) -> str:  # disk: a worker thread
        _, started = meter.enter()
        try:
            copies.mkdir(exist_ok=True)
            data = Path(path).read_bytes() if path else b""
            target = copies / f"copy-{started:.6f}.txt"
            caller = request.headers.get("x-caller", "")
            target.write_bytes(data + f"\ncaller={caller}\n".encode())
            return str(target)
        finally:
            meter.leave(started)

    # Gradio finds a progress parameter by its default value: the call is the API.
    async def report(text: str, steps: float, progress: gr.Progress = gr.Progress()) -> str:  # noqa: B008
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            gr.Info(f"info: {text}")
            count = max(1, min(int(steps or 1), 100))
            for i in range(count):
                progress((i, count), desc="steps")
                await asyncio.sleep(0.01)
            gr.Warning(f"warning: {text}")
            return f"done:{text}"
        finally:
            meter.leave(started)

    def event_data(text: str, event: gr.EventData) -> dict[str, Any]:
        _, started = meter.enter()
        try:
            return {"text": text, "event_data": event._data}
        finally:
            meter.leave(started)

    with gr.Blocks(title=f"stand-in Space {name} (headers)") as demo:
        text = gr.Textbox(label="text")
        delay = gr.Number(label="delay_s", value=0.0)
        shown = gr.JSON(label="headers")
        file_in = gr.File(type="filepath", label="file")
        file_out = gr.File(label="copy")
        out = gr.Textbox(label="output")
        gr.Button("headers").click(headers, [text, delay], shown, api_name="headers")
        gr.Button("copy").click(copy, file_in, file_out, api_name="copy")
        gr.Button("report").click(report, [text, delay], out, api_name="report")
        gr.Button("event").click(event_data, text, shown, api_name="event_data")
        gr.Button("echo").click(echo, [text, delay], out, api_name="echo")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks
