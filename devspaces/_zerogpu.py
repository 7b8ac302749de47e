"""The "zerogpu" stand-in kind: a Space that charges GPU time to the caller's identity.

A ZeroGPU Space reads the ``x-ip-token`` header the Hub injects (a calling Space
forwards its end user's) and charges the GPU seconds of each call to that identity.
When the identity's quota is spent it raises an ordinary ``gr.Error`` whose text is
the only signal, worded as the ``spaces`` package words it (spaces/zero/client.py):
"You have exceeded your GPU quota (60s requested vs. 12s left). Try again in 0:01:05".

Endpoints, counted by the meter:

* ``/gpu`` — (text, gpu_s) in: charges ``gpu_s`` to the call's token (every token
  starts with ``QUOTA_S``; no token: the ``anonymous`` identity), then returns
  ``"<token>:<text>"`` — which identity reached the Space on that call;
* ``/echo`` — the text stand-in's signature (text, delay_s).
"""

from __future__ import annotations

import gradio as gr

from devspaces._app import _Meter, echo_fn

QUOTA_S = 10.0  # GPU seconds each identity may use
RETRY_TEXT = "0:01:05"  # the wait the quota message names (65 s)


def zerogpu_blocks(meter: _Meter, concurrency_limit: int, max_size: int | None) -> gr.Blocks:
    name = meter.name
    echo = echo_fn(meter)
    used: dict[str, float] = {}

    async def gpu(text: str, gpu_s: float, request: gr.Request) -> str:
        _, started = meter.enter()
        try:
            token = request.headers.get("x-ip-token") or "anonymous"
            wanted = max(0.0, float(gpu_s or 0))
            with meter.lock:
                left = QUOTA_S - used.get(token, 0.0)
                if wanted > left:
                    raise gr.Error(
                        f"You have exceeded your GPU quota ({wanted:.0f}s requested vs. "
                        f"{max(0.0, left):.0f}s left). Try again in {RETRY_TEXT}"
                    )
                used[token] = used.get(token, 0.0) + wanted
            return f"{token}:{text}"
        finally:
            meter.leave(started)

    with gr.Blocks(title=f"stand-in Space {name} (zerogpu)") as demo:
        text = gr.Textbox(label="text")
        amount = gr.Number(label="gpu_s", value=1.0)
        delay = gr.Number(label="delay_s", value=0.0)
        out = gr.Textbox(label="output")
        gr.Button("gpu").click(gpu, [text, amount], out, api_name="gpu")
        gr.Button("echo").click(echo, [text, delay], out, api_name="echo")
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_size)
    blocks: gr.Blocks = demo
    return blocks
