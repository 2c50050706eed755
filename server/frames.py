"""Outgoing frames, encoded once however many subscribers get them."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from websockets.frames import Frame, Opcode

from protocol.codec import encode

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


ACTION_FRAME_HEAD = b'{"jsonrpc":"2.0","method":"action","params":'


def action_frame(envelope: bytes) -> OutFrame:
    """The ``action`` notification carrying an encoded envelope."""
    return OutFrame(ACTION_FRAME_HEAD + envelope + b"}")


def notification(method: str, params: Any) -> bytes:
    """A JSON-RPC notification, encoded."""
    return encode({"jsonrpc": "2.0", "method": method, "params": params})
