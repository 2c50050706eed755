"""The channel core: one writer per channel, every subscriber in order.

A change of state is a pure :func:`step` (validate, reduce, build the
envelope) that the I/O part commits::

    step(view, action, origin, now) -> envelope and the state after it
    -> append to the store (compare-and-set on the channel's seq)
    -> the same frame bytes to every subscriber -> hooks

A rejected action raises :class:`ActionRejected` and consumes no seq. When
another process appended first, the core catches up from the store log,
steps again and retries, so no subscriber ever sees a gap or a reordering.
Envelopes other processes append reach this process through the store's
listener and are applied the same way (without validation: they were
validated where they were accepted): at once for a channel served here
(subscribed or pinned), a moment later (:data:`UNSUBSCRIBED_FOLLOW`) for one
only held, and in any case before a read or a write of it here.

Hooks (one style): every applied envelope, this process's and other
processes', is handed to each hook in seq order as an :class:`Applied`,
while the channel's lock is held. A hook observes; the work it needs to do
in response (dispatching elsewhere, resuming a turn) it returns as an
awaitable, which the core awaits after releasing the lock, in hook order:
:meth:`ChannelCore.write` returns once the follow-ups of its own envelope
(and of any other process's envelopes it caught up on first) are done. They
run in a task of the core's: a caller cancelled meanwhile leaves them
running, and a stop waits for them (:meth:`ChannelCore.settle`).

Callers see a channel as a :class:`ChannelView`: its state and seq at one
moment, never the mutable record the core keeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from msgspec.structs import replace

from protocol.actions import ChatTurnStarted, StateAction, action_type
from protocol.codec import encode
from protocol.messages import (
    ActionEnvelope,
    ActionOrigin,
    ChannelState,
    MissingResume,
    ReplayResume,
    Resume,
    Snapshot,
    SnapshotResume,
)
from protocol.rejections import Rejection, RejectionCode
from protocol.uris import ROOT_URI
from reducers import reduce
from server.auth import Identity
from server.core.background import Background, FollowUps
from server.core.following import UNSUBSCRIBED_FOLLOW as UNSUBSCRIBED_FOLLOW
from server.core.following import Following
from server.core.held import ChannelView as ChannelView
from server.core.held import HeldChannel, HeldChannels
from server.core.held import Subscriber as Subscriber
from server.core.policy import stamped, turn_stamp
from server.errors import (
    ActionRejected,
    AlreadyApplied,
    ChannelGone,
    SeqConflict,
    StoreError,
    StoreUnavailable,
)
from server.frames import OutFrame, action_frame
from server.periodic import Periodic
from server.store.base import (
    ChannelStore,
    ClientAction,
    Listener,
    Rider,
    decode_entry,
    encode_entry,
)

log = logging.getLogger("huddle.channels")

MAX_APPEND_ATTEMPTS = 50
"""Compare-and-set attempts before an append is given up as too contended;
from the third on, each waits a little (random) so two processes that keep
colliding fall out of step."""
SNAPSHOT_BYTES = 4 << 20
"""Bytes of entries after which a snapshot is saved even before
``snapshot_every`` actions, so that the log a load reads stays bounded."""


@dataclass(frozen=True, slots=True)
class Applied:
    """An envelope just applied to a channel: ``before`` is the state it
    was applied to, ``view`` the channel after it, ``sender`` who sent it
    (the server's identity of the sender; None for the server's own
    actions). ``local`` when this process accepted it (False: another
    process's, caught up here); ``latency`` is the seconds from the write's
    start to the broadcast."""

    view: ChannelView
    envelope: ActionEnvelope
    before: ChannelState
    sender: Identity | None
    local: bool
    latency: float = 0.0

    @property
    def uri(self) -> str:
        return self.view.uri

    @property
    def action(self) -> StateAction:
        return self.envelope.action


Hook = Callable[[Applied], Awaitable[None] | None]
"""Called for every applied envelope, in seq order, with the channel's lock
held; returns the follow-up work to await once the lock is released."""

Validator = Callable[[ChannelView, StateAction], Rejection | None]
"""Why ``action`` may not be applied to the channel as it is, or None."""

Change = Callable[[ChannelState], StateAction | None]
"""The action to apply to a channel's current state (None: none)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What applying an action makes: the envelope, its bytes and the state."""

    envelope: ActionEnvelope
    data: bytes
    after: ChannelState


@dataclass(slots=True)
class Hooks:
    """The core's hooks, in named phases run in this order on every
    applied envelope (each phase's hooks in their list's order, as are
    their follow-ups):

    * ``recorded``: what must be durable before this process shows its own
      action to anyone, its sender's echo included (the audit's record: an
      action acknowledged is never one a crash leaves unrecorded); their
      follow-ups are awaited, under the channel's lock, before the envelope
      goes out (a failure is logged, and the envelope goes out all the
      same: it is in the log);
    * ``bookkeeping``: what the envelope settles of the host's own
      records (waiters woken, a form read ahead, an expiry armed or
      disarmed);
    * ``reactions``: who acts on it (the runner's bridge, the metrics);
    * ``records``: the session's view of it, which people wait for last
      (notes, audit, the session's aggregate).
    """

    recorded: list[Hook] = field(default_factory=list)
    bookkeeping: list[Hook] = field(default_factory=list)
    reactions: list[Hook] = field(default_factory=list)
    records: list[Hook] = field(default_factory=list)

    def __iter__(self) -> Iterator[Hook]:
        yield from self.recorded
        yield from self.bookkeeping
        yield from self.reactions
        yield from self.records


Riding = Callable[[str, Step, Identity | None], Rider | None]
"""Asked, before this process appends an action it accepted on channel
``uri`` (its :class:`Step` and sender), for a write of another store's that
belongs with it (server.store.base.Rider), or None. The store runs a rider
it carries with the append; the hook that made it reads the outcome from
the rider when the envelope is applied (its seq is the step's)."""

Ahead = Callable[[str, Step, Identity | None], Awaitable[None] | None]
"""Asked, with the channel's lock held, for every action this process is
about to append (validated: its :class:`Step`, and its sender) for a write
that must be durable before the action is, because a crash right after the
append must not lose what the action makes known (server.notify.outbox's
event of a wait opened or settled), or None. The write may be made for an
append that then does not land (a conflict, the store away): whoever reads
it checks the channel. A write that fails keeps the action from being
appended."""


def step(
    view: ChannelView,
    action: StateAction,
    origin: ActionOrigin | None,
    now_ms: int,
    validate: Validator | None = None,
) -> Step | Rejection:
    """The next envelope of ``view`` for ``action``, or why it is rejected.
    Pure: the caller commits the step (or drops it)."""
    if validate is not None:
        rejection = validate(view, action)
        if rejection is not None:
            return rejection
    after = reduce(view.state, action, now_ms)
    envelope = ActionEnvelope(
        channel=view.uri, action=action, server_seq=view.seq + 1, origin=origin
    )
    return Step(envelope=envelope, data=encode(envelope), after=after)


class ChannelCore(Listener):
    """The channels this process serves; see the module docstring. Call
    :meth:`start` before use and :meth:`stop` at the end."""

    def __init__(
        self,
        store: ChannelStore,
        *,
        clock: Callable[[], float] = time.time,
        snapshot_every: int = 100,
        idle_check_interval: float = 2.0,
        hooks: Hooks | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.snapshot_every = snapshot_every
        self.idle_check_interval = idle_check_interval
        self._idle_check = Periodic(
            self.check_heads,
            idle_check_interval,
            log=log,
            what="idle check",
            expected=(StoreError,),
        )
        """Now and then, compare every watched channel with the store's head:
        an append whose hint was lost is applied within one interval."""
        self.hooks = hooks if hooks is not None else Hooks()
        self.riders: list[Riding] = []
        self.aheads: list[Ahead] = []
        self.background = Background()
        self._held = HeldChannels(store, self.background)
        self._following = Following(store, self._held, self.background, self._apply_entry)
        self._remove_listener: Callable[[], None] | None = None

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def idle_channels(self) -> int:
        """Channels kept while nobody here serves them (server.core.held)."""
        return self._held.most

    @idle_channels.setter
    def idle_channels(self, most: int) -> None:
        self._held.most = most

    @property
    def idle_keep(self) -> float:
        """Seconds a channel nobody here serves is kept after its last use
        (server.core.held)."""
        return self._held.keep

    @idle_keep.setter
    def idle_keep(self, seconds: float) -> None:
        self._held.keep = seconds

    # ─── Lifecycle ───────────────────────────────────────────────────────

    async def start(self) -> None:
        """Listen to other processes (and compare heads now and then)."""
        self.background.start()
        self._remove_listener = self.store.add_listener(self)
        if self.idle_check_interval > 0:
            self._idle_check.start()

    async def stop(self) -> None:
        await self._idle_check.stop()
        if self._remove_listener is not None:
            self._remove_listener()
        self.background.stop()

    def spawn(self, coro: Awaitable[None]) -> asyncio.Future[None] | None:
        """Run ``coro`` in the background (server.core.background); None
        once stopped."""
        return self.background.spawn(coro)

    async def settle(self, until: float) -> None:
        """At a stop, before the hooks' owners stop: an append of this
        process whose answer was lost is read back (if the log holds it,
        its hooks run as for a local action), then the follow-ups and other
        background work still running are waited for; both while the store
        refuses, up to ``until`` (``time.monotonic()``). What is still
        running then is logged, and left to :meth:`stop`."""
        pause = 0.05
        while unconfirmed := [ch for ch in self._held.all() if ch.unconfirmed is not None]:
            left = until - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):  # the channels at once, within the time left
                    await asyncio.gather(*(self._read_back(ch) for ch in unconfirmed))
            except (StoreError, TimeoutError) as error:
                if time.monotonic() + pause >= until:
                    reason = str(error) or "out of time"
                    log.error(
                        "%d appends whose answer was lost are unread: %s", len(unconfirmed), reason
                    )
                    break
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
        await self.background.wait(until)

    async def _read_back(self, ch: HeldChannel) -> None:
        """Whether ``ch``'s unconfirmed append landed: the log after what this
        process holds is applied (its hooks run), and the append is known
        not to have landed when the log holds nothing after it."""
        follow_ups: FollowUps = []
        try:
            async with ch.lock:
                if ch.unconfirmed is not None:
                    try:
                        await self._following.catch_up(ch, follow_ups, behind=True)
                    except StoreError:
                        raise  # tried again while the stop waits
                    except Exception:
                        log.exception("could not read back %s", ch.uri)
                    ch.unconfirmed = None  # applied as ours, as another's, or never landed
        finally:
            await self.background.follow_ups(follow_ups, f"reading back {ch.uri}")

    # ─── Reading ─────────────────────────────────────────────────────────

    async def view(self, uri: str) -> ChannelView:
        """The channel ``uri`` now, loaded from the store on first use;
        raises ChannelGone (and BadChannelUri for a malformed URI)."""
        return (await self._channel(uri)).view()

    def cached(self, uri: str) -> ChannelView | None:
        """The channel as this process holds it, without loading it."""
        ch = self._held.get(uri)
        return None if ch is None else ch.view()

    async def _channel(self, uri: str) -> HeldChannel:
        """The channel, loaded on first use, with what was heard of it
        applied (UNSUBSCRIBED_FOLLOW): whoever reads, subscribes, resumes
        or pins gets no older state than this process heard of."""
        found = self._held.get(uri)
        if found is None:
            return await self._held.load(uri)
        self._held.touch(found, using=True)
        if found.remote_head > found.seq and not found.lock.locked():
            async with self._following.current(found):
                pass
        return found

    def held(self) -> int:
        """How many channels this process holds in memory."""
        return len(self._held)

    # ─── Creating and dropping ───────────────────────────────────────────

    async def create(self, uri: str, state: ChannelState) -> bool:
        """Create ``uri`` at seq 0 with ``state``; False if it exists."""
        return await self.store.create(uri, encode(state))

    async def drop(self, uri: str) -> None:
        """Forget ``uri`` here and delete it from the store; its subscribers
        hear no more."""
        ch = self._held.forget(uri)
        if ch is not None:
            ch.subscribers.clear()
        await self.store.delete(uri)
        await self.store.unwatch(uri)

    # ─── Writing ─────────────────────────────────────────────────────────

    async def write(
        self,
        uri: str,
        action: StateAction,
        *,
        origin: ActionOrigin | None = None,
        seq_scope: str | None = None,
        sender: Identity | None = None,
        validate: Validator | None = None,
    ) -> Applied:
        """Validate, reduce, append and broadcast ``action`` on ``uri``, then
        await the hooks' follow-ups. Returns the accepted envelope's event.
        ``sender`` is who sent it (None: the server itself), kept with the
        entry. Raises ActionRejected (nothing changed, no seq used),
        ChannelGone, or StoreUnavailable."""
        event = await self.update(
            uri,
            lambda _: action,
            origin=origin,
            seq_scope=seq_scope,
            sender=sender,
            validate=validate,
        )
        assert event is not None
        return event

    async def update(
        self,
        uri: str,
        change: Change,
        *,
        origin: ActionOrigin | None = None,
        seq_scope: str | None = None,
        sender: Identity | None = None,
        validate: Validator | None = None,
    ) -> Applied | None:
        """As :meth:`write`, with the action ``change`` makes of the channel's
        state (asked again whenever another process appended first, so that
        it always builds on the latest); None when it makes none."""
        started = time.perf_counter()
        ch = await self._channel(uri)
        follow_ups: FollowUps = []
        try:
            async with ch.lock:
                scope = None if origin is None else origin_key(origin, seq_scope)
                return await self._commit(
                    ch, change, origin, scope, sender, validate, started, follow_ups
                )
        finally:
            await self.background.follow_ups(follow_ups, f"an action on {uri}")

    async def _commit(
        self,
        ch: HeldChannel,
        change: Change,
        origin: ActionOrigin | None,
        scope: str | None,
        sender: Identity | None,
        validate: Validator | None,
        started: float,
        follow_ups: FollowUps,
    ) -> Applied | None:
        """Step and append (the lock held), catching up and retrying when
        another process appended first. ``scope`` is the name the store
        knows a client's action by (:func:`origin_key`)."""
        for attempt in range(MAX_APPEND_ATTEMPTS):
            if attempt >= 2:
                await asyncio.sleep(random.uniform(0, 0.001 * attempt))  # jitter
            await self._following.heard(ch, follow_ups)
            action = change(ch.state)
            if action is None:
                return None
            name = None if scope is None else ClientAction(scope, action_digest(action))
            now = self.now_ms()
            result = step(ch.view(), action, origin, now, validate)
            if isinstance(result, Rejection):
                # Re-sent after a drop, the first copy is often what makes
                # the second invalid: say it was applied, not that it fails.
                if origin is not None and name is not None:
                    seen = await self.store.applied(ch.uri, name)
                    if seen is not None:
                        raise await self._applied(ch, seen, action, origin)
                raise ActionRejected.of(result)
            for ahead in self.aheads:
                written = ahead(ch.uri, result, sender)
                if written is not None:
                    await written
            ch.appending = True
            try:
                entry = encode_entry(now, result.data, sender)
                rider = self._rider(ch.uri, result, sender)
                if rider is None:
                    await self.store.append(ch.uri, ch.seq, entry, name)
                else:
                    await self.store.append_riding(ch.uri, ch.seq, entry, name, rider)
            except AlreadyApplied as applied:
                assert origin is not None  # only a client's action has a name
                raise await self._applied(ch, applied, action, origin) from None
            except SeqConflict as conflict:
                if conflict.current < ch.seq:
                    await self._following.restore(ch)
                else:
                    await self._following.catch_up(ch, follow_ups, behind=True)
                continue
            except StoreUnavailable:
                ch.unconfirmed = (ch.seq + 1, entry)  # it may have landed all the same
                raise
            finally:
                ch.appending = False
            latency = time.perf_counter() - started
            recorded: FollowUps = []
            event = self._apply(
                ch,
                result,
                sender,
                local=True,
                latency=latency,
                follow_ups=follow_ups,
                recorded=recorded,
            )
            try:
                # In a task of their own: a caller cancelled meanwhile leaves
                # the record being written, and the envelope still goes out.
                await self.background.follow_ups(recorded, f"recording an action on {ch.uri}")
            finally:
                self._show(ch, result)
            return event
        raise ActionRejected(
            RejectionCode.CONFLICT, f"{ch.uri} is too busy to write now; try again"
        )

    def _rider(self, uri: str, result: Step, sender: Identity | None) -> Rider | None:
        """The first rider a :data:`Riding` hook has for ``result`` that the
        store carries (see :attr:`riders`)."""
        for riding in self.riders:
            try:
                rider = riding(uri, result, sender)
            except Exception:
                log.exception("riding hook failed on %s", uri)
                continue
            if rider is not None and self.store.carries(rider.store, uri, rider.keys):
                return rider
        return None

    async def _applied(
        self, ch: HeldChannel, seen: AlreadyApplied, action: StateAction, origin: ActionOrigin
    ) -> AlreadyApplied:
        """A re-sent action's first outcome: its envelope as the log holds
        it (rebuilt from what was re-sent when the log no longer does, if
        the store's digest says it was this action). Raises ActionRejected
        when it was another action under that ``(clientId, clientSeq)``: a
        client that numbers two actions alike must not be told the second
        was applied. The log decides where the store cannot (a name kept
        without a digest); a log that no longer holds it cannot confirm, so
        then the action is refused rather than said applied."""
        seq = seen.seq
        try:
            entries = await self.store.read_log(ch.uri, seq - 1, ch.epoch)
        except StoreError:
            entries = None
        if not entries:
            if not seen.same_action:
                raise _reused(origin, None)
            first = ActionEnvelope(channel=ch.uri, action=action, server_seq=seq, origin=origin)
            return AlreadyApplied(ch.uri, seq, first)
        first = decode_entry(entries[0]).envelope
        if _restamped(action, first.action) != first.action:
            raise _reused(origin, first.action)
        return AlreadyApplied(ch.uri, seq, first)

    def _apply(
        self,
        ch: HeldChannel,
        result: Step,
        sender: Identity | None,
        *,
        local: bool,
        follow_ups: FollowUps,
        latency: float = 0.0,
        recorded: FollowUps | None = None,
    ) -> Applied:
        """Make ``result`` current: state, seq, subscribers, snapshot, hooks.
        With ``recorded``, the ``recorded`` phase's follow-ups go there and
        the subscribers are not sent the envelope: the caller awaits those,
        then :meth:`_show` s it."""
        before = ch.state
        ch.state, ch.seq = result.after, result.envelope.server_seq
        if ch.unconfirmed is not None and ch.unconfirmed[0] <= ch.seq:
            ch.unconfirmed = None  # applied, as ours or as another's
        if recorded is None:
            self._show(ch, result)
        ch.since_snapshot += 1
        ch.since_snapshot_bytes += len(result.data)
        ch.size += len(result.data)
        if ch.since_snapshot >= self.snapshot_every or ch.since_snapshot_bytes >= SNAPSHOT_BYTES:
            ch.since_snapshot, ch.since_snapshot_bytes = 0, 0
            snapshot = encode(result.after)
            ch.size = len(snapshot)
            self.spawn(self.store.save_snapshot(ch.uri, ch.seq, snapshot))
        event = Applied(ch.view(), result.envelope, before, sender, local, latency)
        for hook in self.hooks:
            try:
                follow_up = hook(event)
            except Exception:
                log.exception("hook failed on %s", ch.uri)
                continue
            if follow_up is None:
                continue
            if recorded is not None and hook in self.hooks.recorded:
                recorded.append(follow_up)
            else:
                follow_ups.append(follow_up)
        return event

    def _show(self, ch: HeldChannel, result: Step) -> None:
        """Send ``result``'s envelope to ``ch``'s subscribers (the same bytes
        to each)."""
        frame = action_frame(result.data, ch.uri, result.envelope.server_seq)
        for subscriber in list(ch.subscribers):
            subscriber.send_frame(frame, channel=ch.uri)

    # ─── Other processes ─────────────────────────────────────────────────

    def _apply_entry(self, ch: HeldChannel, raw: bytes, follow_ups: FollowUps) -> None:
        """Apply an entry another process appended (or this one, unconfirmed)."""
        entry = decode_entry(raw)
        seq = entry.envelope.server_seq
        if seq != ch.seq + 1:
            return
        after = reduce(ch.state, entry.envelope.action, entry.time)
        result = Step(entry.envelope, entry.data, after)
        ours = ch.unconfirmed == (seq, raw)
        self._apply(ch, result, entry.sender, local=ours, follow_ups=follow_ups)

    def envelope_appended(self, channel: str, seq: int, envelope: bytes) -> None:
        self._following.envelope_appended(channel, seq, envelope)

    async def check_heads(self, *, idle: bool = False) -> None:
        """Catch up what is behind the store (server.core.following)."""
        await self._following.check_heads(idle=idle)

    def store_reconnected(self) -> None:
        # Hints were lost meanwhile, those of the idle channels too: a copy
        # left behind would be read as current (until its next hint).
        self.spawn(self.check_heads(idle=True))

    def notice(self, topic: str, payload: bytes) -> None:
        root = self._held.get(ROOT_URI)
        if topic != ROOT_URI or root is None:
            return
        frame = OutFrame(payload)
        session = _notice_session(payload)
        for subscriber in list(root.subscribers):
            subscriber.send_frame(frame, session)

    async def publish_notice(self, method: str, params: object) -> None:
        """Send a root-channel notification to every process's subscribers."""
        payload = encode({"jsonrpc": "2.0", "method": method, "params": params})
        await self.store.publish(ROOT_URI, payload)

    # ─── Subscriptions ───────────────────────────────────────────────────

    async def subscribe(self, uri: str, subscriber: Subscriber) -> Snapshot:
        """Add ``subscriber`` to ``uri`` and return the snapshot it starts
        from: every later envelope has a greater seq."""
        ch = await self._channel(uri)
        async with self._following.current(ch):
            ch.subscribers.add(subscriber)
            self._held.touch(ch)
            return Snapshot(resource=uri, state=ch.state, from_seq=ch.seq)

    async def pin(self, uri: str) -> ChannelView:
        """Keep ``uri`` current here until :meth:`unpin` (as a subscriber
        would), for a caller waiting on its envelopes."""
        ch = await self._channel(uri)
        ch.pins += 1
        self._held.touch(ch)
        return ch.view()

    def unpin(self, uri: str) -> None:
        ch = self._held.get(uri)
        if ch is not None and ch.pins > 0:
            ch.pins -= 1
            self._held.touch(ch)

    def subscribers(self, uri: str) -> frozenset[Subscriber]:
        """Who is subscribed to ``uri`` here now."""
        ch = self._held.get(uri)
        return frozenset(ch.subscribers) if ch is not None else frozenset()

    def unsubscribe(self, uri: str, subscriber: Subscriber) -> None:
        ch = self._held.get(uri)
        if ch is not None:
            ch.subscribers.discard(subscriber)
            self._held.touch(ch)

    async def resume(
        self, uri: str, last_seen: int, subscriber: Subscriber, max_bytes: int | None = None
    ) -> Resume:
        """Resubscribe after a drop: the envelopes after ``last_seen`` when
        the store still holds them all (and they take at most ``max_bytes``),
        else a snapshot; missing when the channel is gone."""
        try:
            ch = await self._channel(uri)
        except ChannelGone:
            return MissingResume(channel=uri)
        async with self._following.current(ch):
            entries = None
            if last_seen <= ch.seq:
                entries = await self.store.read_log(uri, last_seen, ch.epoch)
            ch.subscribers.add(subscriber)
            self._held.touch(ch)
            too_large = (
                entries is not None
                and max_bytes is not None
                and sum(len(e) for e in entries) > max_bytes
            )
            if entries is None or too_large or len(entries) != ch.seq - last_seen:
                snapshot = Snapshot(resource=uri, state=ch.state, from_seq=ch.seq)
                return SnapshotResume(channel=uri, snapshot=snapshot)
            return ReplayResume(channel=uri, actions=[decode_entry(e).envelope for e in entries])


def _reused(origin: ActionOrigin, first: StateAction | None) -> ActionRejected:
    """The refusal of an action sent under the ``(clientId, clientSeq)`` of
    another (``first``, when the log still holds it)."""
    by = "" if first is None else f" ({action_type(first)})"
    return ActionRejected(
        RejectionCode.CLIENT_SEQ_REUSED,
        f"clientSeq {origin.client_seq} was used already, by another action{by}: "
        "number each action anew",
    )


def action_digest(action: StateAction) -> str:
    """What a client's action was, as the store compares re-sends
    (:class:`~server.store.base.ClientAction`): a digest of it without the
    turn stamp the server gives it anew each time it is sent
    (:func:`_restamped`)."""
    if isinstance(action, ChatTurnStarted) and turn_stamp(action.message) is not None:
        action = replace(action, message=stamped(action.message, None))
    return hashlib.blake2b(encode(action), digest_size=16).hexdigest()


def _restamped(action: StateAction, first: StateAction) -> StateAction:
    """``action`` with the turn stamp ``first`` was given: a person's turn
    start is stamped anew each time it is sent (server.core.policy.stamped), so
    the copy re-sent after a drop is the first one but for its stamp."""
    if isinstance(action, ChatTurnStarted) and isinstance(first, ChatTurnStarted):
        stamp = turn_stamp(first.message)
        if stamp is not None:
            return replace(action, message=stamped(action.message, None, turn=stamp))
    return action


def origin_key(origin: ActionOrigin, seq_scope: str | None = None) -> str:
    """How the store names a client's action: by its ``(clientId,
    clientSeq)``, and ``seq_scope`` where the client numbers within less
    than its clientId (a plain AHP client numbers each connection from 1:
    the connection's id), so that the same pair on another connection is
    another action."""
    client = origin.client_id if seq_scope is None else f"{origin.client_id}/{seq_scope}"
    return f"{client} {origin.client_seq}"


def _notice_session(payload: bytes) -> str | None:
    """The session a sessions-list notice is about."""
    params = msgspec.json.decode(payload).get("params") or {}
    summary = params.get("summary")
    if isinstance(summary, dict) and isinstance(summary.get("resource"), str):
        return str(summary["resource"])
    session = params.get("session")
    return session if isinstance(session, str) else None
