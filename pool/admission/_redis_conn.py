"""The Redis store's connections: an abandoned connection is reset, not closed.

redis-py closes a connection whose reply did not come within ``socket_timeout``. A
graceful close (FIN) leaves what the kernel had not delivered in its send queue, and
the kernel keeps retransmitting it: after a partition heals, a command the client gave
up on long ago reaches Redis and runs (seen: an enqueue 7 s after the heal, after its
waiter had been withdrawn on a new connection). With ``SO_LINGER`` on and a linger
time of 0, ``close()`` sends a reset and the kernel drops that queue (socket(7)).
Every close of these connections is a reset: a normal close happens only once every
reply is in, so nothing is lost by it.
"""

from __future__ import annotations

import socket
import struct

from redis.asyncio.connection import Connection

_LINGER_RESET = struct.pack("ii", 1, 0)  # struct linger {l_onoff = 1, l_linger = 0}


class ResetOnClose(Connection):
    """A TCP connection to Redis whose close discards anything still unsent."""

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[no-untyped-call]  # untyped in redis-py
        writer = self._writer
        sock = writer.transport.get_extra_info("socket") if writer is not None else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
