"""Outgoing frames, encoded once however many subscribers get them."""

from __future__ import annotations

from functools import cached_property

from websockets.frames import Frame, Opcode


class OutFrame:
    """One JSON-RPC message to send: its text, and lazily the complete
    WebSocket frame that carries it. Server frames are not masked, so the
    same bytes go to every connection (built at most once)."""

    __slots__ = ("__dict__", "text")

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def wire(self) -> bytes:
        return Frame(Opcode.TEXT, self.text.encode()).serialize(mask=False, extensions=[])
