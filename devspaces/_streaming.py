"""Stand-in kinds for streaming Spaces: a generator endpoint and a chat with history.

* ``stream`` — ``/stream`` (text, count, interval_s) is a real Gradio generator: it
  yields ``count`` partial outputs ``interval_s`` apart, each a JSON object
  ``{"index": i, "text": <words so far>, "t": <time.time() when it yielded>}``, so a
  test measures delivery latency from the Space's own clock (same host, same clock).
  The last partial is the final result. ``/stream_fail`` yields ``count`` partials,
  then raises ``gr.Error``; ``/echo`` (text, delay_s) is a plain, non-streaming
  endpoint; ``/fail`` raises ``gr.Error`` at once. Every call of ``/stream``,
  ``/stream_fail`` and ``/echo`` is counted by the Space's meter (in flight, peak,
  intervals) from start to the end of the generator, however it ends (a cancelled
  job closes the generator, so ``in_flight`` drops back).
* ``chat`` — a real ``gr.ChatInterface`` (``/chat``, streaming its reply word by word)
  whose history lives in the session's ``gr.State``, as every ChatInterface keeps it
  for API callers. The reply names the earlier user messages the Space remembers
  (``"heard 'x'; earlier: a | b"``), so a test sees whose history a call got.
  ``/fail`` raises ``gr.Error``.

Both obey the ``hang`` and ``raise`` modes like ``echo`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from devspaces._app import _Meter, act_out, echo_fn

MAX_PARTIALS = 1000
MAX_INTERVAL_S = 10.0


def stream_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    name = meter.name

    async def partials(text: str, count: float, interval_s: float) -> AsyncIterator[Any]:
        n = max(0, min(int(count or 0), MAX_PARTIALS))
        pause = max(0.0, min(float(interval_s or 0), MAX_INTERVAL_S))
        words: list[str] = []
        for i in range(n):
            await asyncio.sleep(pause)
            words.append(f"{text}{i}")
            yield {"index": i, "text": " ".join(words), "t": time.time()}

    async def stream(text: str, count: float, interval_s: float) -> AsyncIterator[Any]:
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            async for out in partials(text, count, interval_s):
                yield out
        finally:
            meter.leave(started)

    async def stream_fail(text: str, count: float, interval_s: float) -> AsyncIterator[Any]:
        _, started = meter.enter()
        try:
            async for out in partials(text, count, interval_s):
                yield out
            raise gr.Error(f"stream failed: {text}")
        finally:
            meter.leave(started)

    echo = echo_fn(meter)

    async def fail(text: str) -> str:
        raise gr.Error(f"failed: {text}")

    with gr.Blocks(title=f"stand-in streaming Space {name}") as demo:
        text = gr.Textbox(label="text")
        count = gr.Number(label="count", value=3)
        interval = gr.Number(label="interval_s", value=0.3)
        delay = gr.Number(label="delay_s", value=0.0)
        out = gr.JSON(label="partial")
        plain = gr.Textbox(label="output")
        gr.Button("stream").click(stream, [text, count, interval], out, api_name="stream")
        gr.Button("stream_fail").click(
            stream_fail, [text, count, interval], out, api_name="stream_fail"
        )
        gr.Button("echo").click(echo, [text, delay], plain, api_name="echo")
        gr.Button("fail").click(fail, text, plain, api_name="fail")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks


def _text_of(message: Any) -> str:
    """The text of one history message (a plain string or Gradio's content blocks)."""
    content = message.get("content") if isinstance(message, dict) else message
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return str(content)


def chat_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    name = meter.name

    async def chat(message: str, history: list[Any]) -> AsyncIterator[str]:
        mode, started = meter.enter()
        try:
            await act_out(name, mode)
            earlier = [
                _text_of(m) for m in history if isinstance(m, dict) and m.get("role") == "user"
            ]
            reply = f"heard {message!r}; earlier: {' | '.join(earlier) or '(nothing)'}"
            words = reply.split(" ")
            for i in range(1, len(words) + 1):
                await asyncio.sleep(0.01)
                yield " ".join(words[:i])
        finally:
            meter.leave(started)

    async def fail(text: str) -> str:
        raise gr.Error(f"failed: {text}")

    with gr.Blocks(title=f"stand-in chat Space {name}") as demo:
        gr.ChatInterface(chat, api_name="chat")
        text = gr.Textbox(label="text", visible=False)
        plain = gr.Textbox(label="output", visible=False)
        gr.Button("fail", visible=False).click(fail, text, plain, api_name="fail")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks
