"""``serverSeq`` as a plain AHP connection sees it: one number for all.

Huddle numbers each channel's envelopes on their own (gapless, per channel:
what the store orders). AHP 0.7's client keeps one number, the largest
``serverSeq`` it has seen on any channel, and reconnects with it: per
channel seqs could not tell where it stands on each channel. So a plain
connection gets its own sequence: every envelope sent on it is numbered one
more than the last (a rejection repeats the current number, a snapshot's
``fromSeq`` and ``initialize``'s ``serverSeq`` are the current number), in
the order it is written to that socket. The client has then seen exactly
the numbers up to the one it reports, and :meth:`Numbering.cursor` maps that
number back to the per-channel seq it had reached on each channel.

A connection's numbering outlives it for a while (:class:`Retired`), so
that the same client reconnecting to the same process resumes with an
exact replay; anywhere else, or once forgotten, it gets snapshots, which
AHP allows ("a snapshot is always a correct answer"). Numbers keep growing
across the reconnects of a client: a new connection continues from the
old one's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

from server.cache import Lru

WINDOW: Final = 1000
"""Numbers remembered per connection (the replay window of a plain client)."""


class Numbering:
    """The sequence of one plain connection (see the module docstring)."""

    def __init__(self, start: int = 0, window: int = WINDOW) -> None:
        self.counter = start
        self.window = window
        self._sent: deque[tuple[int, str, int]] = deque()
        """(number, channel, channel seq), oldest first: what the client had
        on the channel once it had seen the number."""
        self._before: dict[str, tuple[int, int]] = {}
        """Per channel, the newest entry that left ``_sent``."""

    def sent(self, channel: str, seq: int) -> int:
        """Number an envelope of ``channel`` at channel seq ``seq``."""
        self.counter += 1
        self._remember(channel, seq)
        return self.counter

    def mark(self, channel: str, seq: int) -> int:
        """A snapshot of ``channel`` at ``seq`` goes out now: its ``fromSeq``
        (the current number, which it does not use up)."""
        self._remember(channel, seq)
        return self.counter

    def _remember(self, channel: str, seq: int) -> None:
        self._sent.append((self.counter, channel, seq))
        while len(self._sent) > self.window:
            number, old_channel, old_seq = self._sent.popleft()
            self._before[old_channel] = (number, old_seq)

    def rewound(self, seen: int) -> Numbering:
        """This numbering as of number ``seen`` (what the client has seen),
        to go on from there: what was numbered after it never arrived."""
        while self._sent and self._sent[-1][0] > seen:
            self._sent.pop()
        self.counter = min(self.counter, seen)
        return self

    def forget(self, channel: str) -> None:
        """The client no longer follows ``channel``."""
        self._before.pop(channel, None)

    def cursor(self, channel: str, seen: int) -> int | None:
        """The seq of ``channel`` a client had once it had seen every number
        up to ``seen``; None when that is not known (never subscribed here,
        forgotten, or a number this connection never sent)."""
        if seen > self.counter:
            return None
        for number, name, seq in reversed(self._sent):
            if name == channel and number <= seen:
                return seq
        before = self._before.get(channel)
        if before is not None and before[0] <= seen:
            return before[1]
        return None


class Retired:
    """The numberings of plain connections that closed, by client id, for
    ``keep`` seconds (at most ``size`` of them)."""

    def __init__(
        self,
        *,
        keep: float = 600.0,
        size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep = keep
        self.clock = clock
        self._numberings: Lru[str, tuple[float, Numbering]] = Lru(size)

    def retire(self, client_id: str, numbering: Numbering) -> None:
        self._numberings.put(client_id, (self.clock(), numbering))

    def take(self, client_id: str) -> Numbering | None:
        """The numbering ``client_id`` left, if it is still kept (it is
        taken: a connection resumes from it once)."""
        kept = self._numberings.pop(client_id)
        if kept is None or self.clock() - kept[0] > self.keep:
            return None
        return kept[1]
