"""The channel host: one writer per channel, every subscriber in order.

Every change of state takes one path::

    authorise (the caller) -> validate -> reduce -> append to the store
    (compare-and-set on the channel's seq) -> encode the envelope once ->
    the same bytes to every subscriber -> side effects

A rejected action raises :class:`ActionRejected` and consumes no seq. When
another process appended first, the host catches up from the store log,
validates again and retries, so no subscriber ever sees a gap or a
reordering. Envelopes other processes append reach this process through the
store's listener and are applied the same way (without validation: they were
validated where they were accepted).

Side effects after a chat action, in order and under the chat's lock (lock
order is always chat, then session, then root): the session's
``inputNeeded`` queue and chat catalog are brought up to date, the sessions
list summary is re-derived and announced on the root channel, and waiting
callers (``wait_input``, ``wait_tool_confirmation``) are resolved.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema
import msgspec
from msgspec.structs import replace

from protocol.actions import (
    Action,
    ChatError,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    RootActiveSessionsChanged,
    RootAgentsChanged,
    SessionChatAdded,
    SessionChatRemoved,
    SessionDefaultChatChanged,
    SessionIsReadChanged,
    SessionReady,
    StateAction,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    InputResponseKind,
    Message,
    ToolCallPendingConfirmation,
    UserOrigin,
)
from protocol.codec import convert_state, decode_envelope, encode
from protocol.forms import FormError, FormSpec, form_data_from_answers, parse_form
from protocol.messages import (
    ActionEnvelope,
    ActionOrigin,
    ChannelState,
    ErrorCode,
    MissingResume,
    ReplayResume,
    Resume,
    SessionAddedParams,
    SessionRemovedParams,
    SessionSummaryChangedParams,
    Snapshot,
    SnapshotResume,
)
from protocol.rejections import RejectionCode
from protocol.session import AgentInfo, RootState, SessionState, SessionSummary
from protocol.status import SessionStatus
from protocol.uris import ROOT_URI, channel_kind, chat_uri
from reducers import reduce
from reducers.aggregate import chat_summary, derive_session_actions, session_summary, summary_diff
from reducers.chat import select_latest_input_part, select_open_input_part, select_tool_call
from reducers.clock import iso_time
from reducers.validation import reject_reason
from server.errors import (
    ActionRejected,
    ChannelGone,
    CommandError,
    InputAbandoned,
    SeqConflict,
    StoreError,
)
from server.frames import OutFrame
from server.store.base import ChannelStore, Listener

log = logging.getLogger("huddle.host")

NEWS = (ChatTurnStarted, ChatInputRequested, ChatToolCallReady)
"""Chat actions that make the session unread again."""

ACTION_FRAME_HEAD = b'{"jsonrpc":"2.0","method":"action","params":'
MAX_APPEND_ATTEMPTS = 50
"""Compare-and-set attempts before an append is given up as too contended;
from the third on, each waits a little (random) so two processes that keep
colliding fall out of step."""
SESSION_RECORDS = "session"
FORM_RECORDS = "form"
CLIENT_RECORDS = "client"
HUDDLE_META = "huddle"


def action_frame(envelope: bytes) -> bytes:
    """The ``action`` notification carrying an encoded envelope."""
    return ACTION_FRAME_HEAD + envelope + b"}"


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


Observer = Callable[[str, ActionEnvelope, ChannelState], None]
"""Called after every applied envelope (local or remote): channel, envelope,
new state. Observers watch; they never change state directly."""


@dataclass
class _Waiter:
    """A caller waiting for an action on a chat; ``match`` returns the result,
    raises InputAbandoned, or returns None to keep waiting."""

    match: Callable[[StateAction, ChatState], Any]
    future: asyncio.Future[Any]


@dataclass
class Channel:
    """A channel as this process holds it."""

    uri: str
    state: ChannelState
    seq: int
    epoch: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sync_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serialises bringing the session's aggregates up to date with the chat."""
    subscribers: set[Subscriber] = field(default_factory=set)
    waiters: list[_Waiter] = field(default_factory=list)
    since_snapshot: int = 0
    remote_head: int = 0
    hints: dict[int, bytes] = field(default_factory=dict)
    """Entries other processes announced, by seq, not yet applied."""
    catching_up: bool = False
    appending: bool = False


class LogEntry(msgspec.Struct, frozen=True, gc=False):
    """What the store keeps per seq: the envelope as sent (``e``) and the
    writer's clock (``t``, ms), so that every process reduces it to the same
    state (``modifiedAt`` comes from the caller's clock)."""

    t: int
    e: msgspec.Raw


_read_entry = msgspec.json.Decoder(LogEntry)


def log_entry(now_ms: int, envelope: bytes) -> bytes:
    return b'{"t":%d,"e":%b}' % (now_ms, envelope)


def read_entry(raw: bytes) -> tuple[int, ActionEnvelope, bytes]:
    """The writer's time, the envelope, and the envelope's bytes."""
    entry = _read_entry.decode(raw)
    data = bytes(entry.e)
    return entry.t, decode_envelope(data), data


@dataclass(frozen=True)
class _Form:
    """A request's frozen form: the schema as given, its parsed spec and a
    validator built once (checking the schema itself costs more than the
    data)."""

    schema: dict[str, Any]
    spec: FormSpec
    validator: jsonschema.protocols.Validator

    @classmethod
    def of(cls, schema: dict[str, Any], spec: FormSpec | None = None) -> _Form:
        validator_class = jsonschema.validators.validator_for(schema)
        return cls(schema, spec or parse_form(schema), validator_class(schema))


@dataclass(frozen=True)
class Identity:
    """Who is behind a client id, for audit: a name and a role."""

    name: str
    role: str


@dataclass(frozen=True)
class InputOutcome:
    """How an input request was resolved.

    ``answers`` are the final answers (synced drafts overlaid by the
    completion's); ``data`` is the form data with the schema's types when the
    request was made from a JSON Schema form and accepted (else None);
    ``origin`` and ``by`` say who completed it.
    """

    response: InputResponseKind
    answers: dict[str, InputAnswer]
    data: dict[str, Any] | None
    origin: ActionOrigin | None
    by: Identity | None


@dataclass(frozen=True)
class ToolDecision:
    """How a person answered a tool call's confirmation."""

    approved: bool
    action: ChatToolCallConfirmed
    origin: ActionOrigin | None
    by: Identity | None

    @property
    def edited_input(self) -> str | None:
        return self.action.edited_tool_input

    @property
    def reason(self) -> str | None:
        return self.action.reason


def _chat_session(chat: ChatState) -> str | None:
    meta = (chat.meta or {}).get(HUDDLE_META)
    return meta.get("session") if isinstance(meta, dict) else None


class Host(Listener):
    """Channels, their subscribers and the in-process API for agents.

    Call :meth:`start` before use and :meth:`stop` at the end.
    """

    def __init__(
        self,
        store: ChannelStore,
        *,
        agents: list[AgentInfo],
        clock: Callable[[], float] = time.time,
        snapshot_every: int = 100,
        modified_at_interval: float = 1.0,
        idle_check_interval: float = 2.0,
    ) -> None:
        self.store = store
        self.agents = agents
        self.clock = clock
        self.snapshot_every = snapshot_every
        self.modified_at_interval = modified_at_interval
        self.idle_check_interval = idle_check_interval
        self.channels: dict[str, Channel] = {}
        self.observers: list[Observer] = []
        self.root_subscribers: set[Subscriber] = set()
        self._loading: dict[str, asyncio.Future[Channel]] = {}
        self._forms: dict[tuple[str, str], _Form | None] = {}
        self._identities: dict[str, Identity] = {}
        self._summaries: dict[str, SessionSummary] = {}
        self._chat_shadows: dict[str, ChatState] = {}
        """The chat state the session last heard about, per chat."""
        self._modified_flush: dict[str, asyncio.TimerHandle] = {}
        self._last_modified_push: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._remove_listener: Callable[[], None] | None = None
        self.on_applied: Callable[[str, float], None] | None = None
        """Metrics hook: (action type, seconds from accept to broadcast)."""
        self.accepted: list[Callable[[str, ActionEnvelope], Awaitable[None]]] = []
        """Awaited after each action this process accepted (never for
        another process's): how side effects such as starting or resuming
        an agent's turn happen exactly once."""

    # ─── Lifecycle ───────────────────────────────────────────────────────

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def start(self) -> None:
        """Create the root channel if needed and listen to other processes."""
        self._remove_listener = self.store.add_listener(self)
        if self.idle_check_interval > 0:
            self._spawn(self._check_idle_channels())
        root = RootState(agents=self.agents, active_sessions=0)
        if not await self.store.create(ROOT_URI, encode(root)):
            current = await self.channel(ROOT_URI)
            assert isinstance(current.state, RootState)
            if current.state.agents != self.agents:
                await self.dispatch(ROOT_URI, RootAgentsChanged(agents=self.agents))

    async def stop(self) -> None:
        if self._remove_listener is not None:
            self._remove_listener()
        for handle in self._modified_flush.values():
            handle.cancel()
        for task in list(self._tasks):
            task.cancel()
        for ch in self.channels.values():
            for waiter in ch.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(InputAbandoned("the server is stopping"))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("background task failed", exc_info=error)

    # ─── Loading ─────────────────────────────────────────────────────────

    async def channel(self, uri: str) -> Channel:
        """The channel ``uri``, loaded from the store on first use; raises
        ChannelGone (and BadChannelUri for a malformed URI)."""
        found = self.channels.get(uri)
        if found is not None:
            return found
        pending = self._loading.get(uri)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()
        self._loading[uri] = future
        try:
            await self.store.watch(uri)  # first: no append falls between load and hints
            ch = await self._load(uri)
            self.channels[uri] = ch
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

    async def _load(self, uri: str) -> Channel:
        kind = channel_kind(uri)
        stored = await self.store.load(uri)
        state = convert_state(json.loads(stored.snapshot), kind)
        for raw in stored.log:
            when, envelope, _ = read_entry(raw)
            state = reduce(state, envelope.action, when)
        return Channel(uri=uri, state=state, seq=stored.seq, epoch=stored.epoch)

    # ─── The write path ──────────────────────────────────────────────────

    async def dispatch(
        self,
        uri: str,
        action: StateAction,
        *,
        origin: ActionOrigin | None = None,
        validate: bool = True,
    ) -> ActionEnvelope:
        """Validate, reduce, append and broadcast ``action`` on ``uri``.

        Returns the accepted envelope. Raises ActionRejected (nothing
        changed, no seq used), ChannelGone, or StoreUnavailable.
        """
        started = time.perf_counter()
        ch = await self.channel(uri)
        if isinstance(action, ChatInputCompleted):
            await self._load_form(uri, action.request_id)
        if isinstance(action, ChatToolCallConfirmed) and action.edited_tool_input is not None:
            session = await self.session_of(uri)
            if session is not None:
                await self.channel(session)  # its tools are what the check reads
        async with ch.lock:
            envelope, before = await self._write(ch, action, origin, validate)
            if isinstance(before, SessionState):
                await self._announce_summary(ch)
        if self.on_applied is not None:
            self.on_applied(_type_of(action), time.perf_counter() - started)
        # Side effects that people wait for (a turn resuming) come first; the
        # session's aggregates follow. They are brought up to date by diffing
        # what the session last heard against the chat's latest state, one
        # sync per chat at a time, so their order cannot go wrong.
        for hook in list(self.accepted):
            try:
                await hook(uri, envelope)
            except Exception:
                log.exception("side effect of %s on %s failed", _type_of(action), uri)
        if isinstance(before, ChatState):
            async with ch.sync_lock:
                await self._after_chat_action(ch, before)
            if isinstance(action, NEWS):
                await self._mark_unread(ch)
        return envelope

    async def _mark_unread(self, ch: Channel) -> None:
        """News in a chat (a turn, a question, a tool waiting) makes its
        session unread again for everyone."""
        assert isinstance(ch.state, ChatState)
        session = _chat_session(ch.state)
        if session is None:
            return
        with contextlib.suppress(ChannelGone):
            state = (await self.channel(session)).state
            if isinstance(state, SessionState) and state.status & SessionStatus.IS_READ:
                await self.dispatch(session, SessionIsReadChanged(is_read=False), validate=False)

    async def _write(
        self, ch: Channel, action: StateAction, origin: ActionOrigin | None, validate: bool
    ) -> tuple[ActionEnvelope, ChannelState]:
        """Validate, reduce and append (the lock held); returns the envelope
        and the state before it."""
        for attempt in range(MAX_APPEND_ATTEMPTS):
            if attempt >= 2:
                await asyncio.sleep(random.uniform(0, 0.001 * attempt))  # jitter
            if validate:
                rejection = reject_reason(
                    ch.state,
                    action,
                    form_check=self._form_check(ch.uri),
                    tool_input_check=self._tool_input_check(ch.state),
                )
                if rejection is not None:
                    raise ActionRejected.of(rejection)
            before, now = ch.state, self.now_ms()
            after = reduce(before, action, now)
            envelope = ActionEnvelope(
                channel=ch.uri, action=action, server_seq=ch.seq + 1, origin=origin
            )
            data = encode(envelope)
            ch.appending = True
            try:
                await self.store.append(ch.uri, ch.seq, log_entry(now, data))
            except SeqConflict as conflict:
                if conflict.current < ch.seq:
                    await self._restore(ch)
                else:
                    await self._catch_up(ch, behind=True)
                continue
            finally:
                ch.appending = False
            self._apply(ch, after, envelope, data)
            return envelope, before
        raise ActionRejected(
            RejectionCode.CONFLICT, f"{ch.uri} is too busy to write now; try again"
        )

    def _apply(
        self, ch: Channel, after: ChannelState, envelope: ActionEnvelope, data: bytes
    ) -> None:
        """Make ``envelope`` current: state, seq, subscribers, waiters."""
        ch.state, ch.seq = after, envelope.server_seq
        frame = OutFrame(action_frame(data))
        for subscriber in list(ch.subscribers):
            subscriber.send_frame(frame, channel=ch.uri)
        ch.since_snapshot += 1
        if ch.since_snapshot >= self.snapshot_every:
            ch.since_snapshot = 0
            self._spawn(self.store.save_snapshot(ch.uri, ch.seq, encode(after)))
        if ch.waiters and isinstance(after, ChatState):
            self._resolve_waiters(ch, envelope, after)
        for observer in self.observers:
            observer(ch.uri, envelope, after)

    async def _catch_up(self, ch: Channel, *, behind: bool = False) -> None:
        """Apply what other processes appended after ``ch.seq`` (lock held):
        the announced entries while they follow on, then the store's log
        when some are still missing (or ``behind``: a conflict said so)."""
        while (raw := ch.hints.pop(ch.seq + 1, None)) is not None:
            self._apply_entry(ch, raw)
        ch.hints = {seq: raw for seq, raw in ch.hints.items() if seq > ch.seq}
        if ch.remote_head <= ch.seq and not behind:
            return
        entries = await self.store.read_log(ch.uri, ch.seq, ch.epoch)
        if entries is None:
            await self._reload(ch)
            return
        for raw in entries:
            self._apply_entry(ch, raw)

    def _apply_entry(self, ch: Channel, raw: bytes) -> None:
        when, envelope, data = read_entry(raw)
        if envelope.server_seq != ch.seq + 1:
            return
        after = reduce(ch.state, envelope.action, when)
        self._apply(ch, after, envelope, data)
        if isinstance(after, ChatState):
            # The writing process told the session; start from here.
            self._chat_shadows[ch.uri] = after

    async def _restore(self, ch: Channel) -> None:
        """The store is behind what this process saw: it lost acknowledged
        appends. Give it back the state we hold, under a new epoch; every
        other process then reloads it, and its subscribers start over."""
        epoch = await self.store.restore(ch.uri, ch.seq, encode(ch.state))
        log.warning("%s: the store lost appends up to %d; restored them", ch.uri, ch.seq)
        if epoch is not None:
            ch.epoch = epoch
            ch.hints.clear()

    async def _reload(self, ch: Channel) -> None:
        """The log we knew is gone (epoch changed or trimmed past us): load
        afresh and make every subscriber start over."""
        fresh = await self._load(ch.uri)
        ch.state, ch.seq, ch.epoch = fresh.state, fresh.seq, fresh.epoch
        ch.hints.clear()
        for subscriber in list(ch.subscribers):
            subscriber.resync(ch.uri)
        ch.subscribers.clear()

    # ─── Other processes ─────────────────────────────────────────────────

    def envelope_appended(self, channel: str, seq: int, envelope: bytes) -> None:
        ch = self.channels.get(channel)
        if ch is None or seq <= ch.seq:
            return
        if len(ch.hints) < 1000:
            ch.hints[seq] = envelope  # kept even now: a conflict uses it
        if ch.appending and seq == ch.seq + 1:
            return  # most likely our own append; a conflict would catch us up
        ch.remote_head = max(ch.remote_head, seq)
        if not ch.catching_up:
            ch.catching_up = True
            self._spawn(self._follow(ch))

    async def _follow(self, ch: Channel) -> None:
        try:
            async with ch.lock:
                if ch.remote_head > ch.seq:
                    await self._catch_up(ch)
        finally:
            ch.catching_up = False

    async def _check_idle_channels(self) -> None:
        """Now and then, compare every watched channel with the store's head:
        an append whose hint was lost is applied within one interval."""
        while True:
            await asyncio.sleep(self.idle_check_interval)
            try:
                await self.check_heads()
            except StoreError as error:
                log.warning("idle check failed: %s", error)

    async def check_heads(self) -> None:
        """Catch up every watched channel that is behind the store (or whose
        log changed its epoch: then subscribers start over)."""
        watched = [uri for uri, ch in self.channels.items() if ch.subscribers or ch.waiters]
        if not watched:
            return
        heads = await self.store.heads(watched)
        for uri in watched:
            ch = self.channels.get(uri)
            head = heads.get(uri)
            if ch is None or head is None:
                continue
            epoch, seq = head
            if epoch != ch.epoch or seq > ch.seq:
                async with ch.lock:
                    if epoch != ch.epoch:
                        await self._reload(ch)
                    else:
                        await self._catch_up(ch, behind=True)

    def store_reconnected(self) -> None:
        self._spawn(self.check_heads())

    def notice(self, topic: str, payload: bytes) -> None:
        if topic == ROOT_URI:
            frame = OutFrame(payload)
            session = _notice_session(payload)
            for subscriber in list(self.root_subscribers):
                subscriber.send_frame(frame, session)

    # ─── Derived actions ─────────────────────────────────────────────────

    async def _after_chat_action(self, ch: Channel, before: ChatState) -> None:
        """Keep the session aggregate in step with the chat (sync lock held)."""
        assert isinstance(ch.state, ChatState)
        session = _chat_session(ch.state)
        if session is None:
            return
        shadow = self._chat_shadows.get(ch.uri, before)
        self._chat_shadows[ch.uri] = ch.state
        now = self.clock()
        last = self._last_modified_push.get(ch.uri, 0.0)
        eager = now - last >= self.modified_at_interval
        actions = derive_session_actions(shadow, ch.state, include_modified_at=eager)
        if any(getattr(a, "changes", None) is not None for a in actions):
            self._last_modified_push[ch.uri] = now
            self._cancel_flush(ch.uri)
        elif shadow.modified_at != ch.state.modified_at:
            # The summary's modifiedAt lags by at most one interval.
            self._schedule_flush(ch.uri, session)
            self._chat_shadows[ch.uri] = replace(ch.state, modified_at=shadow.modified_at)
        for action in actions:
            with contextlib.suppress(ChannelGone):
                await self.dispatch(session, action, validate=False)

    def _schedule_flush(self, chat: str, session: str) -> None:
        if chat in self._modified_flush:
            return
        loop = asyncio.get_running_loop()
        self._modified_flush[chat] = loop.call_later(
            self.modified_at_interval, lambda: self._spawn(self._flush_modified(chat))
        )

    def _cancel_flush(self, chat: str) -> None:
        handle = self._modified_flush.pop(chat, None)
        if handle is not None:
            handle.cancel()

    async def _flush_modified(self, chat: str) -> None:
        self._modified_flush.pop(chat, None)
        ch = self.channels.get(chat)
        if ch is None:
            return
        async with ch.sync_lock:
            self._last_modified_push[chat] = 0.0
            assert isinstance(ch.state, ChatState)
            await self._after_chat_action(ch, ch.state)

    async def _announce_summary(self, ch: Channel) -> None:
        """Re-derive the session's list entry; announce what changed (the
        session's lock held). Sessions still being created have no entry."""
        assert isinstance(ch.state, SessionState)
        session = ch.uri
        old = self._summaries.get(session) or await self._read_summary(session)
        if old is None:
            return
        new = session_summary(session, ch.state, old.created_at)
        changes = summary_diff(old, new)
        if not changes:
            return
        self._summaries[session] = new
        await self.store.put_record(SESSION_RECORDS, session, encode(new))
        params = SessionSummaryChangedParams(channel=ROOT_URI, session=session, changes=changes)
        await self.store.publish(ROOT_URI, _notification("root/sessionSummaryChanged", params))

    async def _read_summary(self, session: str) -> SessionSummary | None:
        raw = await self.store.get_record(SESSION_RECORDS, session)
        if raw is None:
            return None
        summary = msgspec.json.decode(raw, type=SessionSummary)
        self._summaries[session] = summary
        return summary

    # ─── Subscriptions ───────────────────────────────────────────────────

    async def subscribe(self, uri: str, subscriber: Subscriber) -> Snapshot:
        """Add ``subscriber`` to ``uri`` and return the snapshot it starts
        from: every later envelope has a greater seq."""
        ch = await self.channel(uri)
        async with ch.lock:
            ch.subscribers.add(subscriber)
            if uri == ROOT_URI:
                self.root_subscribers.add(subscriber)
            return Snapshot(resource=uri, state=ch.state, from_seq=ch.seq)

    def unsubscribe(self, uri: str, subscriber: Subscriber) -> None:
        ch = self.channels.get(uri)
        if ch is not None:
            ch.subscribers.discard(subscriber)
        if uri == ROOT_URI:
            self.root_subscribers.discard(subscriber)

    async def resume(self, uri: str, last_seen: int, subscriber: Subscriber) -> Resume:
        """Resubscribe after a drop: the envelopes after ``last_seen`` when
        the store still holds them all, else a snapshot; missing when the
        channel is gone."""
        try:
            ch = await self.channel(uri)
        except ChannelGone:
            return MissingResume(channel=uri)
        async with ch.lock:
            entries = None
            if last_seen <= ch.seq:
                entries = await self.store.read_log(uri, last_seen, ch.epoch)
            ch.subscribers.add(subscriber)
            if uri == ROOT_URI:
                self.root_subscribers.add(subscriber)
            if entries is None or len(entries) != ch.seq - last_seen:
                snapshot = Snapshot(resource=uri, state=ch.state, from_seq=ch.seq)
                return SnapshotResume(channel=uri, snapshot=snapshot)
            return ReplayResume(channel=uri, actions=[read_entry(e)[1] for e in entries])

    # ─── Sessions and chats ──────────────────────────────────────────────

    async def create_session(
        self, uri: str, *, provider: str | None = None, title: str | None = None
    ) -> str:
        """Create session ``uri`` with its default chat; returns the chat URI.

        Raises CommandError (-32003) when the URI is taken, (-32002) for an
        unknown provider.
        """
        agent = self._agent(provider)
        now = self.now_ms()
        state = SessionState(
            provider=agent.provider,
            title=title or "New session",
            status=SessionStatus.IDLE,
            lifecycle="creating",
            active_clients=[],
            chats=[],
        )
        if not await self.store.create(uri, encode(state)):
            raise CommandError(ErrorCode.SESSION_ALREADY_EXISTS, f"session {uri} already exists")
        chat = chat_uri(secrets.token_hex(8))
        await self.create_chat(uri, chat, title="Main")
        await self.dispatch(uri, SessionDefaultChatChanged(default_chat=chat))
        await self.dispatch(uri, SessionReady())
        ch = await self.channel(uri)
        assert isinstance(ch.state, SessionState)
        summary = session_summary(uri, ch.state, iso_time(now))
        self._summaries[uri] = summary
        await self.store.put_record(SESSION_RECORDS, uri, encode(summary))
        await self._count_sessions()
        params = SessionAddedParams(channel=ROOT_URI, summary=summary)
        await self.store.publish(ROOT_URI, _notification("root/sessionAdded", params))
        return chat

    def _agent(self, provider: str | None) -> AgentInfo:
        for agent in self.agents:
            if provider is None or agent.provider == provider:
                return agent
        raise CommandError(ErrorCode.PROVIDER_NOT_FOUND, f"no agent provider {provider!r}")

    async def create_chat(
        self,
        session: str,
        chat: str,
        *,
        title: str | None = None,
        initial_message: Message | None = None,
    ) -> None:
        """Create chat ``chat`` in ``session`` and add it to the catalog."""
        ch = await self.channel(session)
        assert isinstance(ch.state, SessionState)
        state = ChatState(
            resource=chat,
            title=title or f"Chat {len(ch.state.chats) + 1}",
            status=SessionStatus.IDLE,
            modified_at=iso_time(self.now_ms()),
            origin=UserOrigin(),
            turns=[],
            meta={HUDDLE_META: {"session": session}},
        )
        if not await self.store.create(chat, encode(state)):
            raise CommandError(ErrorCode.ALREADY_EXISTS, f"chat {chat} already exists")
        await self.dispatch(session, SessionChatAdded(summary=chat_summary(state)))
        if initial_message is not None:
            await self.dispatch(
                chat,
                ChatTurnStarted(
                    turn_id=secrets.token_hex(8),
                    started_at=iso_time(self.now_ms()),
                    message=initial_message,
                ),
            )

    async def dispose_session(self, session: str) -> None:
        """Remove the session and its chats; subscribers hear no more."""
        ch = await self.channel(session)
        assert isinstance(ch.state, SessionState)
        await self.store.delete_record(SESSION_RECORDS, session)
        self._summaries.pop(session, None)
        for summary in ch.state.chats:
            await self._drop_channel(summary.resource, "the session was disposed")
            with contextlib.suppress(ChannelGone):
                await self.dispatch(session, SessionChatRemoved(chat=summary.resource))
        await self._drop_channel(session, "the session was disposed")
        await self._count_sessions()
        params = SessionRemovedParams(channel=ROOT_URI, session=session)
        await self.store.publish(ROOT_URI, _notification("root/sessionRemoved", params))

    async def _drop_channel(self, uri: str, why: str) -> None:
        ch = self.channels.pop(uri, None)
        if ch is not None:
            for waiter in ch.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(InputAbandoned(why))
            ch.subscribers.clear()
        self._chat_shadows.pop(uri, None)
        self._cancel_flush(uri)
        await self.store.delete(uri)
        await self.store.unwatch(uri)

    async def _count_sessions(self) -> None:
        count = len(await self.store.records(SESSION_RECORDS))
        await self.dispatch(ROOT_URI, RootActiveSessionsChanged(active_sessions=count))

    async def list_sessions(self) -> list[SessionSummary]:
        """Every session's list entry, most recently modified first."""
        records = await self.store.records(SESSION_RECORDS)
        items = [msgspec.json.decode(raw, type=SessionSummary) for raw in records.values()]
        items.sort(key=lambda s: (s.modified_at, s.resource), reverse=True)
        return items

    async def session_of(self, uri: str) -> str | None:
        """The session a channel belongs to (None for the root channel)."""
        kind = channel_kind(uri)
        if kind == "session":
            return uri
        if kind == "chat":
            ch = await self.channel(uri)
            assert isinstance(ch.state, ChatState)
            return _chat_session(ch.state)
        return None

    # ─── Turn history ────────────────────────────────────────────────────

    async def older_turns(
        self, chat: str, cursor: str | None, limit: int
    ) -> tuple[list[Any], str | None]:
        """A page of completed turns older than ``cursor`` (None: the
        newest), oldest first, and the cursor for the page before it."""
        ch = await self.channel(chat)
        assert isinstance(ch.state, ChatState)
        turns = ch.state.turns
        end = len(turns)
        if cursor is not None:
            end = _decode_cursor(cursor, [t.id for t in turns])
        start = max(0, end - limit)
        next_cursor = _encode_cursor(turns[start].id) if start > 0 else None
        return turns[start:end], next_cursor

    def windowed(self, state: ChatState, turns: int) -> ChatState:
        """A snapshot showing only the newest ``turns`` completed turns."""
        if turns >= len(state.turns):
            return state
        kept = state.turns[len(state.turns) - turns :]
        return replace(state, turns=kept, turns_next_cursor=_encode_cursor(kept[0].id))

    # ─── Identities and forms ────────────────────────────────────────────

    async def register_client(self, client_id: str, identity: Identity) -> None:
        self._identities[client_id] = identity
        await self.store.put_record(CLIENT_RECORDS, client_id, encode(identity.__dict__))

    async def identity(self, origin: ActionOrigin | None) -> Identity | None:
        if origin is None:
            return None
        found = self._identities.get(origin.client_id)
        if found is None:
            raw = await self.store.get_record(CLIENT_RECORDS, origin.client_id)
            if raw is not None:
                found = Identity(**json.loads(raw))
                self._identities[origin.client_id] = found
        return found

    def _form_check(self, uri: str) -> Callable[[InputRequest, dict[str, InputAnswer]], str | None]:
        def check(request: InputRequest, answers: dict[str, InputAnswer]) -> str | None:
            form = self._forms.get((uri, request.id))
            if form is None:
                return None
            try:
                data = form_data_from_answers(form.spec, answers)
                form.validator.validate(data)
            except jsonschema.ValidationError as error:
                # Name the field and the rule, never the value (form data
                # can be sensitive; jsonschema's messages quote it).
                where = "/".join(str(p) for p in error.absolute_path) or "the form"
                return f"{where} fails the schema's `{error.validator}` rule"
            except FormError as error:
                return f"{error.property or 'the form'}: {error.reason}"
            return None

        return check

    def _tool_input_check(
        self, state: ChannelState
    ) -> Callable[[ToolCallPendingConfirmation, Any], str | None]:
        """Check edited tool input against the input schema of the tool of
        that name among the session's server tools and its clients' tools."""

        def check(call: ToolCallPendingConfirmation, edited: Any) -> str | None:
            if not isinstance(state, ChatState):
                return None
            session_uri = _chat_session(state)
            session = self.channels.get(session_uri) if session_uri else None
            if session is None or not isinstance(session.state, SessionState):
                return None
            tools = list(session.state.server_tools or [])
            for client in session.state.active_clients:
                tools.extend(client.tools)
            tool = next((t for t in tools if t.name == call.tool_name), None)
            if tool is None or tool.input_schema is None:
                return None
            try:
                jsonschema.validate(edited, tool.input_schema)
            except jsonschema.ValidationError as error:
                where = "/".join(str(p) for p in error.absolute_path) or "the input"
                return f"{where} fails the schema's `{error.validator}` rule"
            except jsonschema.SchemaError:
                return None
            return None

        return check

    async def _load_form(self, chat: str, request_id: str) -> _Form | None:
        key = (chat, request_id)
        if key not in self._forms:
            raw = await self.store.get_record(FORM_RECORDS, f"{chat} {request_id}")
            if raw is None:
                self._forms[key] = None
            else:
                schema = json.loads(raw)
                self._forms[key] = _Form.of(schema)
        return self._forms[key]

    # ─── Waiting for people ──────────────────────────────────────────────

    async def request_input(
        self,
        chat: str,
        request: InputRequest,
        *,
        schema: dict[str, Any] | None = None,
    ) -> InputOutcome:
        """Ask the people in ``chat``: dispatch ``chat/inputRequested`` (with
        questions derived from ``schema`` when one is given and the request
        has none) and wait for the outcome.

        The schema is frozen with the request: an accept is validated
        against it and ``outcome.data`` carries the data with its types.
        Raises InputAbandoned when the turn ends first, ActionRejected when
        there is no active turn.
        """
        ch = await self.channel(chat)
        if not isinstance(ch.state, ChatState) or ch.state.active_turn is None:
            raise ActionRejected(
                RejectionCode.NO_ACTIVE_TURN, f"{chat} has no active turn to ask in"
            )
        waiter = self._input_waiter(ch, request.id, ch.state.active_turn.id)
        try:
            await self.ask(chat, request, schema=schema)
        except BaseException:
            self._drop_waiter(ch, waiter)
            raise
        return await self._finish_input(ch, waiter)

    async def ask(
        self, chat: str, request: InputRequest, *, schema: dict[str, Any] | None = None
    ) -> ActionEnvelope:
        """Open ``request`` in ``chat`` without waiting (see
        :meth:`request_input`); the form, when given, is frozen with it."""
        if schema is not None:
            spec = parse_form(schema)
            if request.questions is None:
                request = replace(request, questions=spec.questions)
            self._forms[(chat, request.id)] = _Form.of(schema, spec)
            await self.store.put_record(FORM_RECORDS, f"{chat} {request.id}", encode(schema))
        return await self.dispatch(chat, ChatInputRequested(request=request))

    async def form_data(
        self, chat: str, request_id: str, answers: dict[str, InputAnswer]
    ) -> dict[str, Any] | None:
        """The data ``answers`` give for the request's frozen form (with the
        schema's types), or None when the request had no form."""
        form = await self._load_form(chat, request_id)
        return None if form is None else form_data_from_answers(form.spec, answers)

    async def wait_input(self, chat: str, request_id: str) -> InputOutcome:
        """Wait for the open request ``request_id`` of ``chat`` to be
        completed. Returns at once if it already was (the latest part with
        that id). Raises InputAbandoned; bound it with ``asyncio.timeout``."""
        ch = await self.channel(chat)
        state = ch.state
        assert isinstance(state, ChatState)
        await self._load_form(chat, request_id)
        if state.active_turn is not None:
            found = select_open_input_part(state.active_turn.response_parts, request_id)
            if found is not None:
                waiter = self._input_waiter(ch, request_id, state.active_turn.id)
                return await self._finish_input(ch, waiter)
        part = select_latest_input_part(state, request_id)
        if part is None or part.response is None:
            raise InputAbandoned(f"request {request_id} is not open in {chat}")
        answers = dict(part.request.answers or {})
        return InputOutcome(part.response, answers, self._data(chat, request_id, part), None, None)

    def _data(self, chat: str, request_id: str, part: InputRequestPart) -> dict[str, Any] | None:
        form = self._forms.get((chat, request_id))
        if form is None or part.response != "accept":
            return None
        return form_data_from_answers(form.spec, part.request.answers or {})

    def _input_waiter(self, ch: Channel, request_id: str, turn_id: str) -> _Waiter:
        def match(action: StateAction, state: ChatState) -> Any:
            if isinstance(action, ChatInputCompleted) and action.request_id == request_id:
                part = select_latest_input_part(state, request_id)
                assert part is not None
                return part
            _check_turn_alive(action, turn_id, f"request {request_id}")
            return None

        waiter = _Waiter(match=match, future=asyncio.get_running_loop().create_future())
        ch.waiters.append(waiter)
        return waiter

    async def _finish_input(self, ch: Channel, waiter: _Waiter) -> InputOutcome:
        try:
            part, envelope = await asyncio.shield(waiter.future)
        finally:
            self._drop_waiter(ch, waiter)
        assert isinstance(part, InputRequestPart)
        assert part.response is not None
        request_id = part.request.id
        return InputOutcome(
            response=part.response,
            answers=dict(part.request.answers or {}),
            data=self._data(ch.uri, request_id, part),
            origin=envelope.origin,
            by=await self.identity(envelope.origin),
        )

    async def wait_tool_confirmation(
        self, chat: str, turn_id: str, tool_call_id: str
    ) -> ToolDecision:
        """Wait for a person to approve or deny the tool call, which must be
        pending confirmation now. Raises InputAbandoned when the turn ends."""
        ch = await self.channel(chat)
        assert isinstance(ch.state, ChatState)
        call = select_tool_call(ch.state, tool_call_id)
        if not isinstance(call, ToolCallPendingConfirmation):
            raise InputAbandoned(f"tool call {tool_call_id} is not waiting for confirmation")

        def match(action: StateAction, state: ChatState) -> Any:
            if isinstance(action, ChatToolCallConfirmed) and action.tool_call_id == tool_call_id:
                return action
            _check_turn_alive(action, turn_id, f"tool call {tool_call_id}")
            return None

        waiter = _Waiter(match=match, future=asyncio.get_running_loop().create_future())
        ch.waiters.append(waiter)
        try:
            action, envelope = await asyncio.shield(waiter.future)
        finally:
            self._drop_waiter(ch, waiter)
        assert isinstance(action, ChatToolCallConfirmed)
        return ToolDecision(
            approved=action.approved,
            action=action,
            origin=envelope.origin,
            by=await self.identity(envelope.origin),
        )

    def _drop_waiter(self, ch: Channel, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            ch.waiters.remove(waiter)

    def _resolve_waiters(self, ch: Channel, envelope: ActionEnvelope, state: ChatState) -> None:
        for waiter in list(ch.waiters):
            if waiter.future.done():
                continue
            try:
                result = waiter.match(envelope.action, state)
            except InputAbandoned as error:
                waiter.future.set_exception(error)
                continue
            if result is not None:
                waiter.future.set_result((result, envelope))


def _type_of(action: Action) -> str:
    return str(type(action).__struct_config__.tag)


def _check_turn_alive(action: StateAction, turn_id: str, what: str) -> None:
    """Raise InputAbandoned when ``action`` ends or truncates ``turn_id``."""
    if isinstance(action, ChatTurnComplete | ChatTurnCancelled | ChatError):
        if action.turn_id == turn_id:
            raise InputAbandoned(f"{what}: the turn ended ({_type_of(action)})")
    elif isinstance(action, ChatTruncated):
        raise InputAbandoned(f"{what}: the chat was truncated")


def _notice_session(payload: bytes) -> str | None:
    """The session a sessions-list notice is about."""
    params = msgspec.json.decode(payload).get("params") or {}
    summary = params.get("summary")
    if isinstance(summary, dict) and isinstance(summary.get("resource"), str):
        return str(summary["resource"])
    session = params.get("session")
    return session if isinstance(session, str) else None


def _notification(method: str, params: Any) -> bytes:
    return encode({"jsonrpc": "2.0", "method": method, "params": params})


def _encode_cursor(turn_id: str) -> str:
    return base64.urlsafe_b64encode(f"before:{turn_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, turn_ids: list[str]) -> int:
    """The index of the turn a cursor names; CommandError if it names none."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        text = ""
    prefix, _, turn_id = text.partition(":")
    if prefix == "before" and turn_id in turn_ids:
        return turn_ids.index(turn_id)
    raise CommandError(ErrorCode.INVALID_PARAMS, "unknown turns cursor")
