"""Running the app under uvicorn, for ``huddle serve`` and for tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette

from server.config import Settings


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
        "ws": "websockets-sansio",
        "ws_per_message_deflate": False,
        "ws_max_size": settings.max_frame_bytes,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "lifespan": "on",
        "log_level": "info",
        "timeout_graceful_shutdown": 5,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)
