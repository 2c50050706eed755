"""Outgoing frames, encoded once however many subscribers get them."""

from __future__ import annotations

import struct
from functools import cached_property
from typing import Any

from protocol.codec import encode
from protocol.messages import Snapshot

WRITE_EXTENSION = "huddle.write"
"""The ASGI scope extension of Huddle's WebSocket protocol (server.edge.serve)."""
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
        return _wire(self.payload)

    def __len__(self) -> int:
        return len(self.payload)


def _wire(payload: bytes) -> bytes:
    """``payload`` as one whole unmasked WebSocket text frame."""
    return _text_frame_head(len(payload)) + payload


def _text_frame_head(size: int) -> bytes:
    """RFC 6455 5.2: FIN and the text opcode (0x81), no mask (a server's),
    and the payload length in 7 bits, or 126 and 16 bits, or 127 and 64
    bits. What ``websockets.frames.Frame.serialize`` writes for such a
    frame, at a sixth of the cost (it runs once per frame sent)."""
    if size < 126:
        return bytes((0x81, size))
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size)
    return struct.pack("!BBQ", 0x81, 127, size)


ACTION_FRAME_HEAD = b'{"jsonrpc":"2.0","method":"action","params":'


_SEQ_KEY = b'"serverSeq":'


class ActionFrame(OutFrame):
    """An ``action`` notification: its envelope's ``channel`` and per-channel
    ``seq``, and whether it is a rejection (which uses no seq). A plain AHP
    connection numbers what it receives itself (:mod:`server.edge.numbering`):
    :meth:`numbered` is the same frame with another ``serverSeq``."""

    __slots__ = ("channel", "rejected", "seq")

    def __init__(self, payload: bytes, channel: str, seq: int, rejected: bool = False) -> None:
        super().__init__(payload)
        self.channel, self.seq, self.rejected = channel, seq, rejected

    def numbered(self, server_seq: int) -> OutFrame:
        """This frame with ``serverSeq`` set to ``server_seq``, its wire
        bytes made at once (a connection sends it now; making them on first
        use costs three times as much), and made once per number: plain
        connections that have been sent the same frames (the subscribers of
        one chat, mostly) are at the same number, and share it."""
        frame = self._numbered.get(server_seq)
        if frame is None:
            head, tail = self._around_seq
            payload = head + b"%d" % server_seq + tail
            frame = self._numbered[server_seq] = OutFrame(payload)
            frame.__dict__["wire"] = _wire(payload)  # what the cached property would make
        return frame

    @cached_property
    def _numbered(self) -> dict[int, OutFrame]:
        """The renumbered copies made so far, by number (as many as there
        are distinct numbers among the connections that got this frame)."""
        return {}

    @cached_property
    def _around_seq(self) -> tuple[bytes, bytes]:
        """The payload before and after the ``serverSeq`` number, found once
        for all the connections that renumber this frame. The envelope's own
        key is the last one: msgspec writes ``channel, action, serverSeq,
        origin, rejectionReason`` in that order, and a quote in a string
        value is escaped, so the key cannot appear after it."""
        start = self.payload.rindex(_SEQ_KEY) + len(_SEQ_KEY)
        end = start
        while self.payload[end : end + 1].isdigit():
            end += 1
        return self.payload[:start], self.payload[end:]


def action_frame(envelope: bytes, channel: str, seq: int, rejected: bool = False) -> ActionFrame:
    """The ``action`` notification carrying an encoded envelope."""
    return ActionFrame(ACTION_FRAME_HEAD + envelope + b"}", channel, seq, rejected)


def notification(method: str, params: Any) -> bytes:
    """A JSON-RPC notification, encoded."""
    return encode({"jsonrpc": "2.0", "method": method, "params": params})


class AnswerBudget:
    """What is left of one answer's budget as snapshots go into it (an
    answer naming many channels must still fit what its client may leave
    unread). Once one does not fit, the answer is ``full``: no more are
    loaded. ``read`` and ``count``: the bytes and the number of the
    snapshots measured, the one left out too (what the token is charged)."""

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.read = 0
        self.count = 0
        self.full = False

    def takes(self, snapshot: Snapshot) -> bool:
        """Whether ``snapshot`` fits in what is left (then it is taken from
        it; else the answer is full)."""
        size = len(encode(snapshot))
        self.read += size
        self.count += 1
        if size > self.left:
            self.full = True
            return False
        self.left -= size
        return True
