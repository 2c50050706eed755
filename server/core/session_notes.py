"""Keeps the session's notes (:mod:`reducers.notes`) as people act.

A hook of the channel core, on what this process accepted: a person's (or
an agent's) answer, completion or tool decision updates the notes of its
session, with the server's identity of the sender, by a ``session/
metaChanged`` built from the session's latest state (so that two processes
noting at once never lose each other's note). Nothing is dispatched when
the note is there already: typing on in the same answer adds nothing.

The notes stay within ``SizeLimits.notes`` bytes (and the whole action
within ``SizeLimits.action``): AHP's ``session/metaChanged`` replaces the
whole ``_meta``, so every note re-sends them all, and a session holds up to
``SizeLimits.chats`` chats of :data:`reducers.notes.KEPT` notes each. Beyond
the bound the oldest go first (:func:`reducers.notes.bounded`); the action
is then checked against the limits as a client's would be, so that the
server never writes a session past them. For the same reason a session's
notes are written at most once every NOTE_INTERVAL: what comes in between
waits for it and goes in one action.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatTruncated,
    SessionMetaChanged,
    StateAction,
)
from protocol.chat import ChatState, InputAnswer
from protocol.messages import ChannelState
from protocol.rejections import Rejection
from protocol.session import SessionState
from reducers import notes
from reducers.chat import select_open_input_part, select_truncated, select_waits
from reducers.limits import SizeLimits, limit_problem
from server.auth import Identity
from server.cache import Lru
from server.core.channels import Applied, ChannelCore, ChannelView
from server.core.frozen_forms import chat_session
from server.core.policy import active_turn_stamp, turn_stamp
from server.errors import ActionRejected, ChannelGone

log = logging.getLogger("huddle.notes")

ACTION_ROOM = 1024
"""Bytes of the action besides its ``_meta`` (its type, and to spare)."""

Note = Callable[[dict[str, Any] | None], dict[str, Any] | None]
"""Makes the new ``_meta`` from the current one (None: unchanged)."""
NOTE_INTERVAL = 0.25
"""Seconds between two writes of one session's notes: what comes within
them is written together (a person typing into several answers, or
settling requests at their rate budget, sent every watcher all the notes
with each change)."""


@dataclass
class _Batch:
    """Notes waiting to be written together."""

    changes: list[Note]
    chat: str
    written: asyncio.Future[None]
    taken: bool = False
    """Written before the interval passed, with a note that cannot wait."""


class SessionNotes:
    """See the module docstring."""

    def __init__(
        self, core: ChannelCore, sizes: SizeLimits | None = None, interval: float = NOTE_INTERVAL
    ) -> None:
        self.core = core
        self.sizes = sizes or SizeLimits()
        self.interval = interval
        self._waiting: dict[str, _Batch] = {}
        """Per session, the notes waiting for the interval to pass."""
        self._written: Lru[str, float] = Lru(4096)
        """Per session, when its notes were last written (loop time)."""

    def hook(self, event: Applied) -> Awaitable[None] | None:
        if not event.local or event.sender is None or not isinstance(event.view.state, ChatState):
            return None
        session = chat_session(event.view.state)
        turn = active_turn_stamp(event.before)
        changes = _notes_of(event.uri, event.action, event.sender, event.before, turn)
        if session is None or not changes:
            return None
        # A truncation's notes are written at once: until they are, the
        # waits it took away would refuse a turn that uses their ids again.
        now = isinstance(event.action, ChatTruncated)
        if not now:
            changes = [self.of_turn(event.uri, turn, one) for one in changes]
        return self._offer(session, event.uri, changes, now=now)

    def of_turn(self, chat: str, turn: str | None, note: Note) -> Note:
        """``note`` (on a wait of the turn stamped ``turn``), unless that turn
        is no longer in ``chat`` when it is written (truncated away while it
        waited for the interval): a note of another turn replaces the note
        of the wait of that id, and this one would replace the note of the
        turn that uses the id next."""
        if turn is None:
            return note

        def held(meta: dict[str, Any] | None) -> dict[str, Any] | None:
            view = self.core.cached(chat)
            state = view.state if view is not None else None
            if isinstance(state, ChatState) and not _holds(state, turn):
                return None
            return note(meta)

        return held

    async def note(self, session: str, chat: str, *changes: Note) -> None:
        """Apply ``changes`` (notes on ``chat``) to the session's notes,
        dropping the oldest notes beyond the bound; returns once written."""
        write = self._offer(session, chat, list(changes))
        if write is not None:
            await write
        elif (waiting := self._waiting.get(session)) is not None:
            await asyncio.shield(waiting.written)

    def _offer(
        self, session: str, chat: str, changes: list[Note], *, now: bool = False
    ) -> Awaitable[None] | None:
        """The write of ``changes`` now, when the session's notes were not
        written within ``interval`` (or ``now``: with the notes waiting, if
        any, first); else None: they join the notes waiting for it to pass
        (written together by one background task)."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting.get(session)
        if now:
            if waiting is not None:
                waiting.taken = True
                del self._waiting[session]
                changes = [*waiting.changes, *changes]
            self._written.put(session, loop.time())
            return self._write_taken(session, chat, changes, waiting)
        if waiting is not None:
            waiting.changes.extend(changes)
            waiting.chat = chat
            return None
        last = self._written.get(session)
        wait = -1.0 if last is None else last + self.interval - loop.time()
        if wait <= 0:
            self._written.put(session, loop.time())
            return self._write(session, chat, changes)
        batch = _Batch(changes, chat, loop.create_future())
        self._waiting[session] = batch
        self.core.spawn(self._later(session, batch, wait))
        return None

    async def _later(self, session: str, batch: _Batch, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
            if batch.taken:
                return
            del self._waiting[session]
            self._written.put(session, asyncio.get_running_loop().time())
            await self._write(session, batch.chat, batch.changes)
        finally:
            if self._waiting.get(session) is batch:  # cancelled while it waited
                del self._waiting[session]
            if not batch.taken and not batch.written.done():
                batch.written.set_result(None)

    async def _write_taken(
        self, session: str, chat: str, changes: list[Note], taken: _Batch | None
    ) -> None:
        """:meth:`_write`, then the notes of ``taken`` are written too."""
        try:
            await self._write(session, chat, changes)
        finally:
            if taken is not None and not taken.written.done():
                taken.written.set_result(None)

    async def _write(self, session: str, chat: str, changes: list[Note]) -> None:
        """``changes`` in one action; nothing when even ``chat``'s newest
        notes alone do not fit."""

        def change(state: ChannelState) -> StateAction | None:
            if not isinstance(state, SessionState):
                return None
            meta, touched = state.meta, False
            for one in changes:
                new = one(meta)
                if new is not None:
                    meta, touched = new, True
            if not touched:
                return None
            room = self.sizes.action - ACTION_ROOM - notes.other_bytes(meta)
            budget = min(self.sizes.notes, room)
            fitted = notes.bounded(meta, budget, chat)
            if fitted is None:
                log.warning(
                    "%s: a note on %s does not fit %d bytes: not noted", session, chat, budget
                )
            return None if fitted is None else SessionMetaChanged(meta=fitted)

        def within_limits(view: ChannelView, action: StateAction) -> Rejection | None:
            return limit_problem(view.state, action, self.sizes, view.size)

        try:
            await self.core.update(session, change, validate=within_limits)
        except ChannelGone:
            pass
        except ActionRejected as error:  # our bug: bounded() should have seen to it
            log.error("%s: the server's notes were refused: %s", session, error)


def _holds(state: ChatState, turn: str) -> bool:
    """Whether ``state`` has a turn stamped ``turn``."""
    active = state.active_turn
    if active is not None and turn_stamp(active.message) == turn:
        return True
    return any(turn_stamp(t.message) == turn for t in state.turns)


def _notes_of(
    chat: str, action: StateAction, sender: Identity, before: ChannelState, turn: str | None
) -> list[Note]:
    """The notes ``action`` makes on waits of the chat's active turn, stamped
    ``turn``."""
    who = sender.who()
    match action:
        case ChatInputAnswerChanged(answer=None):
            request, question = action.request_id, action.question_id
            return [lambda m: notes.unanswered(m, chat, request, question, turn=turn)]
        case ChatInputAnswerChanged(answer=answer) if answer is not None:
            request, question, state = action.request_id, action.question_id, answer.state
            return [lambda m: notes.answered(m, chat, request, question, who, state, turn=turn)]
        case ChatInputCompleted():
            request, response = action.request_id, action.response
            drafts = _drafts(before, request)
            carried: list[Note] = [
                _answer(chat, request, question, who, answer, drafts.get(question), turn)
                for question, answer in (action.answers or {}).items()
            ]
            return [*carried, lambda m: notes.completed(m, chat, request, who, response, turn=turn)]
        case ChatToolCallConfirmed():
            call, approved = action.tool_call_id, action.approved
            return [lambda m: notes.decided(m, chat, call, who, approved, turn=turn)]
        case ChatTruncated() if isinstance(before, ChatState):
            away = select_truncated(before, action)
            requests, calls = select_waits(away)
            stamps = {turn_stamp(t.message) for t in away}
            if requests or calls:
                return [lambda m: notes.forgotten(m, chat, requests, calls, stamps)]
    return []


def _drafts(before: ChannelState, request_id: str) -> dict[str, InputAnswer]:
    """The answers the open request held before it was completed."""
    turn = before.active_turn if isinstance(before, ChatState) else None
    found = select_open_input_part(turn.response_parts, request_id) if turn else None
    return (found[1].request.answers or {}) if found is not None else {}


def _answer(
    chat: str,
    request: str,
    question: str,
    who: dict[str, Any],
    answer: InputAnswer,
    draft: InputAnswer | None,
    turn: str | None,
) -> Note:
    """A completion's answer is the completer's, unless it only submits
    what someone else wrote: then that author keeps it. Submitting a draft
    as it is changes nothing; any other change of state (a skip) does."""
    unchanged = (
        draft is not None
        and (draft.state == answer.state or (draft.state, answer.state) == ("draft", "submitted"))
        and (draft.value, draft.freeform_values) == (answer.value, answer.freeform_values)
    )

    def note(meta: dict[str, Any] | None) -> dict[str, Any] | None:
        by = who
        if unchanged:
            earlier = notes.note_for(meta, "requests", chat, request, turn) or {}
            author = ((earlier.get("answers") or {}).get(question) or {}).get("by")
            by = author if isinstance(author, dict) else who
        return notes.answered(meta, chat, request, question, by, answer.state, turn=turn)

    return note
