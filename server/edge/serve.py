"""Running the app under uvicorn, for ``huddle serve`` and for tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from server import logs
from server.config import Settings
from server.frames import CLOSED, OVERLOADED, WRITE_EXTENSION, WRITTEN


class Inbox:
    """What uvicorn's protocol needs of its queue of ASGI receive events
    (``put_nowait``, ``get``, ``empty``) for its one reader, the app: a list
    and a future, where an ``asyncio.Queue`` holds four deques (about
    2.5 KiB for every idle connection)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        if self._waiter is not None:
            raise RuntimeError("one reader at a time")
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)


class Gate:
    """``asyncio.Event``'s ``set``, ``clear``, ``is_set`` and ``wait``, set
    at first, with its waiters in a list made only while one waits (an
    Event holds a deque from the start)."""

    __slots__ = ("_open", "_waiters")

    def __init__(self) -> None:
        self._open = True
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._open

    def set(self) -> None:
        self._open = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._open = False

    async def wait(self) -> bool:
        while not self._open:
            waiter = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if self._waiters is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)
        return True


class HuddleWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol with one ASGI extension,
    ``huddle.write``: write a prebuilt frame now, without a task, a queue or
    an await. Broadcasting one action to N subscribers is then N buffer
    appends of the same bytes. Huddle disables per-message compression, so a
    text frame is the same for every connection.

    ``write(frame, limit)`` returns WRITTEN, CLOSED (the connection is
    closing: dropped) or OVERLOADED (the peer has not taken ``limit`` bytes
    already written: it cannot keep up). ``abort()`` drops the connection.

    Lighter than uvicorn's for the many idle connections a server holds: its
    receive queue and writable flag without deques (:class:`Inbox`,
    :class:`Gate`), and the handshake's request and response let go once
    the socket is open.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Gate()  # type: ignore[assignment]

    async def send(self, message: Any) -> None:
        await super().send(message)
        if self.handshake_complete and message["type"] == "websocket.accept":
            # Read only while the handshake is answered. The parser of the
            # websockets protocol keeps the request object itself as long as
            # the connection lives: empty its headers (the app has its own
            # copy in the ASGI scope).
            self.request.headers.clear()
            self.request = self.response = None  # type: ignore[assignment]

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][WRITE_EXTENSION] = {
                "write": self._write_prebuilt,
                "abort": self._abort,
            }

    def _abort(self) -> None:
        """Drop the connection now, without a closing handshake: for a peer
        that stopped reading, which would never read a close frame either."""
        self.transport.abort()

    def _write_prebuilt(self, frame: bytes, limit: int) -> int:
        transport = self.transport
        if self.close_sent or self.disconnected or transport.is_closing():
            return CLOSED
        if not self.handshake_complete:
            return CLOSED
        if transport.get_write_buffer_size() + len(frame) > limit:
            return OVERLOADED
        transport.write(frame)
        return WRITTEN


class UvicornServer(uvicorn.Server):
    """uvicorn's server that says when it listens and on which port."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[int], None] | None = None):
        super().__init__(config)
        self.listening = asyncio.Event()
        self.port = 0
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            for server in self.servers:
                for sock in server.sockets:
                    self.port = sock.getsockname()[1]
                    break
            self.listening.set()
            if self._on_listening is not None:
                self._on_listening(self.port)


def uvicorn_config(app: Starlette, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn settings for Huddle: websockets without per-message
    compression (it costs CPU on every frame and opens compression side
    channels), frames capped at ``max_frame_bytes`` (1009 beyond)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "ws": HuddleWebSocketProtocol,
        "ws_per_message_deflate": False,
        "ws_max_size": settings.max_frame_bytes,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "lifespan": "on",
        "log_level": "info",
        "timeout_graceful_shutdown": 5,
    }
    options.update(overrides)
    config = uvicorn.Config(app, **options)  # configures uvicorn's logging
    logs.install()
    return config
