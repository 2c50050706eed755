"""The host: a process's channels and what it does with them, composed.

:class:`Host` puts the parts together and is the in-process API for agents
(the runner's bridge, the MCP bridge, the network edge's commands):

- :class:`~server.core.channels.ChannelCore`: channels, the write path,
  subscribers, other processes;
- :class:`~server.core.frozen_forms.FormRegistry`: the frozen JSON Schemas and the
  schema checks of the validation rules;
- :class:`~server.core.waiters.Waiters`: callers waiting for people;
- :class:`~server.core.rollup.SessionAggregate`: a chat reflected on its
  session, a session on the sessions list;
- :class:`~server.core.sessions.Sessions`: session and chat lifecycle.

Hooks run in the order they were added, before the session aggregate: side
effects that people wait for (a turn resuming) come first. The host's own
hook reads the frozen form of every input request it sees opened, in the
background, so that the accept a person sends later is checked here without
a store round trip.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from msgspec.structs import replace

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    RootAgentsChanged,
    StateAction,
)
from protocol.chat import ActiveTurn, ChatState, InputAnswer, InputRequest
from protocol.codec import encode
from protocol.messages import ActionEnvelope, ActionOrigin, ChannelState, ErrorCode
from protocol.rejections import Rejection, RejectionCode
from protocol.session import AgentInfo, RootState, SessionState
from protocol.uris import ROOT_URI, channel_kind
from reducers import notes, reduce
from reducers.chat import select_input_settlement
from reducers.limits import SizeLimits, limit_problem
from reducers.validation import reject_reason, working_directories_problem
from server.auth import Identity
from server.core.audit import AUDITED, GONE_RECORDS, AuditTrail, AuditValues
from server.core.audit_key import AuditKeys
from server.core.channels import (
    Ahead,
    Applied,
    ChannelCore,
    ChannelView,
    Hook,
    Hooks,
    Riding,
    Validator,
)
from server.core.expiry import Expiries, Expiry, Family, expiry_problem
from server.core.frozen_forms import Form, FormRegistry, chat_session, needs_session
from server.core.policy import active_turn_stamp
from server.core.rollup import SessionAggregate
from server.core.session_notes import SessionNotes
from server.core.sessions import Sessions
from server.core.waiters import InputOutcome, ToolDecision, Waiters
from server.errors import ActionRejected, CommandError, StoreError
from server.store.base import ChannelStore

__all__ = ["Host", "InputOutcome", "ToolDecision"]


STOP_PATIENCE: Final = 5.0
"""Seconds a stop goes on finishing what was begun (an action's follow-ups,
a resume, the audit's records) while the store refuses it (Redis down):
beyond, what is left is lost with the process, logged."""
log = logging.getLogger("huddle.host")

ANSWERS = (ChatInputAnswerChanged, ChatInputCompleted, ChatToolCallConfirmed)
"""The actions that answer a wait (too late once its expiry passed)."""


class Host:
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
        sizes: SizeLimits | None = None,
        audit_values: AuditValues = "keep",
        audit_max_records: int = 100_000,
        audit_max_bytes: int = 256 << 20,
        audit_key: str | None = None,
        expiry_check_interval: float = 1.0,
    ) -> None:
        self.store = store
        self.agents = agents
        self.clock = clock
        self.sizes = sizes or SizeLimits()
        self.hooks = Hooks()
        self.core = ChannelCore(
            store,
            hooks=self.hooks,
            clock=clock,
            snapshot_every=snapshot_every,
            idle_check_interval=idle_check_interval,
        )
        self.forms = FormRegistry(store, self._session_state)
        self.waiters = Waiters(self.core, self.forms)
        self.aggregate = SessionAggregate(
            self.core,
            self._dispatch_derived,
            clock=clock,
            modified_at_interval=modified_at_interval,
        )
        self.sessions = Sessions(
            self.core, self.aggregate, self.waiters, self._dispatch_derived, agents, self.sizes
        )
        self.notes = SessionNotes(self.core, self.sizes)
        self.audit = AuditTrail(
            store,
            self.forms,
            keys=AuditKeys(store, audit_key, now_ms=self.core.now_ms),
            now_ms=self.core.now_ms,
            session_of=self._session_of_cached,
            values=audit_values,
            max_records=audit_max_records,
            max_bytes=audit_max_bytes,
        )
        self.expiries = Expiries(self.core, store, self.notes, check_interval=expiry_check_interval)
        self.hooks.bookkeeping += [self.waiters.hook, self._read_form_ahead, self.expiries.hook]
        self.hooks.recorded.append(self.audit.hook)
        self.hooks.records += [self.notes.hook, self.aggregate.hook]

    def add_hook(self, hook: Hook) -> None:
        """Run ``hook`` on every applied envelope, a reaction: after the
        host's bookkeeping, before the session's notes, audit and aggregate
        (the side effects people wait for first: server.core.channels.Hooks)."""
        self.hooks.reactions.append(hook)

    def add_rider(self, riding: Riding) -> None:
        """Ask ``riding`` for a write to ride on each append this process
        makes of an action it accepted (server.core.channels.Riding)."""
        self.core.riders.append(riding)

    def add_ahead_of_append(self, ahead: Ahead) -> None:
        """Ask ``ahead`` for a write ahead of every append this process
        makes, the server's own actions included, once validated
        (server.core.channels.Ahead)."""
        self.core.aheads.append(ahead)

    def now_ms(self) -> int:
        return self.core.now_ms()

    def _read_form_ahead(self, event: Applied) -> None:
        """A hook: an input request was opened (here or by another process);
        have its frozen form at hand before anyone answers it."""
        if isinstance(event.action, ChatInputRequested):
            self.core.spawn(self._load_form(event.uri, event.action.request.id))

    async def _load_form(self, chat: str, request_id: str) -> None:
        try:
            await self.forms.load(chat, request_id)
        except StoreError as error:  # the accept reads it then
            log.info("could not read the form of %s in %s ahead: %s", request_id, chat, error)

    # ─── Lifecycle ───────────────────────────────────────────────────────

    async def start(self) -> None:
        """Create the root channel if needed and listen to other processes."""
        await self.core.start()
        self.expiries.start()
        root = RootState(agents=self.agents, active_sessions=0)
        if not await self.core.create(ROOT_URI, root):
            current = await self.core.view(ROOT_URI)
            assert isinstance(current.state, RootState)
            if current.state.agents != self.agents:
                await self.dispatch(ROOT_URI, RootAgentsChanged(agents=self.agents))

    async def quiesce(self, until: float) -> None:
        """The first part of a stop, while the runner still runs: no more
        expiries fire, and what actions started finishes (their follow-ups,
        an append whose answer was lost read back) up to ``until``
        (``time.monotonic()``)."""
        await self.expiries.stop()
        await self.core.settle(until)

    async def stop(self, *, until: float | None = None) -> None:
        """Stop; what is begun (follow-ups, the audit's records) may go on
        while the store refuses up to ``until`` (``time.monotonic()``;
        default: STOP_PATIENCE from now)."""
        if until is None:
            until = time.monotonic() + STOP_PATIENCE
        await self.quiesce(until)
        await self.audit.settled(until=until)
        self.audit.stop()
        self.aggregate.stop()
        await self.core.stop()
        if lost := self.audit.unwritten():
            log.error("audit: %d records lost with the process", lost)
        self.waiters.abandon_all("the server is stopping")

    # ─── Channels ────────────────────────────────────────────────────────

    async def view(self, uri: str) -> ChannelView:
        """The channel ``uri`` now (state and seq); raises ChannelGone."""
        return await self.core.view(uri)

    async def session_of(self, uri: str) -> str | None:
        """The session a channel belongs to (None for the root channel).
        Raises ChannelGone for a chat that does not exist."""
        kind = channel_kind(uri)
        if kind == "session":
            return uri
        if kind == "chat":
            state = (await self.core.view(uri)).state
            assert isinstance(state, ChatState)
            return chat_session(state)
        return None

    def _session_of_cached(self, chat: str) -> str | None:
        view = self.core.cached(chat)
        return chat_session(view.state) if view and isinstance(view.state, ChatState) else None

    def _session_state(self, session: str) -> Any:
        view = self.core.cached(session)
        return None if view is None else view.state

    # ─── The write path ──────────────────────────────────────────────────

    async def dispatch(
        self,
        uri: str,
        action: StateAction,
        *,
        origin: ActionOrigin | None = None,
        seq_scope: str | None = None,
        sender: Identity | None = None,
        payer: str | None = None,
        validate: bool = True,
        provided: Callable[[ChannelState], Rejection | None] | None = None,
    ) -> ActionEnvelope:
        """Validate, reduce, append and broadcast ``action`` on ``uri``, then
        run its side effects. ``sender`` is who sent it (None: the server);
        ``payer``, whose share of the session's audit a person's decision
        is charged to (server.core.audit.AuditTrail.charged; None: the
        agent's or the server's own);
        ``seq_scope``, what ``origin``'s clientSeq is numbered within beyond
        its clientId (server.core.channels.origin_key);
        ``provided``, a condition on the channel's state checked with the
        rules, under its lock.

        Returns the accepted envelope. Raises ActionRejected (nothing
        changed, no seq used), ChannelGone, or StoreUnavailable.
        """
        write = functools.partial(
            self.core.write, uri, action, origin=origin, seq_scope=seq_scope, sender=sender
        )
        validator = await self._validator(uri, action, provided) if validate else None
        audited = isinstance(action, AUDITED) and self.audit.waiting()
        session = await self.session_of(uri) if payer is not None or audited else None
        if audited and session is not None:
            await self.audit.caught_up(session)
        async with self.audit.charged(session, payer, action) as unrecorded:
            try:
                event = await write(validate=_then(validator, unrecorded))
            except _FormUnread:
                # The request opened after we looked (an append of another
                # process this one caught up on): read its form, check again.
                validator = await self._validator(uri, action, provided, read_form=True)
                event = await write(validate=_then(validator, unrecorded))
        return event.envelope

    async def check(self, uri: str, action: StateAction, state: ChannelState) -> Rejection | None:
        """The limits and the validation rules for ``action`` on ``uri`` in
        ``state``, without dispatching: for an action on a channel about to
        be created (a chat's initial message), asked before it is."""
        view = ChannelView(uri, state, 0, len(encode(state)))
        return (await self._validator(uri, action))(view, action)

    async def _dispatch_derived(self, uri: str, action: StateAction) -> object:
        return await self.core.write(uri, action)

    async def _validator(
        self,
        uri: str,
        action: StateAction,
        provided: Callable[[ChannelState], Rejection | None] | None = None,
        *,
        read_form: bool = False,
    ) -> Validator:
        """The limits and the validation rules for ``action``, with what
        their schema checks read loaded first (outside the channel's lock).

        A completion's form is read only when its request is open (or
        ``read_form`` says to): one for a request that is not must cost no
        cache entry. Should the request have opened by the time the lock is
        held, the validator raises _FormUnread rather than check without it."""
        form: Form | None = None
        unread: str | None = None  # the request whose form was not read
        if isinstance(action, ChatInputCompleted):
            if read_form or _is_open((await self.core.view(uri)).state, action.request_id):
                form = await self.forms.load(uri, action.request_id)
            else:
                unread = action.request_id
        answering = isinstance(action, ANSWERS)
        session_view: ChannelView | None = None
        if needs_session(action) or answering:
            session = await self.session_of(uri)
            if session is not None:
                # Its tools and working directories are what the checks read;
                # its notes, the expiries.
                session_view = await self.core.view(session)
        form_check = self.forms.form_check(form)
        root = uri == ROOT_URI
        bad_expiry = expiry_problem(action)

        def validate(view: ChannelView, action: StateAction) -> Rejection | None:
            state: Any = view.state
            if unread is not None and _is_open(state, unread):
                raise _FormUnread
            if bad_expiry is not None:
                return bad_expiry
            if root and reduce(state, action, 0) == state:
                # Nothing to store: a flood of no-ops must not grow the log.
                return Rejection(RejectionCode.NO_CHANGE, "the root channel already holds that")
            if answering and (late := self._too_late(uri, state, action)):
                return late
            if provided is not None and (unmet := provided(state)) is not None:
                return unmet
            return limit_problem(state, action, self.sizes, view.size) or reject_reason(
                state,
                action,
                form_check=form_check,
                tool_input_check=self.forms.tool_input_check(state),
                session=self._latest_session(session_view),
            )

        return validate

    def _latest_session(self, read: ChannelView | None) -> SessionState | None:
        """The session read before the chat's lock was taken, as this
        process holds it now (it may have changed since)."""
        if read is None:
            return None
        state = (self.core.cached(read.uri) or read).state
        return state if isinstance(state, SessionState) else None

    def _too_late(self, uri: str, state: Any, action: StateAction) -> Rejection | None:
        """An answer to a wait whose expiry passed (server.core.expiry)."""
        session = chat_session(state) if isinstance(state, ChatState) else None
        meta = getattr(self._session_state(session), "meta", None) if session else None
        turn = active_turn_stamp(state)
        return notes.expired_wait(meta, uri, action, self.core.now_ms(), turn=turn)

    # ─── Sessions and chats ──────────────────────────────────────────────

    async def create_session(
        self,
        uri: str,
        *,
        provider: str | None = None,
        title: str | None = None,
        working_directories: list[str] | None = None,
    ) -> str:
        """Create session ``uri`` with its default chat; returns the chat URI.

        The id of a disposed session stays taken while its audit is kept
        (until server.core.retention removes it): a new session of that id would
        show its readers the old one's records, and its own would be
        removed with them."""
        if await self.store.last_audit(uri) is not None:
            raise CommandError(
                ErrorCode.SESSION_ALREADY_EXISTS,
                f"session {uri} already exists, or its audit does (kept after it was disposed)",
            )
        return await self.sessions.create_session(
            uri, provider=provider, title=title, working_directories=working_directories
        )

    async def create_chat(
        self,
        session: str,
        chat: str,
        *,
        title: str | None = None,
        working_directories: list[str] | None = None,
    ) -> None:
        """Create ``chat`` in ``session``, working in ``working_directories``
        (None: the session's). Raises ActionRejected (``unknown-directory``)
        for one the session does not have, before anything is created."""
        state = (await self.core.view(session)).state
        assert isinstance(state, SessionState)
        if working_directories is not None:
            refusal = working_directories_problem(state, working_directories)
            if refusal is not None:
                raise ActionRejected.of(refusal)
        await self.sessions.create_chat(
            session, chat, title=title, working_directories=working_directories
        )

    async def dispose_session(self, session: str) -> None:
        """Remove the session and its chats; its audit stays (until
        server.core.retention removes it)."""
        await self.sessions.dispose_session(session)
        await self.store.put_record(GONE_RECORDS, session, str(self.now_ms()).encode())

    # ─── Asking people ───────────────────────────────────────────────────

    async def request_input(
        self,
        chat: str,
        request: InputRequest,
        *,
        schema: dict[str, Any] | None = None,
        expiry: Expiry | None = None,
        in_turn: Callable[[ActiveTurn], bool] | None = None,
    ) -> InputOutcome:
        """Ask the people in ``chat``: dispatch ``chat/inputRequested`` (with
        questions derived from ``schema`` when one is given and the request
        has none) and wait for the outcome; with ``in_turn``, only while the
        chat's active turn is one it accepts (a tool of a turn that is over
        asks in no later one).

        The schema is frozen with the request: an accept is validated
        against it and ``outcome.data`` carries the data with its types.
        With ``expiry``, nobody answering in time applies its policy (the
        outcome is then ``cancel`` or ``decline``; ``fail`` ends the turn:
        InputAbandoned). Raises InputAbandoned when the turn ends first,
        ActionRejected when there is no active turn.
        """
        state = (await self.core.view(chat)).state
        if (unmet := _asking_in(chat, in_turn)(state)) is not None:
            raise ActionRejected.of(unmet)
        assert isinstance(state, ChatState)
        assert state.active_turn is not None
        waiter = await self.waiters.expect_input(chat, request.id, state.active_turn.id)
        try:
            await self.ask(chat, request, schema=schema, expiry=expiry, in_turn=in_turn)
        except BaseException:
            self.waiters.discard(waiter)
            raise
        return await self.waiters.input_outcome(waiter)

    async def ask(
        self,
        chat: str,
        request: InputRequest,
        *,
        schema: dict[str, Any] | None = None,
        expiry: Expiry | None = None,
        in_turn: Callable[[ActiveTurn], bool] | None = None,
    ) -> ActionEnvelope:
        """Open ``request`` in ``chat`` without waiting (see
        :meth:`request_input`); the form, when given, is frozen with it."""
        if schema is not None:
            form = await self.forms.freeze(chat, request.id, schema)
            if request.questions is None:
                request = replace(request, questions=form.spec.questions)
        asked = ChatInputRequested(request=request)
        envelope = await self.dispatch(chat, asked, provided=_asking_in(chat, in_turn))
        if expiry is not None:
            await self.expiries.expire(chat, "requests", request.id, expiry)
        return envelope

    async def expire(self, chat: str, family: Family, key: str, expiry: Expiry) -> int:
        """Give an open wait of ``chat`` (an input request, ``"requests"``,
        or a tool call waiting for approval, ``"toolCalls"``) an expiry;
        returns when it expires (ms). See server.core.expiry."""
        return await self.expiries.expire(chat, family, key, expiry)

    async def wait_input(self, chat: str, request_id: str) -> InputOutcome:
        """Wait for the open request ``request_id`` of ``chat`` to be
        completed (see :meth:`Waiters.wait_input`)."""
        return await self.waiters.wait_input(chat, request_id)

    async def wait_tool_confirmation(
        self, chat: str, turn_id: str, tool_call_id: str
    ) -> ToolDecision:
        """Wait for a person to approve or deny the tool call."""
        return await self.waiters.wait_tool_confirmation(chat, turn_id, tool_call_id)

    async def form_data(
        self, chat: str, request_id: str, answers: dict[str, InputAnswer]
    ) -> dict[str, Any] | None:
        """The data ``answers`` give for the request's frozen form (with the
        schema's types), or None when the request had no form."""
        return await self.forms.data(chat, request_id, answers)


def _then(validator: Validator | None, rejection: Rejection | None) -> Validator | None:
    """``validator``, and ``rejection`` for an action it passes: checked
    where the rules are, so that the core says a copy re-sent of an action
    applied already is applied (server.core.channels.ChannelCore.write)."""
    if rejection is None:
        return validator

    def validate(view: ChannelView, action: StateAction) -> Rejection | None:
        return (validator and validator(view, action)) or rejection

    return validate


class _FormUnread(Exception):
    """A completion's request opened after the host looked for it, so its
    form was not read: :meth:`Host.dispatch` reads it and checks again
    (this never leaves the host)."""


def _is_open(state: object, request_id: str) -> bool:
    """Whether ``state`` is a chat with the input request open."""
    return (
        isinstance(state, ChatState) and select_input_settlement(state, request_id).status == "open"
    )


def _asking_in(
    chat: str, in_turn: Callable[[ActiveTurn], bool] | None
) -> Callable[[ChannelState], Rejection | None]:
    """Why ``chat`` as it is takes no question now: it has no active turn,
    or (``in_turn``) not one the asker may ask in."""

    def unmet(state: ChannelState) -> Rejection | None:
        active = state.active_turn if isinstance(state, ChatState) else None
        if active is None:
            return Rejection(RejectionCode.NO_ACTIVE_TURN, f"{chat} has no active turn to ask in")
        if in_turn is not None and not in_turn(active):
            return Rejection(
                RejectionCode.NO_ACTIVE_TURN,
                f"the turn that asks is over in {chat}: the active one is another",
            )
        return None

    return unmet
