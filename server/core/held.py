"""The channels one process holds in memory, and which it lets go.

A channel is loaded on first use (watched first, so that no append falls
between the load and its hints) and kept while it is served (subscribed
to or pinned: a runner turn waiting on a chat here pins it); the others
are evicted and no longer watched once unused for :attr:`HeldChannels.keep`
seconds (:data:`IDLE_KEEP`), and sooner, least recently used first, beyond
:attr:`HeldChannels.most` of them (:data:`IDLE_CHANNELS`). So a process
stops hearing a chat soon after its last subscriber and its last waiting
turn there have gone, and pays nothing for what other processes write to
it then. :class:`HeldChannel` is the mutable record of one;
callers outside the core see a :class:`ChannelView`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from protocol.codec import convert_state
from protocol.messages import ChannelState
from protocol.uris import channel_kind
from reducers import reduce
from server.core.background import Background
from server.errors import StoreError
from server.frames import OutFrame
from server.store.base import ChannelStore, decode_entry

log = logging.getLogger("huddle.channels")

IDLE_CHANNELS = 1000
"""Channels kept in memory while nobody here subscribes to or waits on
them; the least recently used beyond are evicted (and no longer watched)."""
IDLE_KEEP = 2.0
"""Seconds a channel nobody here serves is kept after its last use (a
read, a write, its last subscriber or pin gone): long enough that a
worker writing a turn's steps into a chat, or a client that reconnects,
finds it held; short enough that a process soon stops hearing chats it no
longer serves."""


class Subscriber(Protocol):
    """A connection that receives frames; ``send_frame`` never blocks (a
    subscriber that cannot keep up disconnects itself). ``session`` names
    the session a sessions-list notice is about; ``channel`` the channel an
    action envelope belongs to."""

    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None: ...

    def resync(self, channel: str) -> None:
        """The channel's log was lost: the subscriber must start over."""


@dataclass(frozen=True, slots=True)
class ChannelView:
    """A channel at one moment: its URI, state and seq, and about how many
    bytes its state takes as JSON (``size``: exact at each snapshot, plus
    the bytes of each envelope since; an envelope carries more than it
    adds, so this errs on the large side, by at most a snapshot's worth of
    envelopes)."""

    uri: str
    state: ChannelState
    seq: int
    size: int = 0


@dataclass
class HeldChannel:
    """A channel as this process holds it."""

    uri: str
    state: ChannelState
    seq: int
    epoch: str
    size: int = 0
    """About how many bytes the state takes as JSON (see ChannelView)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    subscribers: set[Subscriber] = field(default_factory=set)
    since_snapshot: int = 0
    since_snapshot_bytes: int = 0
    remote_head: int = 0
    hints: dict[int, bytes] = field(default_factory=dict)
    """Entries other processes announced, by seq, not yet applied."""
    hint_bytes: int = 0
    pins: int = 0
    """Callers that need the channel kept current without subscribing."""
    catching_up: bool = False
    follow_later: asyncio.TimerHandle | None = None
    """The catch-up waiting UNSUBSCRIBED_FOLLOW, if any."""
    appending: bool = False
    unconfirmed: tuple[int, bytes] | None = None
    """An append of this process whose answer was lost (its seq and entry):
    if the log holds it at that seq, it is this process's (its hooks run as
    for a local action: the audit records it, the session hears of it)."""

    idle_since: float = 0.0
    """When it was last used while not served (the loop's clock)."""
    let_go: asyncio.TimerHandle | None = None
    """The check that evicts it once unused for ``HeldChannels.keep``."""

    last_view: ChannelView | None = None
    """The view last made, given again while the channel has not moved
    (a view is asked for several times for each action)."""

    def view(self) -> ChannelView:
        last = self.last_view
        if (
            last is not None
            and last.state is self.state
            and last.seq == self.seq
            and last.size == self.size
        ):
            return last
        self.last_view = last = ChannelView(self.uri, self.state, self.seq, self.size)
        return last

    @property
    def served(self) -> bool:
        return bool(self.subscribers) or self.pins > 0

    def keep_hints_after(self, seq: int | None) -> None:
        """Forget the hints up to ``seq`` (all of them when None)."""
        self.hints = {} if seq is None else {s: r for s, r in self.hints.items() if s > seq}
        self.hint_bytes = sum(len(r) for r in self.hints.values())


class HeldChannels:
    """The channels this process holds, loaded on first use; the idle ones
    (not served) are let go once unused for :attr:`keep` seconds, and those
    beyond :attr:`most` at once, least recently used first."""

    def __init__(self, store: ChannelStore, background: Background) -> None:
        self.store = store
        self.background = background
        self.most = IDLE_CHANNELS
        self.keep = IDLE_KEEP
        self._channels: dict[str, HeldChannel] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()
        """Channels held but not served (no subscriber, no pin), oldest first."""
        self._leaving: dict[str, asyncio.Future[None]] = {}
        """Evicted channels whose unwatch is under way: a load waits for it."""
        self._loading: dict[str, asyncio.Future[HeldChannel]] = {}

    def __len__(self) -> int:
        return len(self._channels)

    def get(self, uri: str) -> HeldChannel | None:
        return self._channels.get(uri)

    def all(self) -> list[HeldChannel]:
        return list(self._channels.values())

    async def load(self, uri: str) -> HeldChannel:
        """The channel ``uri``, loaded from the store unless held already or
        being loaded (then that load's); raises ChannelGone (and
        BadChannelUri for a malformed URI)."""
        found = self._channels.get(uri)
        if found is not None:
            return found
        pending = self._loading.get(uri)
        if pending is not None:
            return await asyncio.shield(pending)
        leaving = self._leaving.get(uri)
        if leaving is not None:
            await asyncio.shield(leaving)  # its unwatch must not undo our watch
            return await self.load(uri)
        future: asyncio.Future[HeldChannel] = asyncio.get_running_loop().create_future()
        self._loading[uri] = future
        try:
            # Watch first: no append falls between the load and its hints.
            await self.store.watch(uri)
            ch = await self.read(uri)
            self._channels[uri] = ch
            self.touch(ch, using=True)
            future.set_result(ch)
            return ch
        except BaseException as error:
            if isinstance(error, Exception):  # gone, malformed, store down
                await self.store.unwatch(uri)
            future.set_exception(error)
            future.exception()  # consumed here: waiters re-raise it
            raise
        finally:
            del self._loading[uri]

    async def read(self, uri: str) -> HeldChannel:
        """``uri`` as the store holds it now (its snapshot and the log
        after), not held here."""
        kind = channel_kind(uri)
        stored = await self.store.load(uri)
        state = convert_state(json.loads(stored.snapshot), kind)
        for raw in stored.log:
            entry = decode_entry(raw)
            state = reduce(state, entry.envelope.action, entry.time)
        size = len(stored.snapshot) + sum(len(raw) for raw in stored.log)
        return HeldChannel(uri=uri, state=state, seq=stored.seq, epoch=stored.epoch, size=size)

    def touch(self, ch: HeldChannel, *, using: bool = False) -> None:
        """Note that ``ch`` was used: an idle one becomes the newest idle one,
        and the oldest beyond :attr:`most` are evicted; but not ``ch``
        when the caller is ``using`` it (it was loaded to be used: to be
        subscribed to, pinned or read)."""
        if ch.served:
            self._idle.pop(ch.uri, None)
            _stop_timer(ch)
            return
        self._idle[ch.uri] = None
        self._idle.move_to_end(ch.uri)
        ch.idle_since = asyncio.get_running_loop().time()
        if ch.let_go is None:
            self._let_go_in(ch, self.keep)
        busy: list[str] = []
        while len(self._idle) > self.most:
            oldest = next(iter(self._idle))
            if using and oldest == ch.uri:
                break  # the only idle one left: it goes at a later touch
            del self._idle[oldest]
            if self._evict(oldest):
                busy.append(oldest)
        for uri in busy:
            self._idle[uri] = None  # in use now (a write, a catch-up): at a later touch

    def _let_go_in(self, ch: HeldChannel, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        ch.let_go = loop.call_later(max(0.0, seconds), self._let_go, ch)

    def _let_go(self, ch: HeldChannel) -> None:
        """Evict ``ch`` if it was not used for :attr:`keep` seconds; else
        look again when it will not have been (a touch only notes the time:
        no timer per use)."""
        ch.let_go = None
        if self._channels.get(ch.uri) is not ch or ch.served:
            return
        unused = asyncio.get_running_loop().time() - ch.idle_since
        if unused < self.keep:
            self._let_go_in(ch, self.keep - unused)
            return
        self._idle.pop(ch.uri, None)
        if self._evict(ch.uri):
            self._idle[ch.uri] = None  # busy: it goes once unused again
            self._let_go_in(ch, self.keep)

    def _evict(self, uri: str) -> bool:
        """Evict an idle channel; True when it is busy (locked, catching
        up) and stays, still idle."""
        ch = self._channels.get(uri)
        if ch is None or ch.served:
            return False
        if ch.lock.locked() or ch.catching_up:
            return True
        _stop_timer(ch)
        del self._channels[uri]
        task = self.background.spawn(self._unwatch(uri))
        if task is not None:
            self._leaving[uri] = task
        return False

    async def _unwatch(self, uri: str) -> None:
        try:
            await self.store.unwatch(uri)
        except StoreError as error:
            log.warning("could not stop watching %s: %s", uri, error)
        finally:
            self._leaving.pop(uri, None)

    def forget(self, uri: str) -> HeldChannel | None:
        """Stop holding ``uri`` (it is being dropped); the channel it was."""
        self._idle.pop(uri, None)
        ch = self._channels.pop(uri, None)
        if ch is not None:
            _stop_timer(ch)
        return ch


def _stop_timer(ch: HeldChannel) -> None:
    if ch.let_go is not None:
        ch.let_go.cancel()
        ch.let_go = None
