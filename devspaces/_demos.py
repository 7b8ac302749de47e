"""Stand-in kinds that are Gradio's own demo apps, each a ``gr.Interface`` (so each
one's endpoint is ``/predict``, as for every Interface):

(Gradio 6 names an Interface's endpoint after its function unless told: these say
``api_name="predict"``, the name every Interface had before.)

* ``upper`` — Gradio's hello-world shape: text in, the text upper-cased (and the
  Space's name, so a test sees which replica answered) out;
* ``state`` — Gradio's ``demo/interface_state`` (``store_message``): the history of
  the session's messages lives in a ``gr.State``;
* ``filename`` — files in (``gr.File(file_count="multiple")``), each one's name as the
  app sees it (the base name of its path on the Space) and its text out.

Each call is counted by the Space's meter (``/_stand_in/stats``).
"""

from __future__ import annotations

import os
from typing import Any

import gradio as gr

from devspaces._app import _Meter


def upper_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    def upper(text: str) -> str:
        _, started = meter.enter()
        try:
            return f"{meter.name}:{text.upper()}"
        finally:
            meter.leave(started)

    demo = gr.Interface(
        fn=upper, inputs="text", outputs="text", title=meter.name, api_name="predict"
    )
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    return demo


def state_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    def store_message(message: str, history: list[str]) -> tuple[dict[str, Any], list[str]]:
        _, started = meter.enter()
        try:
            output = {"Current messages": message, "Previous messages": history[::-1]}
            history.append(message)
            return output, history
        finally:
            meter.leave(started)

    demo = gr.Interface(
        fn=store_message,
        inputs=["textbox", gr.State(value=[])],
        outputs=["json", gr.State()],
        title=meter.name,
        api_name="predict",
    )
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    return demo


def filename_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    def names(files: list[str] | None) -> list[dict[str, str]]:
        _, started = meter.enter()
        try:
            out = []
            for path in files or []:
                with open(path, encoding="utf-8", errors="replace") as f:
                    out.append({"name": os.path.basename(path), "text": f.read(200)})
            return out
        finally:
            meter.leave(started)

    demo = gr.Interface(
        fn=names,
        inputs=gr.File(file_count="multiple"),
        outputs="json",
        title=meter.name,
        api_name="predict",
    )
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    return demo
