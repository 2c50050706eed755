"""An AHP connection inside the server's own process, for a door that speaks
for a token without a socket of its own (Huddle's MCP server,
server.mcp.door): its client end is a :class:`~server.client.Socket` for a
:class:`~server.client.HuddleClient`, and its server end is served by the
edge exactly as a WebSocket is (server.edge.app.open_local: the same
authorisation, budgets, identity and audit, and a socket slot of the
token's).

Frames go through two bounded queues, one each way: a reader that falls
behind holds up the writer on the other side (the server's send buffer then
closes a client that does not read, as for a WebSocket), never memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

from websockets.exceptions import ConnectionClosed

CAPACITY: Final = 64
"""Frames in flight each way."""


class LocalSocket:
    """Both ends of one in-process connection (see the module docstring).
    Closing either end closes both."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._to_client: asyncio.Queue[str | None] = asyncio.Queue(capacity)
        self._to_server: asyncio.Queue[str | None] = asyncio.Queue(capacity)
        self.closed = False
        self.server_end = ServerEnd(self)
        self.served: asyncio.Task[None] | None = None
        """The task serving the server end (set by who serves it)."""

    # ─── The client's end (server.client.Socket) ────────────────────────

    @property
    def transport(self) -> LocalSocket:
        return self

    async def send(self, message: str) -> None:
        if self.closed:
            raise ConnectionClosed(None, None)
        await self._to_server.put(message)

    async def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        """Close both ends now: each side reads the end of its frames."""
        if self.closed:
            return
        self.closed = True
        for queue in (self._to_client, self._to_server):
            if queue.full():
                queue.get_nowait()  # nobody reads what is left after the close
            queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[str]:
        while (frame := await self._to_client.get()) is not None:
            yield frame

    # ─── For the server's end ───────────────────────────────────────────

    async def to_client(self, text: str) -> None:
        if not self.closed:
            await self._to_client.put(text)

    async def from_client(self) -> str | None:
        """The client's next frame; None once closed."""
        if self.closed and self._to_server.empty():
            return None
        return await self._to_server.get()


class ServerEnd:
    """The server's end, shaped as the few parts of Starlette's WebSocket
    the edge serves a socket with."""

    scope: Final[dict[str, Any]] = {"type": "websocket", "subprotocols": [], "extensions": {}}

    def __init__(self, pair: LocalSocket) -> None:
        self.pair = pair

    async def accept(self, subprotocol: str | None = None) -> None:
        pass

    async def send_text(self, data: str) -> None:
        await self.pair.to_client(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.pair.abort()

    async def receive(self) -> dict[str, Any]:
        text = await self.pair.from_client()
        if text is None:
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.receive", "text": text}
