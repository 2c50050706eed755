"""Outgoing frames, encoded once however many subscribers get them."""

from __future__ import annotations

from functools import cached_property

from websockets.frames import Frame, Opcode

WRITE_EXTENSION = "huddle.write"
"""The ASGI scope extension of Huddle's WebSocket protocol (server.serve)."""
WRITTEN, CLOSED, OVERLOADED = 1, 0, -1
"""What a direct write did: written, dropped (closing), or refused (the
peer has too much unread)."""


class OutFrame:
    """One JSON-RPC message to send, as UTF-8 JSON; its text and its whole
    WebSocket frame are built at most once. Server frames are not masked and
    Huddle turns per-message compression off, so the same frame bytes go to
    every connection."""

    __slots__ = ("__dict__", "payload")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    @cached_property
    def text(self) -> str:
        return self.payload.decode()

    @cached_property
    def wire(self) -> bytes:
        return Frame(Opcode.TEXT, self.payload).serialize(mask=False, extensions=[])

    def __len__(self) -> int:
        return len(self.payload)
