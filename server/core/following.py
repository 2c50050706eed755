"""Keeping the channels held here current with what other processes append.

Envelopes other processes append reach this process through the store's
listener (:meth:`Following.envelope_appended`, a hint per entry) and are
applied in seq order, without validation (they were validated where they
were accepted): at once for a channel served here (subscribed or pinned),
a moment later (:data:`UNSUBSCRIBED_FOLLOW`) for one only held, and in any
case before a read or a write of it here (:meth:`Following.current`). A
hint lost is found by comparing heads (:meth:`Following.check_heads`); a
log the store lost is given back (:meth:`Following.restore`) or, when its
epoch changed, loaded afresh (:meth:`Following.reload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from protocol.codec import encode
from server.core.background import Background, FollowUps
from server.core.held import HeldChannel, HeldChannels
from server.store.base import ChannelStore

log = logging.getLogger("huddle.channels")

MAX_HINTS = 1000
MAX_HINT_BYTES = 4 << 20
"""Announced entries kept per channel while they cannot be applied yet (at
most this many, and bytes): beyond, the log is read instead."""
UNSUBSCRIBED_FOLLOW = 0.005
"""Seconds a channel nobody here subscribes to or pins waits before it
applies what other processes appended (its hooks hear it then). Nobody is
shown it, and a read or a write here applies it first: the work waits
until what this process has at hand is done (a worker's save of a turn,
whose reply would otherwise be read after it), and a burst is applied in
one go."""

ApplyEntry = Callable[[HeldChannel, bytes, FollowUps], None]
"""The core's: apply one stored entry to a channel (its hooks run)."""


class Following:
    """Catches the channels held here up with the store."""

    def __init__(
        self,
        store: ChannelStore,
        held: HeldChannels,
        background: Background,
        apply_entry: ApplyEntry,
    ) -> None:
        self.store = store
        self._held = held
        self.background = background
        self._apply_entry = apply_entry

    async def catch_up(
        self, ch: HeldChannel, follow_ups: FollowUps, *, behind: bool = False
    ) -> None:
        """Apply what other processes appended after ``ch.seq`` (lock held):
        the announced entries while they follow on, then the store's log
        when some are still missing (or ``behind``: a conflict said so)."""
        while (raw := ch.hints.pop(ch.seq + 1, None)) is not None:
            self._apply_entry(ch, raw, follow_ups)
        ch.keep_hints_after(ch.seq)
        if ch.remote_head <= ch.seq and not behind:
            return
        entries = await self.store.read_log(ch.uri, ch.seq, ch.epoch)
        if entries is None:
            await self.reload(ch)
            return
        for raw in entries:
            self._apply_entry(ch, raw, follow_ups)

    @contextlib.asynccontextmanager
    async def current(self, ch: HeldChannel) -> AsyncIterator[None]:
        """Hold ``ch``'s lock with what was heard of it applied (:meth:`heard`);
        the follow-ups of what that applied run once the lock is released."""
        follow_ups: FollowUps = []
        try:
            async with ch.lock:
                await self.heard(ch, follow_ups)
                yield
        finally:
            await self.background.follow_ups(follow_ups, f"catching up {ch.uri}")

    async def heard(self, ch: HeldChannel, follow_ups: FollowUps) -> None:
        """Apply what was heard of ``ch`` and not applied yet (lock held):
        what is read or written next builds on it (UNSUBSCRIBED_FOLLOW)."""
        if ch.remote_head > ch.seq:
            await self.catch_up(ch, follow_ups)

    async def restore(self, ch: HeldChannel) -> None:
        """The store is behind what this process saw: it lost acknowledged
        appends. Give it back the state we hold, under a new epoch; every
        other process then reloads it, and its subscribers start over."""
        snapshot = encode(ch.state)
        ch.size = len(snapshot)
        epoch = await self.store.restore(ch.uri, ch.seq, snapshot)
        log.warning("%s: the store lost appends up to %d; restored them", ch.uri, ch.seq)
        if epoch is not None:
            ch.epoch = epoch
            ch.keep_hints_after(None)
            ch.remote_head = ch.seq  # what was heard of the lost log is gone with it

    async def reload(self, ch: HeldChannel) -> None:
        """The log we knew is gone (epoch changed or trimmed past us): load
        afresh and make every subscriber start over."""
        fresh = await self._held.read(ch.uri)
        ch.state, ch.seq, ch.epoch, ch.size = fresh.state, fresh.seq, fresh.epoch, fresh.size
        ch.keep_hints_after(None)
        ch.remote_head = ch.seq  # the load holds what was heard
        ch.unconfirmed = None
        for subscriber in list(ch.subscribers):
            subscriber.resync(ch.uri)
        ch.subscribers.clear()
        self._held.touch(ch)

    def envelope_appended(self, channel: str, seq: int, envelope: bytes) -> None:
        ch = self._held.get(channel)
        if ch is None or seq <= ch.seq:
            return
        if len(ch.hints) < MAX_HINTS and ch.hint_bytes + len(envelope) <= MAX_HINT_BYTES:
            ch.hints[seq] = envelope  # kept even now: a conflict uses it
            ch.hint_bytes += len(envelope)
        if ch.appending and seq == ch.seq + 1:
            return  # most likely our own append; a conflict would catch us up
        ch.remote_head = max(ch.remote_head, seq)
        if ch.served and ch.follow_later is not None:
            # Subscribed (or pinned) since: no more waiting.
            ch.follow_later.cancel()
            ch.follow_later, ch.catching_up = None, False
        if not ch.catching_up:
            ch.catching_up = True
            if ch.served:
                self.background.spawn(self._follow(ch))
            else:
                loop = asyncio.get_running_loop()
                ch.follow_later = loop.call_later(UNSUBSCRIBED_FOLLOW, self._follow_later, ch)

    def _follow_later(self, ch: HeldChannel) -> None:
        ch.follow_later = None
        if self.background.spawn(self._follow(ch)) is None:
            ch.catching_up = False  # stopped: a start follows it again

    async def _follow(self, ch: HeldChannel) -> None:
        follow_ups: FollowUps = []
        try:
            async with ch.lock:
                if ch.remote_head > ch.seq:
                    await self.catch_up(ch, follow_ups)
        finally:
            ch.catching_up = False
            await self.background.follow_ups(follow_ups, f"catching up {ch.uri}")

    async def check_heads(self, *, idle: bool = False) -> None:
        """Catch up every channel served here (with subscribers, or pinned)
        or holding an append whose answer was lost, that is behind the
        store (or whose log changed its epoch: then subscribers start over);
        with ``idle``, the channels held here unserved too."""
        watched = [
            ch.uri for ch in self._held.all() if idle or ch.served or ch.unconfirmed is not None
        ]
        if not watched:
            return
        heads = await self.store.heads(watched)
        for uri in watched:
            ch = self._held.get(uri)
            head = heads.get(uri)
            if ch is None or head is None:
                continue
            epoch, seq = head
            if epoch == ch.epoch and seq <= ch.seq:
                continue
            follow_ups: FollowUps = []
            try:
                async with ch.lock:
                    if epoch != ch.epoch:
                        await self.reload(ch)
                    else:
                        await self.catch_up(ch, follow_ups, behind=True)
            finally:
                await self.background.follow_ups(follow_ups, f"catching up {uri}")
