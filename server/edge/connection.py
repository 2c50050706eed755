"""One WebSocket connection's transport: framing, buffering, flood closing.

Incoming text frames are handed, one at a time and in the order they
arrive, to the connection's handler (:class:`server.edge.rpc.Rpc`, which knows
the JSON-RPC methods), so a client's ``dispatchAction`` notifications are
applied in its ``clientSeq`` order. Outgoing frames are written without
blocking: straight into the socket's buffer with the server's direct
writer (no queue, no task: a connection costs memory, thousands are idle),
else through a bounded queue drained by a writer task. A client that
leaves more than ``send_buffer`` bytes unread is closed (1013, "try again
later"; with no close frame at all when its socket takes no more bytes) and
resumes with ``reconnect``; it never slows anyone else down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from protocol.codec import encode
from protocol.messages import ErrorResponse, RequestId, Response, RpcError
from server.config import Limits
from server.core.metrics import Metrics
from server.edge.numbering import Numbering
from server.frames import OVERLOADED, ActionFrame, OutFrame

log = logging.getLogger("huddle.connection")

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_RESYNC = 1012
CLOSE_TRY_AGAIN = 1013


MALFORMED_WEIGHT_CHARS: Final = 16 << 10
"""A malformed frame weighs one more for every this many characters: what
it costs to read grows with its size (a megabyte weighs 65, so that with
the default ``flood_close_after`` sixteen of them in a row close the
connection, where a thousand small ones do)."""


Send = Callable[[str], Awaitable[None]]
Close = Callable[[int, str], Awaitable[None]]


class DirectWrite(Protocol):
    """The server's non-blocking frame writer (see server.edge.serve)."""

    def write(self, frame: bytes, limit: int) -> int: ...

    def abort(self) -> None: ...


Handler = Callable[[str], Awaitable[None]]


class Connection:
    """The transport of one client connection. ``may_see`` says whether a
    sessions-list notice about a session may reach this client (its token's
    scope); ``handler`` handles each incoming text frame."""

    __slots__ = (
        "_abandoned",
        "_close",
        "_closed",
        "_direct",
        "_parked",
        "_send",
        "_sending",
        "_writer",
        "closing",
        "handler",
        "limited_in_a_row",
        "limits",
        "malformed_in_a_row",
        "may_see",
        "metrics",
        "numbering",
        "queue",
        "queued_bytes",
    )

    def __init__(
        self,
        *,
        send: Send,
        close: Close,
        direct: DirectWrite | None = None,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        may_see: Callable[[str], bool] = lambda session: True,
    ) -> None:
        self._send = send
        self._close = close
        self._direct = direct
        self.limits = limits or Limits()
        self.metrics = metrics or Metrics()
        self.may_see = may_see
        self.handler: Handler | None = None
        self.numbering: Numbering | None = None
        """A plain AHP client's own serverSeq sequence (None: the envelopes'
        per-channel seqs go out as they are)."""
        self.queue: asyncio.Queue[OutFrame | None] | None = (
            asyncio.Queue() if direct is None else None
        )
        """Frames for the writer task (None with the direct writer)."""
        self._parked: dict[str, list[OutFrame]] | None = None
        self.queued_bytes = 0
        self.closing: tuple[int, str] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closed: asyncio.Future[None] | None = None
        """With the direct writer: done once the socket is closed."""
        self._sending = False
        self._abandoned = False
        self.limited_in_a_row = 0
        self.malformed_in_a_row = 0
        """The weight of this client's malformed frames since its last good one."""

    # ─── Output ──────────────────────────────────────────────────────────

    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None:
        """Send a frame without blocking. With the server's direct writer the
        frame goes straight to the socket's buffer; otherwise it is queued
        for the writer task. A client with more than ``send_buffer`` bytes
        unread is cut off (1013). ``session`` scopes a sessions-list notice:
        a token that does not reach that session never sees it. An envelope
        of a ``channel`` whose subscribe (or reconnect) is being answered
        waits until that answer is sent: the client must get the snapshot
        before the envelopes that follow it."""
        if self.closing is not None:
            return
        if session is not None and not self.may_see(session):
            return
        if channel is not None and self._parked is not None and channel in self._parked:
            self._parked[channel].append(frame)
            return
        if self.numbering is not None and isinstance(frame, ActionFrame):
            number = (
                self.numbering.counter
                if frame.rejected
                else self.numbering.sent(frame.channel, frame.seq)
            )
            frame = frame.numbered(number)
        if self._direct is not None:
            if self._direct.write(frame.wire, self.limits.send_buffer) == OVERLOADED:
                self._overflow()
            return
        assert self.queue is not None
        self.queued_bytes += len(frame)
        if self.queued_bytes > self.limits.send_buffer:
            self._overflow()
            return
        self.queue.put_nowait(frame)

    def park(self, channel: str) -> None:
        """Hold ``channel``'s envelopes until :meth:`release_parked` (the
        answer to a subscribe or reconnect goes out first)."""
        if self._parked is None:
            self._parked = {}
        self._parked.setdefault(channel, [])

    def unpark(self, channel: str) -> None:
        """Drop what is held of ``channel`` (left out of the answer: its
        client gets no snapshot of it, so nothing after one either)."""
        if self._parked is not None:
            self._parked.pop(channel, None)

    def release_parked(self) -> None:
        parked, self._parked = self._parked, None
        if parked is None:
            return
        for frames in parked.values():
            for frame in frames:
                self.send_frame(frame)

    def _overflow(self) -> None:
        self.metrics.queue_overflow()
        self.shut(CLOSE_TRY_AGAIN, "send buffer full: reconnect to resume")

    def resync(self, channel: str) -> None:
        self.shut(CLOSE_RESYNC, f"{channel} lost its log: reconnect for a snapshot")

    def shut(self, code: int, reason: str) -> None:
        """Close after the frames already sent. A client cut off for not
        reading is dropped at once: it would not read a close frame either."""
        if self.closing is not None:
            return
        self.closing = (code, reason)
        if self.queue is None:
            if code == CLOSE_TRY_AGAIN and self._direct is not None:
                self._direct.abort()
            # Every frame is in the socket's buffer already: close now.
            self._writer = asyncio.get_running_loop().create_task(self._close_direct(code, reason))
            return
        if code == CLOSE_TRY_AGAIN:
            while not self.queue.empty():
                self.queue.get_nowait()
            if self._sending and self._writer is not None:
                # The writer is stuck in a send: give up on the socket now
                # instead of holding the connection for as long as the peer
                # likes.
                self._abandoned = True
                self._writer.cancel()
        self.queue.put_nowait(None)

    def start_writer(self) -> asyncio.Future[None]:
        """Start :meth:`writer` as a task (with the direct writer, nothing
        needs to run); what it returns is done when the connection is
        closed (or given up after its send buffer overflowed)."""
        if self.queue is None:
            self._closed = asyncio.get_running_loop().create_future()
            if self._writer is not None and self._writer.done():
                self._closed.set_result(None)  # closed already
            return self._closed
        self._writer = asyncio.create_task(self.writer())
        return self._writer

    async def _close_direct(self, code: int, reason: str) -> None:
        try:
            await self._close(code, reason)
        finally:
            if self._closed is not None and not self._closed.done():
                self._closed.set_result(None)

    async def writer(self) -> None:
        """Send queued frames (only without a direct writer), then close."""
        assert self.queue is not None
        try:
            while True:
                frame = await self.queue.get()
                if frame is None:
                    break
                self.queued_bytes -= len(frame)
                self._sending = True
                try:
                    await self._send(frame.text)
                finally:
                    self._sending = False
        except asyncio.CancelledError:
            if not self._abandoned:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return
        code, reason = self.closing or (CLOSE_NORMAL, "")
        await self._close(code, reason)

    def respond(self, request_id: RequestId, result: Any) -> None:
        self.send_frame(OutFrame(encode(Response(id=request_id, result=result))))

    def error(
        self, request_id: RequestId | None, code: int, message: str, data: Any = None
    ) -> None:
        error = RpcError(code=code, message=message, data=data)
        self.send_frame(OutFrame(encode(ErrorResponse(id=request_id, error=error))))

    # ─── Input ───────────────────────────────────────────────────────────

    async def receive_frame(self, text: str) -> None:
        """Handle one incoming text frame."""
        if self.handler is not None:
            await self.handler(text)

    def count_action(self, *, limited: bool) -> None:
        """Count one action: a client whose actions keep being refused by
        its rate limit, ``flood_close_after`` in a row, is closed (1008)."""
        if not limited:
            self.limited_in_a_row = 0
            return
        self.limited_in_a_row += 1
        if self.limited_in_a_row >= self.limits.flood_close_after:
            self.shut(CLOSE_POLICY, "too many actions: flood")

    def count_frame(self, malformed_size: int | None) -> None:
        """Count one incoming frame: None for a good one, else the size (in
        characters) of a malformed one, which weighs one and one more per
        ``MALFORMED_WEIGHT_CHARS`` it holds. A client whose malformed frames
        in a row weigh ``flood_close_after`` is closed (1008), as one whose
        actions keep being rate-limited is (:meth:`count_action`). A good
        frame halves the weight rather than clearing it: a ping between
        floods of malformed frames buys little, an occasional error in a
        long life is soon forgotten."""
        if malformed_size is None:
            self.malformed_in_a_row //= 2
            return
        self.malformed_in_a_row += 1 + malformed_size // MALFORMED_WEIGHT_CHARS
        if self.malformed_in_a_row >= self.limits.flood_close_after:
            self.shut(CLOSE_POLICY, "too many malformed frames: flood")
