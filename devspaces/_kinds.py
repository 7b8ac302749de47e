"""The kinds of stand-in Space, without importing Gradio (the test suite's collection
reads them in every pytest worker; ``import gradio`` costs ~2 CPU-s)."""

from __future__ import annotations

# Kinds of stand-in Space: kind -> "module:function", the function building the Blocks
# from (meter, concurrency_limit, max_size). Imported lazily, so a kind's own module may
# import this one (for _Meter). "echo" is the text stand-in every older test uses.
KINDS: dict[str, str] = {
    "echo": "devspaces._app:echo_blocks",
    "image": "devspaces._media:image_blocks",
    "stream": "devspaces._streaming:stream_blocks",
    "chat": "devspaces._streaming:chat_blocks",
    "headers": "devspaces._headers:headers_blocks",
    "shapes": "devspaces._shapes:shapes_blocks",
    "zerogpu": "devspaces._zerogpu:zerogpu_blocks",
    "upper": "devspaces._demos:upper_blocks",
    "state": "devspaces._demos:state_blocks",
    "filename": "devspaces._demos:filename_blocks",
}
